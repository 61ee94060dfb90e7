# One image for web, worker and beat (docker-compose.yml picks the command).
# The base image and uv are pinned to versions; pin the base by digest as well
# (python:3.11.14-slim-bookworm@sha256:...) where your registry policy asks for it.
FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    UV_PROJECT_ENVIRONMENT=/opt/venv PATH="/opt/venv/bin:$PATH"
RUN pip install --no-cache-dir uv==0.13.9
WORKDIR /app
COPY pyproject.toml uv.lock ./
RUN uv sync --locked --no-dev --no-install-project
COPY . .
# collectstatic runs as root and creates var/; everything under var/ (static
# files, the filesystem broker of the SQLite run, the outbox) then belongs to
# the unprivileged user the processes run as.
RUN DEBUG=1 python manage.py collectstatic --noinput --verbosity 0 \
    && useradd --create-home --uid 10001 reminders \
    && mkdir -p /app/var \
    && chown -R reminders:reminders /app/var
USER reminders
EXPOSE 8000
