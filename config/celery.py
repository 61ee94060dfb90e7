"""The Celery application: ``celery -A config worker`` and ``celery -A config beat``.

Configuration comes from Django settings prefixed ``CELERY_`` (config/settings.py);
the worker's signal handlers live in reminders/worker/hooks.py.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("reminders")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

import reminders.worker.hooks  # noqa: E402, F401  (connects the worker's signal handlers)
