"""What error reports and log lines may show.

``RedactSecrets`` (LOGGING's console handler) masks the password and query
values of every URL in a log line, whichever library wrote it
(delivery.redact), and the signature of an attendee's link (reminders.links).

``JsonLines`` is the LOG_FORMAT=json formatter. ``SecretsFilter`` is
Django's DEFAULT_EXCEPTION_REPORTER_FILTER.

Django already hides settings and request variables whose names hold API,
AUTH, TOKEN, KEY, SECRET, PASS, SIGNATURE or HTTP_COOKIE. This project's
credentials also live in URLs (CELERY_BROKER_URL, REMINDERS_REDIS_URL,
DATABASE_URL, REMINDERS_HTTP_URL and REMINDERS_HTTP_HEDGE_URLS carry
passwords and tokens), so with DEBUG on, or in an error mail, any setting or
environment variable with URL or DSN in its name is hidden too.
"""

from __future__ import annotations

import logging
import re

from django.views.debug import SafeExceptionReporterFilter
from pythonjsonlogger.json import JsonFormatter

from delivery.redact import redact_text as redact_urls
from reminders.links import redact_link_tokens

# What every LogRecord carries; anything else on a record came from a caller's ``extra``.
_RECORD_FIELDS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
}


def redact_text(text: str) -> str:
    """Mask URL credentials, and the signature of an attendee's link (a 404 or a 410 under
    /attend/ names its path)."""
    return redact_link_tokens(redact_urls(text))


class RedactSecrets(logging.Filter):
    """Mask the credentials of every URL in a record: its message, its ``extra`` fields
    and its traceback; drop none."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        for name, value in list(record.__dict__.items()):
            if name not in _RECORD_FIELDS and isinstance(value, str):
                setattr(record, name, redact_text(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


class JsonLines(JsonFormatter):
    """LOG_FORMAT=json: python-json-logger's formatter, with tracebacks redacted too.

    It formats ``exc_info`` afresh rather than printing the filter's redacted
    ``exc_text``, so the redaction is applied here as well; the record itself
    keeps its ``exc_info`` for every other handler.
    """

    def formatException(self, ei) -> str:
        return redact_text(super().formatException(ei))


class SecretsFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile(
        "API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL|DSN", flags=re.IGNORECASE
    )
