"""Project configuration: settings, the Celery app, URLs and WSGI entry point."""

from config.celery import app as celery_app

__all__ = ["celery_app"]
