"""The Celery application: ``celery -A config worker`` and ``celery -A config beat``.

Configuration comes from Django settings prefixed ``CELERY_`` (config/settings.py);
the worker's signal handlers live in reminders/worker/hooks.py.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Celery's Django fix-up runs the system checks as a worker starts and drops their findings;
# their URL checks import the web's URLconf (the API's django-ninja and pydantic, the
# webhooks' requests) into every worker process, which never uses them. ``manage.py check``
# and ``migrate`` still run them.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("reminders")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

import reminders.worker.hooks  # noqa: E402, F401  (connects the worker's signal handlers)
