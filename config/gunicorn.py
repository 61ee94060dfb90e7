"""gunicorn's settings for web (``gunicorn -c config/gunicorn.py config.wsgi``).

The access log names the method, the path without its query string, the status and
the time taken: an admin search (``?q=jane.doe@example.org``) or a filtered list puts
personal data in the query string and the referrer, and gunicorn writes its access
log itself, outside Django's logging and its redaction. An attendee's link
(``/attend/<token>/``, ``/unsubscribe/<token>/``) keeps its reminder id and loses its
signature: whoever holds the whole token acts for the attendee.
"""

import os
import re

from gunicorn.glogging import Logger

# The same pattern as reminders.links.LINK_TOKEN (Django's own log lines): this file is
# read before Django is set up, so it cannot import it.
LINK_TOKEN = re.compile(r"(/(?:attend|unsubscribe)/[^/?#\s.]*\.)[^/?#\s\"]+")


class AccessLog(Logger):
    """gunicorn's logger, with the signature of every attendee's link masked."""

    def atoms(self, resp, req, environ, request_time):
        atoms = super().atoms(resp, req, environ, request_time)
        return {
            name: LINK_TOKEN.sub(r"\1***", value) if isinstance(value, str) else value
            for name, value in atoms.items()
        }


bind = os.environ.get("WEB_BIND", "127.0.0.1:8000")
workers = 2
accesslog = "-"
access_log_format = '%(h)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms'
logger_class = AccessLog
