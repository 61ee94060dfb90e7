# Two commands for a fresh clone: `make run` (local demo, no servers needed)
# and `make test` (everything CI runs, against PostgreSQL and Redis).

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)

# Tests talk to real servers; override these to point elsewhere.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/reminders
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
MUTATE_VAR_DIR ?= $(CURDIR)/var/mutate

.PHONY: run test lint venv bench clean mutate

$(UV):
	python3 -m pip install --user --quiet uv

$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --locked --quiet
	@touch $@

venv: $(VENV)/.synced

run: venv
	@export DEBUG=$${DEBUG:-1} PATH="$(CURDIR)/$(VENV)/bin:$$PATH"; \
	$(PY) manage.py migrate --verbosity 0 && \
	$(PY) manage.py collectstatic --noinput --verbosity 0 && \
	$(PY) manage.py seed_demo && \
	$(PY) manage.py scan && \
	echo "Starting web (http://127.0.0.1:8000/admin/), worker and beat; Ctrl-C stops all three." && \
	exec $(VENV)/bin/honcho start

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	SECRET_KEY=lint $(PY) manage.py makemigrations --check --dry-run

test: lint
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_REDIS_URL) SECRET_KEY=test-only \
	REMINDERS_VAR_DIR=$(CURDIR)/var/test \
	$(VENV)/bin/pytest $(PYTEST_ARGS)

bench: venv
	$(PY) -m bench.delivery

# Mutation testing of the claim, record, reap, expire/dispatch, fate, deadline policy,
# engine deadline/drain, limiters and gate (not in CI; see docs/benchmarks.md).
# MUTATE_ARGS="gate policy" runs a subset.
mutate: venv
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_REDIS_URL) SECRET_KEY=test-only \
	REMINDERS_VAR_DIR=$(MUTATE_VAR_DIR) \
	$(PY) -m bench.mutate $(MUTATE_ARGS)

clean:
	rm -rf var/broker var/reminders.sqlite3* var/outbox var/static
