"""gunicorn's settings for web (``gunicorn -c config/gunicorn.py config.wsgi``).

The access log names the method, the path without its query string, the status and
the time taken: an admin search (``?q=jane.doe@example.org``) or a filtered list puts
personal data in the query string and the referrer, and gunicorn writes its access
log itself, outside Django's logging and its redaction.
"""

import os

bind = os.environ.get("WEB_BIND", "127.0.0.1:8000")
workers = 2
accesslog = "-"
access_log_format = '%(h)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms'
