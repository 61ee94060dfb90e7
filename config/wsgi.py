"""WSGI entry point for gunicorn: ``gunicorn -c config/gunicorn.py config.wsgi``."""

import logging
import os

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

application = get_wsgi_application()

if settings.SECURE_PROXY_SSL_HEADER:
    logging.getLogger(__name__).warning(
        "BEHIND_TLS_PROXY=1: a request whose X-Forwarded-Proto says https is taken as "
        "HTTPS. That is safe only when web is reachable through a proxy that sets this "
        "header on every request; anyone reaching web directly can claim HTTPS."
    )
