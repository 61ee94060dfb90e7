"""Django settings, read from the environment (see README "Configuration").

Defaults give the one-command local run: a SQLite file and kombu's filesystem
broker under ``var/``, so no database or broker server is needed. Production,
docker compose and the tests set ``DATABASE_URL`` and ``CELERY_BROKER_URL`` to
PostgreSQL and Redis. Every invalid value stops start-up with a message naming
the variable and what it accepts.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from config.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_str,
    env_zone,
)
from config.timing import TimeBounds
from delivery.redact import redact_text, redact_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("REMINDERS_VAR_DIR", str(BASE_DIR / "var")))

# --- Core -------------------------------------------------------------------

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY must be set when DEBUG is off: export SECRET_KEY to a long random "
            "string (python -c 'import secrets; print(secrets.token_urlsafe(50))'), "
            "or set DEBUG=1 for local development."
        )
    SECRET_KEY = "insecure-local-development-key-never-use-in-production"

# With DEBUG off, every secret must be at least this long (a guessable key signs sessions,
# a short token opens /metrics, a short HTTP secret lets anyone sign a provider request).
MIN_SECRET_LENGTH = 32


def _long_enough(name: str, value: str) -> None:
    if value and not DEBUG and len(value) < MIN_SECRET_LENGTH:
        raise ImproperlyConfigured(
            f"{name} is {len(value)} characters; with DEBUG off it needs at least "
            f"{MIN_SECRET_LENGTH}. Make one with: python3 -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'"
        )


_long_enough("SECRET_KEY", SECRET_KEY)

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",
    "workshops",
    "reminders",
    "intake",
]

MIDDLEWARE = [
    # /healthz and /readyz answer before anything checks the Host header or
    # redirects to HTTPS: probes speak plain http to the container's address.
    "config.probes.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A staff request that gave up waiting for a row lock: a message, nothing changed.
    "reminders.locks.LockBusyMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

# django-ninja's docs page and its static files, found without importing ninja: as an
# installed app it would load pydantic into every worker process, which never uses it.
_NINJA_DIR = Path(importlib.util.find_spec("ninja").origin).parent

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", _NINJA_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------

DEFAULT_DATABASE_URL = f"sqlite:///{VAR_DIR / 'reminders.sqlite3'}"
try:
    _database = dj_database_url.parse(
        env_str("DATABASE_URL", DEFAULT_DATABASE_URL),
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60, minimum=0, maximum=3600, unit="seconds"),
        conn_health_checks=True,
    )
except (ValueError, dj_database_url.UnknownSchemeError) as exc:
    raise ImproperlyConfigured(
        "DATABASE_URL must be a database URL such as "
        "postgres://user:password@host:5432/name or sqlite:///path/to/file.sqlite3 "
        f"({redact_text(str(exc))})."
    ) from None

if _database["ENGINE"] == "django.db.backends.sqlite3":
    # Web, worker and beat share one file in the local run: WAL lets readers
    # and one writer proceed together, IMMEDIATE transactions take the write
    # lock up front (no upgrade deadlocks), and the timeout makes a busy
    # writer wait instead of failing with "database is locked".
    if _database["NAME"] not in ("", ":memory:"):
        Path(_database["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    _database["CONN_MAX_AGE"] = 0
    _database["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
elif _database["ENGINE"] == "django.db.backends.postgresql":
    # Fail fast when PostgreSQL is unreachable instead of hanging a request.
    _database.setdefault("OPTIONS", {}).setdefault("connect_timeout", 5)

DATABASES = {"default": _database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth, i18n, static -----------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# The admin speaks English. Reminders are rendered in the attendee's language
# (else the workshop's), one of LANGUAGES, from the catalogs in locale/ (the
# compiled .mo files are committed: no gettext tools are needed to run).
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("de", "Deutsch"), ("fr", "Français")]
LOCALE_PATHS = [BASE_DIR / "locale"]
# The staff's zone: the admin's date filters ("Today", "This month") and date drill-downs
# follow it, and so do the few times the admin shows unlabelled. Times labelled UTC or with a
# workshop's zone keep theirs, and no decision of what to send, or when, reads it.
TIME_ZONE = env_zone("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [_NINJA_DIR / "static"]
# gunicorn serves the admin's static files through WhiteNoise: no separate
# web server is needed locally or in docker compose.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# --- Security (production) --------------------------------------------------

SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# Prometheus scrapes /metrics over the private network, often in plain http.
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0, maximum=63072000, unit="seconds")
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SECURE_CONTENT_TYPE_NOSNIFF = True
if env_bool("BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- Logging ----------------------------------------------------------------

# Error pages (DEBUG) and error mails hide every setting and environment
# variable named like a credential, URLs included (config/reporting.py).
DEFAULT_EXCEPTION_REPORTER_FILTER = "config.reporting.SecretsFilter"

# "text" (the default) for people, "json" for a log pipeline: one JSON object
# per line with time, level, logger and message, plus any fields a call passes
# in ``extra`` (reminder_id, key, ...), and the traceback as "exc_info".
LOG_FORMAT = env_choice("LOG_FORMAT", "text", ("text", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": "config.reporting.JsonLines",
            "fmt": "%(levelname)s %(name)s %(message)s",
            "rename_fields": {"levelname": "level", "name": "logger"},
            "timestamp": "time",  # ISO 8601 in UTC
        },
    },
    # Every line, the libraries' too (a client library may log a request's URL), passes
    # through the redaction of URL passwords and query values.
    # Lines about a reminder also carry its claim's token, worker and attempt
    # number (reminders/worker/logcontext.py).
    "filters": {
        "redact": {"()": "config.reporting.RedactSecrets"},
        "reminder": {"()": "reminders.worker.logcontext.ReminderFields"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["reminder", "redact"],
        }
    },
    # Django's own handlers (a console one under DEBUG) would write its lines again, unmasked.
    "loggers": {"django": {"handlers": [], "propagate": True}},
    "root": {
        "handlers": ["console"],
        "level": env_choice(
            "LOG_LEVEL", "info", ("debug", "info", "warning", "error", "critical")
        ).upper(),
    },
}

# --- Email (Django's own names; the smtp and django channels read them) -----

EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = env_int("EMAIL_PORT", 1025, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
# SMTP to any host but this machine is encrypted (the smtp channel requires
# STARTTLS, the django channel EMAIL_USE_TLS or EMAIL_USE_SSL), except to the
# hosts listed here: a relay or test inbox on a trusted private network.
EMAIL_PLAINTEXT_HOSTS = env_list("EMAIL_PLAINTEXT_HOSTS")
# The smtp channel never sends EMAIL_HOST_PASSWORD over an unencrypted
# connection, unless this says the relay is on a trusted network.
EMAIL_ALLOW_PLAINTEXT_AUTH = env_bool("EMAIL_ALLOW_PLAINTEXT_AUTH", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1, maximum=300, unit="seconds")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Workshop Reminders <reminders@example.com>")
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL are exclusive: set only one.")

# --- Reminders --------------------------------------------------------------

REMINDERS_CHANNELS = ("file", "smtp", "http", "django")
REMINDERS_CHANNEL = env_choice("REMINDERS_CHANNEL", "file", REMINDERS_CHANNELS)
REMINDERS_SCAN_INTERVAL = env_int(
    "REMINDERS_SCAN_INTERVAL", 60, minimum=5, maximum=3600, unit="seconds"
)
REMINDERS_LEAD_MINUTES = env_int(
    "REMINDERS_LEAD_MINUTES", 1440, minimum=1, maximum=60 * 24 * 30, unit="minutes"
)
REMINDERS_CUTOFF_MINUTES = env_int(
    "REMINDERS_CUTOFF_MINUTES", 30, minimum=0, maximum=60 * 24, unit="minutes"
)
if REMINDERS_LEAD_MINUTES <= REMINDERS_CUTOFF_MINUTES:
    raise ImproperlyConfigured(
        f"REMINDERS_LEAD_MINUTES ({REMINDERS_LEAD_MINUTES}) must be greater than "
        f"REMINDERS_CUTOFF_MINUTES ({REMINDERS_CUTOFF_MINUTES}): the send window opens at the "
        "lead and closes at the cutoff."
    )
# Provider calls in flight per worker process, and so the size of one claim:
# a chunk of this many reminders is claimed, sent and recorded together, which
# keeps database work near 0.06 statements per reminder. A channel may lower
# it (an SMTP connection carries one message at a time).
REMINDERS_CONCURRENCY = env_int("REMINDERS_CONCURRENCY", 100, minimum=1, maximum=500)
REMINDERS_RATE_LIMIT = env_int(
    "REMINDERS_RATE_LIMIT", 0, minimum=0, maximum=100000, unit="sends per second (0 = none)"
)
REMINDERS_BATCH_SIZE = env_int("REMINDERS_BATCH_SIZE", 100, minimum=1, maximum=1000)
REMINDERS_MAX_ATTEMPTS = env_int("REMINDERS_MAX_ATTEMPTS", 5, minimum=1, maximum=50)
REMINDERS_CALL_TIMEOUT = env_float(
    "REMINDERS_CALL_TIMEOUT", 15, minimum=0.1, maximum=300, unit="seconds"
)
# The wall-clock budget of one delivery batch. Celery's time limits and the
# claim lease are derived from it so that they always sit above it.
REMINDERS_BATCH_BUDGET = env_int(
    "REMINDERS_BATCH_BUDGET", 120, minimum=5, maximum=3600, unit="seconds"
)
# Every bound around a batch (drain, channel close, record retry, Celery's soft
# and hard time limits, the claim lease, Redis's visibility timeout) is derived
# from the budget and the call timeout in config/timing.py, each inside the next.
try:
    REMINDERS_TIME_BOUNDS = TimeBounds.derive(
        budget=REMINDERS_BATCH_BUDGET,
        call_timeout=REMINDERS_CALL_TIMEOUT,
        visibility_timeout=env_int(
            "REMINDERS_VISIBILITY_TIMEOUT", 0, minimum=0, maximum=86400, unit="seconds"
        )
        or None,
    )
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from None
# The claim lease outlasts Celery's hard time limit (below), so a live worker
# never loses a claim it still holds; only a dead one's claims are reaped.
REMINDERS_LEASE_SECONDS = math.ceil(REMINDERS_TIME_BOUNDS.lease)
# How long a session waits for a row lock before PostgreSQL gives up on the
# statement (reminders/locks.py): a worker's (claim, record, scan) and a staff
# request's (the admin, management commands).
REMINDERS_WORKER_LOCK_TIMEOUT = env_float(
    "REMINDERS_WORKER_LOCK_TIMEOUT", 2, minimum=0.05, maximum=60, unit="seconds"
)
REMINDERS_STAFF_LOCK_TIMEOUT = env_float(
    "REMINDERS_STAFF_LOCK_TIMEOUT", 5, minimum=0.05, maximum=60, unit="seconds"
)
# The longest one statement of a scan may run before PostgreSQL cancels it and
# the scan leaves that phase to the next scan (reminders.worker.pipeline.scan).
REMINDERS_SCAN_STATEMENT_TIMEOUT = env_float(
    "REMINDERS_SCAN_STATEMENT_TIMEOUT", 60, minimum=1, maximum=3600, unit="seconds"
)
REMINDERS_HTTP_URL = env_str("REMINDERS_HTTP_URL")
REMINDERS_HTTP_SECRET = env_str("REMINDERS_HTTP_SECRET")
_long_enough("REMINDERS_HTTP_SECRET", REMINDERS_HTTP_SECRET)
# The key the provider signs its delivery events with (POST /hooks/http/events,
# delivery/HTTP_CONTRACT.md): a key of its own, so a signature made for one
# direction is never accepted in the other. Unset: the endpoint answers 404.
REMINDERS_HTTP_CALLBACK_SECRET = env_str("REMINDERS_HTTP_CALLBACK_SECRET")
_long_enough("REMINDERS_HTTP_CALLBACK_SECRET", REMINDERS_HTTP_CALLBACK_SECRET)
# More endpoints of the same provider (they must share its idempotency keys):
# each send also goes to these, the next one after the stagger (or at once when
# the previous failed), and the first acceptance wins; the others are cancelled.
REMINDERS_HTTP_HEDGE_URLS = env_list("REMINDERS_HTTP_HEDGE_URLS")
# Plain http:// is refused for any host but this machine unless this is set
# (a provider on a trusted network): reminders carry attendees' names and addresses.
REMINDERS_HTTP_ALLOW_INSECURE = env_bool("REMINDERS_HTTP_ALLOW_INSECURE", False)
REMINDERS_HTTP_HEDGE_STAGGER = env_float(
    "REMINDERS_HTTP_HEDGE_STAGGER", 0.5, minimum=0, maximum=60, unit="seconds"
)


def _endpoint(url: str) -> tuple | None:
    """Return what names ``url``'s endpoint, whatever the case of its scheme and host, its
    default port and a trailing slash; None when it is no http(s) URL."""
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # a port that is no number
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return (parts.scheme, parts.hostname, port, parts.path.rstrip("/"), parts.query)


# Each hedge is another endpoint: one listed twice (or as REMINDERS_HTTP_URL) would be
# posted every reminder twice.
_endpoints = {_endpoint(REMINDERS_HTTP_URL): None} if REMINDERS_HTTP_URL else {}
for _url in REMINDERS_HTTP_HEDGE_URLS:
    _key = _endpoint(_url)
    if _key is None:
        raise ImproperlyConfigured(
            "REMINDERS_HTTP_HEDGE_URLS must list http(s) URLs other than REMINDERS_HTTP_URL, "
            f"comma-separated; got {redact_url(_url)!r}."
        )
    if _key in _endpoints:
        _first = _endpoints[_key]
        if _first is None:
            _said = f"REMINDERS_HTTP_URL {redact_url(REMINDERS_HTTP_URL)!r}"
            _todo = "List only the other endpoints in REMINDERS_HTTP_HEDGE_URLS."
        else:
            _said, _todo = f"{redact_url(_first)!r} twice", "List each endpoint once."
        raise ImproperlyConfigured(
            f"REMINDERS_HTTP_HEDGE_URLS lists {_said} (as {redact_url(_url)!r}): every reminder "
            f"would be posted to that endpoint twice. {_todo}"
        )
    _endpoints[_key] = _url
REMINDERS_FILE_DIR = Path(env_str("REMINDERS_FILE_DIR", str(VAR_DIR / "outbox")))
# Where the cross-worker rate limiter keeps its window. Defaults to the broker
# when that is Redis; with no Redis the limiter is per process.
REMINDERS_REDIS_URL = env_str("REMINDERS_REDIS_URL")


def _redis_url(url: str) -> bool:
    """Return whether ``url`` is a redis:// or rediss:// URL whose port, if any, is a number
    (redis-py and kombu would say only "Port could not be cast to integer", at the first use)."""
    try:
        port = urlsplit(url).port
    except ValueError:
        return False
    return url.startswith(("redis://", "rediss://")) and port != 0


if REMINDERS_REDIS_URL and not _redis_url(REMINDERS_REDIS_URL):
    raise ImproperlyConfigured(
        "REMINDERS_REDIS_URL must be a redis:// or rediss:// URL such as "
        f"redis://redis:6379/1, or unset; got {redact_url(REMINDERS_REDIS_URL)!r}."
    )
if REMINDERS_CHANNEL == "http" and not REMINDERS_HTTP_URL:
    raise ImproperlyConfigured(
        "REMINDERS_HTTP_URL must be set when REMINDERS_CHANNEL=http: the URL the reminders "
        "are posted to, e.g. https://notify.example.com/reminders."
    )
if REMINDERS_CHANNEL == "http" and not REMINDERS_HTTP_SECRET:
    raise ImproperlyConfigured(
        "REMINDERS_HTTP_SECRET must be set when REMINDERS_CHANNEL=http: the shared key that "
        "signs each request body (HMAC-SHA256)."
    )

# --- Celery -----------------------------------------------------------------
# Read by config/celery.py with namespace="CELERY"; tests/config/test_celery_config.py
# asserts the effective values so a misspelt name cannot pass silently.

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    for _folder in ("queue", "processed", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        # Broadcast (remote control) exchanges; kombu's default is ./control.
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
elif _redis_url(CELERY_BROKER_URL):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # An acks-late message whose worker vanished is redelivered after this
        # long. It must outlast the longest batch (budget + time limits), else a
        # live batch is delivered twice; the claim would still deduplicate it.
        "visibility_timeout": math.ceil(REMINDERS_TIME_BOUNDS.visibility_timeout),
        # How often a worker looks for unacked messages past the visibility
        # timeout (kombu sweeps every interval x throttle seconds; its default is
        # 100 s). A quarter of the timeout, at most 10 s, one cheap ZRANGE each.
        "unacked_restore_throttle": 1,
        # A dead Redis must not hang a publish from the admin or the scan.
        "socket_connect_timeout": 5,
        "socket_timeout": 10,
        "retry_on_timeout": True,
    }
    CELERY_BROKER_TRANSPORT_OPTIONS["unacked_restore_interval"] = max(
        1, min(10, CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] // 4)
    )
    REMINDERS_REDIS_URL = REMINDERS_REDIS_URL or CELERY_BROKER_URL
else:
    raise ImproperlyConfigured(
        "CELERY_BROKER_URL must be redis://host:6379/0 (production) or filesystem:// "
        f"(local run); got {redact_url(CELERY_BROKER_URL)!r}."
    )

CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_ENABLE_UTC = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

# Two queues: a long delivery backlog must never delay the scan. The pool
# consumes only "reminders" (task_queues is the default consume set); every
# worker's main process consumes "scan" in a thread of its own
# (reminders/worker/scanlane.py), so busy pool processes cannot starve the scan.
CELERY_TASK_DEFAULT_QUEUE = "reminders"
CELERY_TASK_QUEUES = (Queue("reminders"),)
CELERY_TASK_ROUTES = {
    "reminders.scan": {"queue": "scan"},
    "reminders.deliver_batch": {"queue": "reminders"},
    "reminders.replay_selection": {"queue": "reminders"},
    "reminders.send_test": {"queue": "reminders"},
    "reminders.deliver_notices": {"queue": "reminders"},
}

# Acknowledge after the task body ran: a message whose whole worker dies (power
# loss, SIGKILL of the main process) before it is acknowledged is redelivered
# after the visibility timeout, and the claim (not the broker) deduplicates.
# A pool child that dies alone is another case: see the next setting.
CELERY_TASK_ACKS_LATE = True
# A pool child killed by OOM or the hard time limit is NOT requeued: that would
# loop a poison message forever. The claim lease and the reaper decide instead.
CELERY_TASK_REJECT_ON_WORKER_LOST = False
# Take one message at a time, so a busy worker does not hoard batches that an
# idle one could run before their deadline.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fix-up closes the database connection after every this many tasks; the
# worker's task_prerun hook (reminders.worker.hooks) applies CONN_MAX_AGE instead.
CELERY_DB_REUSE_MAX = 1_000_000
# Time limits sit above the batch's longest run: the engine stops itself at the
# budget with partial results; the soft limit is the safety net (it stops the
# batch like a warm shutdown and records what is known) and the hard limit the
# last resort (the lease, longer still, then lets the reaper decide).
CELERY_TASK_SOFT_TIME_LIMIT = math.ceil(REMINDERS_TIME_BOUNDS.soft_limit)
CELERY_TASK_TIME_LIMIT = math.ceil(REMINDERS_TIME_BOUNDS.hard_limit)
# A cold shutdown (SIGQUIT, a second SIGTERM) first gives running batches this
# long: a warm shutdown has already stopped them, so drain, close and record fit.
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = float(math.ceil(REMINDERS_TIME_BOUNDS.stop_grace))
CELERY_WORKER_ENABLE_SOFT_SHUTDOWN_ON_IDLE = True
# A broker restart must not kill running batches: their claims would go
# unrecorded (and become unknown on SMTP). The message is redelivered and the
# claim makes the second run a no-op.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Publishing gives up quickly when the broker is down; the scan re-enqueues
# whatever was not published, so a failed publish loses nothing.
CELERY_TASK_PUBLISH_RETRY = True
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.5,
    "interval_max": 1,
}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Task events (sent, received, started, succeeded, failed) on the broker, so
# Flower and `celery events` see every task with no extra setting. They cost a
# few small Redis publishes per batch message (bench/e2e.py --events-cost
# measures the worker CPU). REMINDERS_TASK_EVENTS=0 turns them off.
REMINDERS_TASK_EVENTS = env_bool("REMINDERS_TASK_EVENTS", True)
# /metrics on web (reminders/web_metrics.py): off (404) unless set; then it answers
# only "Authorization: Bearer <METRICS_TOKEN>".
METRICS_TOKEN = env_str("METRICS_TOKEN")
_long_enough("METRICS_TOKEN", METRICS_TOKEN)
# How long the record of each dispatched batch (reminders.models.Dispatch, read by
# manage.py reminder_trace and the admin's timeline) is kept; every scan deletes older ones.
REMINDERS_DISPATCH_HISTORY_DAYS = env_int(
    "REMINDERS_DISPATCH_HISTORY_DAYS", 14, minimum=1, maximum=3650, unit="days"
)
# The django channel's provider reports through django-anymail's tracking webhooks
# (/anymail/<provider>/tracking/). Off until ANYMAIL_WEBHOOK_SECRET ("user:password",
# the basic auth the provider is given) is set: without it a report is ignored.
ANYMAIL_WEBHOOK_SECRET = env_str("ANYMAIL_WEBHOOK_SECRET")
_long_enough("ANYMAIL_WEBHOOK_SECRET", ANYMAIL_WEBHOOK_SECRET)
# django-anymail's other settings (a provider's API key or webhook signing key, such
# as ANYMAIL_MAILGUN_WEBHOOK_SIGNING_KEY), passed through as the environment names them.
for _name, _value in os.environ.items():
    if _name.startswith("ANYMAIL_") and _name != "ANYMAIL_WEBHOOK_SECRET":
        globals()[_name] = _value
# How long providers' delivery events (reminders.models.DeliveryEvent: a bounce's
# reason may quote an address) are kept; every scan deletes older ones.
REMINDERS_EVENT_RETENTION_DAYS = env_int(
    "REMINDERS_EVENT_RETENTION_DAYS", 90, minimum=1, maximum=3650, unit="days"
)
# Where attendees reach this service (scheme, host, optional path; no trailing slash):
# each reminder and change notice links to its "can't attend" page and one-click
# unsubscribe under it (reminders/attendance.py). Blank: messages carry no links.
REMINDERS_PUBLIC_URL = env_str("REMINDERS_PUBLIC_URL", "http://127.0.0.1:8000" if DEBUG else "")
if REMINDERS_PUBLIC_URL:
    _public = urlsplit(REMINDERS_PUBLIC_URL)
    if (
        _public.scheme not in ("http", "https")
        or not _public.netloc
        # The links are appended to it: after a '?' or a '#' they would lead nowhere.
        or any(mark in REMINDERS_PUBLIC_URL for mark in "?#")
    ):
        raise ImproperlyConfigured(
            f"REMINDERS_PUBLIC_URL={REMINDERS_PUBLIC_URL!r} is not an http(s) address: give "
            "where attendees reach this service, e.g. https://reminders.example.com."
        )
    if _public.scheme != "https" and not DEBUG:
        raise ImproperlyConfigured(
            "REMINDERS_PUBLIC_URL must be https:// when DEBUG is off: the links in every "
            "message carry a token that cancels an enrollment."
        )
    REMINDERS_PUBLIC_URL = REMINDERS_PUBLIC_URL.rstrip("/")
# The HTTP API (intake/api/): each token may send this many requests per window
# ('600/minute'; second, minute or hour), counted in the cache below; past it, 429 with
# Retry-After.
REMINDERS_API_RATE = env_str("REMINDERS_API_RATE", "600/minute")
try:
    from intake.ratelimit import parse_rate

    parse_rate(REMINDERS_API_RATE)
except ValueError as _error:
    raise ImproperlyConfigured(str(_error)) from None
# The cache holds the API's request counts: on the Redis server of the limiter and the
# broker when there is one, so every web process counts against one window; else (the
# local run, one web process) in memory.
CACHES = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REMINDERS_REDIS_URL,
            "KEY_PREFIX": "wr-cache",
            "OPTIONS": {"socket_connect_timeout": 5, "socket_timeout": 5},
        }
        if REMINDERS_REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}
# DKIM for the smtp channel (delivery/dkim.py): the selector and a file holding the
# RSA private key (PEM) published at <selector>._domainkey.<domain>; the domain is
# DEFAULT_FROM_EMAIL's unless REMINDERS_DKIM_DOMAIN says otherwise. Both blank: no
# signature (the relay may sign). One without the other stops start-up.
REMINDERS_DKIM_SELECTOR = env_str("REMINDERS_DKIM_SELECTOR")
REMINDERS_DKIM_KEY_FILE = env_str("REMINDERS_DKIM_KEY_FILE")
REMINDERS_DKIM_DOMAIN = env_str("REMINDERS_DKIM_DOMAIN")
if bool(REMINDERS_DKIM_SELECTOR) != bool(REMINDERS_DKIM_KEY_FILE):
    raise ImproperlyConfigured(
        "Set both REMINDERS_DKIM_SELECTOR and REMINDERS_DKIM_KEY_FILE to sign with DKIM, "
        "or neither."
    )
if REMINDERS_DKIM_KEY_FILE and not (
    os.path.isfile(REMINDERS_DKIM_KEY_FILE) and os.access(REMINDERS_DKIM_KEY_FILE, os.R_OK)
):
    raise ImproperlyConfigured(
        f"REMINDERS_DKIM_KEY_FILE={REMINDERS_DKIM_KEY_FILE!r} cannot be read: give the path "
        "of the PEM file holding the DKIM private key."
    )
# Seconds a workshop change waits before its change notices are planned, so that two
# or three saves within it make one notice with the final facts; never more than a
# quarter of the time left before the start (reminders.services.notices). 0: at once.
REMINDERS_NOTICE_SETTLE = env_int(
    "REMINDERS_NOTICE_SETTLE", 300, minimum=0, maximum=24 * 3600, unit="seconds"
)
# Soft bounces in a row (none delivered between) after which an address is suppressed
# like a hard bounce (reminders.services.feedback).
REMINDERS_SOFT_BOUNCES_TO_SUPPRESS = env_int(
    "REMINDERS_SOFT_BOUNCES_TO_SUPPRESS", 3, minimum=1, maximum=100
)
# A worker's own series (provider calls, slack, limiter waits: reminders/worker/telemetry.py)
# on this port, summed over its pool processes. 0 or unset: off (a template's
# ${REMINDERS_METRICS_PORT:-0} gives 0). One port per worker on a host.
try:
    REMINDERS_METRICS_PORT = env_int("REMINDERS_METRICS_PORT", 0, minimum=0, maximum=65535)
except ImproperlyConfigured as _error:
    raise ImproperlyConfigured(f"{_error} 0 or unset: no metrics port.") from None
REMINDERS_METRICS_BIND = env_str("REMINDERS_METRICS_BIND", "127.0.0.1")
CELERY_WORKER_SEND_TASK_EVENTS = REMINDERS_TASK_EVENTS
CELERY_TASK_SEND_SENT_EVENT = REMINDERS_TASK_EVENTS

# django-celery-beat's DatabaseScheduler, which first makes the stored scan
# follow REMINDERS_SCAN_INTERVAL (reminders/beat.py says why not on beat_init).
CELERY_BEAT_SCHEDULER = "reminders.beat:ScanScheduler"
# Write the scan's last_run_at to the database after every scan (default: every
# 3 minutes), so the admin's health view reads beat's real heartbeat.
CELERY_BEAT_SYNC_EVERY = 1
# beat wakes at least this often to notice schedule changes in the database.
CELERY_BEAT_MAX_LOOP_INTERVAL = min(REMINDERS_SCAN_INTERVAL, 60)
DJANGO_CELERY_BEAT_TZ_AWARE = True

# Prefix of every idempotency key: set it per deployment so a rebuilt database
# (ids counting from 1 again) never reuses a key a provider still remembers.
REMINDERS_KEY_PREFIX = env_str("REMINDERS_KEY_PREFIX", "rem")
if (
    not REMINDERS_KEY_PREFIX.replace("-", "").replace("_", "").isalnum()
    or not REMINDERS_KEY_PREFIX.isascii()
    or len(REMINDERS_KEY_PREFIX) > 20
):
    raise ImproperlyConfigured(
        "REMINDERS_KEY_PREFIX must be 1-20 ASCII letters, digits, '-' or '_'; "
        f"got {REMINDERS_KEY_PREFIX!r}."
    )

# Retry between claims (pipeline level; the engine also retries inside a batch):
# the n-th failed claim waits min(MAX, BASE * 2**(n-1)) seconds.
REMINDERS_RETRY_BASE = env_int("REMINDERS_RETRY_BASE", 30, minimum=0, maximum=3600, unit="seconds")
REMINDERS_RETRY_MAX = env_int("REMINDERS_RETRY_MAX", 600, minimum=0, maximum=86400, unit="seconds")
# A queued reminder whose message has not been consumed this long is queued
# again by the scan (the old message expires at the same moment, so at most
# one message per reminder is live). This is how lost messages are recovered.
REMINDERS_REQUEUE_AFTER = env_int(
    "REMINDERS_REQUEUE_AFTER", 300, minimum=10, maximum=86400, unit="seconds"
)
# Most reminders one scan queues; the next scan takes the rest.
REMINDERS_DISPATCH_LIMIT = env_int("REMINDERS_DISPATCH_LIMIT", 20000, minimum=1, maximum=1000000)
# A confirmed replay of more reminders than this runs on a worker (its staff
# decision shows the progress); the request itself only records it.
REMINDERS_REPLAY_INLINE_LIMIT = env_int(
    "REMINDERS_REPLAY_INLINE_LIMIT", 2000, minimum=1, maximum=1000000
)
# Reminders a background replay re-arms per chunk: one transaction, one task.
REMINDERS_REPLAY_CHUNK = env_int("REMINDERS_REPLAY_CHUNK", 1000, minimum=1, maximum=100000)
# Provider calls per reminder inside one batch (with backoff and jitter)
# before the batch gives the reminder back for a later claim.
REMINDERS_ENGINE_ATTEMPTS = env_int("REMINDERS_ENGINE_ATTEMPTS", 3, minimum=1, maximum=20)
# SMTP connections one worker process keeps open to EMAIL_HOST during a batch
# (and between batches: REMINDERS_KEEP_CONNECTIONS);
# each carries one message at a time, so this caps the smtp channel's concurrency.
REMINDERS_SMTP_CONNECTIONS = env_int("REMINDERS_SMTP_CONNECTIONS", 4, minimum=1, maximum=100)
# A pool process keeps its provider connections, event loop and limiter client
# from one batch to the next while batches come within this many seconds of
# each other; 0 opens and closes them with every batch (reminders.worker.bridge).
REMINDERS_KEEP_CONNECTIONS = env_float(
    "REMINDERS_KEEP_CONNECTIONS", 10, minimum=0, maximum=600, unit="seconds (0 = per batch)"
)
