"""``/metrics`` for Prometheus, read from the database and the broker at each scrape.

Nothing is kept in memory, so any web process answers the same. Off (404) unless
METRICS_TOKEN is set; then ``Authorization: Bearer <token>`` is required.
"""

from __future__ import annotations

import functools
import hmac
import logging
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, Min, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from clock import default_clock
from reminders.models import (
    DeliveryEvent,
    DroppedReports,
    Notice,
    Reminder,
    ScanRun,
    StaffDecision,
)
from reminders.policy import ReminderPolicy
from reminders.schedule import SCAN_NAME, SCAN_TASK_NAME

logger = logging.getLogger(__name__)

# The queues reported, and the priority suffixes kombu's Redis transport gives their lists.
QUEUES = ("reminders", "scan")
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")
# Age of the oldest row from when it got there: a queued row's updated_at moves on
# edits; a sending row is written only by its worker, so updated_at is its claim.
AGED = {Reminder.Status.QUEUED: "queued_at", Reminder.Status.SENDING: "updated_at"}
# For the alert ReminderNearDeadlineNotSent (deploy/prometheus/alerts.yml).
NEAR_DEADLINE = timedelta(minutes=10)
WAITING = (Reminder.Status.PENDING, Reminder.Status.QUEUED)
# For the alerts on bounce and complaint rates (deploy/prometheus/alerts.yml).
LAST_HOUR = timedelta(hours=1)


def _family(name: str, documentation: str, samples, labels: list[str], kind=GaugeMetricFamily):
    """Return a metric family holding ``samples``, pairs of label values and value."""
    family = kind(name, documentation, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def _counts(queryset, *fields: str) -> dict:
    """Return ``{value: rows}`` (``{(value, ...): rows}`` for several fields) of ``queryset``."""
    rows = queryset.order_by().values_list(*fields).annotate(n=Count("id"))
    return {tuple(row[:-1]) if len(fields) > 1 else row[0]: row[-1] for row in rows}


class ReminderCollector(Collector):
    """Collect the reminder, scan, queue and staff series at each scrape."""

    def collect(self):
        now = default_clock().now()
        counts = _counts(Reminder.objects, "status")
        yield _family(
            "reminders_by_status",
            "Reminders in each status, from the database",
            (([status.value], counts.get(status.value, 0)) for status in Reminder.Status),
            ["status"],
        )
        found = _counts(Notice.objects, "status", "kind")
        yield _family(
            "reminders_notices",
            "Change notices in each status and kind, from the database",
            (
                ([status.value, kind.value], found.get((status.value, kind.value), 0))
                for status in Notice.Status
                for kind in Notice.Kind
            ),
            ["status", "kind"],
        )

        # Deadline before now + NEAR_DEADLINE: the start before that plus the cutoff.
        horizon = now + NEAR_DEADLINE + ReminderPolicy.from_settings().cutoff
        oldest = Reminder.objects.aggregate(
            **{status.value: Min(since, filter=Q(status=status)) for status, since in AGED.items()},
            **{
                f"near_{status.value}": Count(
                    "id", filter=Q(status=status, workshop__starts_at__lt=horizon)
                )
                for status in WAITING
            },
        )
        since = {status.value: oldest[status.value] for status in AGED}
        yield _family(
            "reminders_oldest_seconds",
            "Seconds since the oldest reminder in this status got there (0 when none is)",
            (
                ([status], (now - moment).total_seconds() if moment else 0.0)
                for status, moment in since.items()
            ),
            ["status"],
        )
        yield _family(
            "reminders_near_deadline",
            "Reminders still pending or queued whose deadline is under 10 minutes away or past",
            (([status.value], oldest[f"near_{status.value}"]) for status in WAITING),
            ["status"],
        )

        scan = (
            ScanRun.objects.filter(name=SCAN_NAME)
            .values("finished_at", "duration_seconds", "completed", "counts", "phase_seconds")
            .first()
        ) or {}
        finished = scan.get("finished_at")
        yield GaugeMetricFamily(
            "reminders_scan_last_completed_timestamp_seconds",
            "When the last scan completed (Unix time; 0 before the first)",
            value=finished.timestamp() if finished else 0.0,
        )
        yield GaugeMetricFamily(
            "reminders_scan_seconds",
            "How long the last completed scan took",
            value=float(scan.get("duration_seconds") or 0.0),
        )
        yield _family(
            "reminders_scan_phase_seconds",
            "How long each phase of the last completed scan took",
            (
                ([phase], float(seconds))
                for phase, seconds in sorted((scan.get("phase_seconds") or {}).items())
            ),
            ["phase"],
        )
        yield _family(
            "reminders_scan_rows",
            "What the last completed scan did: reminders expired (missed), reaped by "
            "outcome, planned and dispatched",
            (([phase], float(rows)) for phase, rows in sorted((scan.get("counts") or {}).items())),
            ["phase"],
        )
        yield CounterMetricFamily(
            "reminders_scans",
            "Scans completed since the first",
            value=float(scan.get("completed") or 0),
        )
        yield from _beat_series()
        try:
            depths = _queue_depths()
        except (RedisError, OSError) as exc:  # the database's series above still count
            logger.warning("Metrics without the queue depths: the broker failed (%s)", exc)
            depths = {}
        yield _family(
            "reminders_queue_depth",
            "Messages waiting in each broker queue",
            (([queue], waiting) for queue, waiting in depths.items()),
            ["queue"],
        )
        recorded = _counts(StaffDecision.objects, "action")
        yield _family(
            "reminders_staff_actions",
            "Staff decisions recorded, by action (replays, resolutions, cancels, ...)",
            (([action.value], recorded.get(action.value, 0)) for action in StaffDecision.Action),
            ["action"],
            kind=CounterMetricFamily,
        )
        # The count kept falls at each scan's prune: the alerts on rates read the last hour's.
        reports = {
            (channel, kind): (kept, recent)
            for channel, kind, kept, recent in DeliveryEvent.objects.order_by()
            .values_list("channel", "kind")
            .annotate(
                kept=Count("id"),
                recent=Count("id", filter=Q(received_at__gte=now - LAST_HOUR)),
            )
        }
        channels = sorted({"http", *(channel for channel, _ in reports)})
        for name, documentation, column in (
            (
                "reminders_delivery_events",
                "Providers' reports kept (REMINDERS_EVENT_RETENTION_DAYS), by channel and kind",
                0,
            ),
            (
                "reminders_delivery_events_last_hour",
                "Providers' reports received in the last hour, by channel and kind",
                1,
            ),
        ):
            yield _family(
                name,
                documentation,
                (
                    ([channel, kind.value], reports.get((channel, kind.value), (0, 0))[column])
                    for channel in channels
                    for kind in DeliveryEvent.Kind
                ),
                ["channel", "kind"],
            )
        counted = dict(DroppedReports.objects.values_list("channel", "count"))
        yield _family(
            "reminders_delivery_events_dropped",
            "Providers' reports that named no reminder sent here, or an erased attendee's",
            (([channel], counted.get(channel, 0)) for channel in sorted({"http", *counted})),
            ["channel"],
            kind=CounterMetricFamily,
        )


def _beat_series():
    """Yield when beat last published the scan (not publishing vs not completing), and how often."""
    from django_celery_beat.models import PeriodicTask

    row = (
        PeriodicTask.objects.filter(name=SCAN_TASK_NAME)
        .values("last_run_at", "enabled", "interval__every", "interval__period")
        .first()
    )
    last_run = row["last_run_at"] if row else None
    yield GaugeMetricFamily(
        "reminders_beat_last_published_timestamp_seconds",
        "When celery-beat last published the scan (Unix time; 0 before the first)",
        value=last_run.timestamp() if last_run else 0.0,
    )
    seconds = 0.0
    if row and row["enabled"] and row["interval__every"]:
        # As django-celery-beat's IntervalSchedule.schedule reads it.
        seconds = timedelta(**{row["interval__period"]: row["interval__every"]}).total_seconds()
    yield GaugeMetricFamily(
        "reminders_scan_interval_seconds",
        "How often beat publishes the scan (0 when the schedule is missing or disabled)",
        value=seconds,
    )


def _queue_depths() -> dict[str, int]:
    """Return the messages waiting in each of QUEUES, in one Redis round trip.

    On the filesystem broker (local run) a message is a ``<time>_<uuid>.<queue>.msg`` file.
    """
    url = settings.CELERY_BROKER_URL
    if url.startswith("filesystem://"):
        folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
        names = [path.name.partition(".")[2] for path in folder.iterdir()]
        return {queue: names.count(f"{queue}.msg") for queue in QUEUES}
    pipe = _redis(url).pipeline(transaction=False)
    for queue in QUEUES:
        for suffix in _PRIORITY_SUFFIXES:
            pipe.llen(queue + suffix)
    lengths = pipe.execute()
    step = len(_PRIORITY_SUFFIXES)
    return {queue: sum(lengths[i * step : (i + 1) * step]) for i, queue in enumerate(QUEUES)}


@functools.cache
def _redis(url: str):
    """Return one client per broker URL (redis-py's pool reconnects after a fork)."""
    import redis

    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)


_registry = CollectorRegistry(auto_describe=False)
_registry.register(ReminderCollector())


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the series in Prometheus's text format to a request bearing METRICS_TOKEN."""
    token = settings.METRICS_TOKEN
    if not token:
        raise Http404("metrics are off: set METRICS_TOKEN")
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        response = HttpResponse("a bearer token is required\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    try:
        body = generate_latest(_registry)
    except DatabaseError as exc:  # every series but the queue depths is the database's
        logger.warning("Metrics not served: the database failed (%s)", type(exc).__name__)
        return HttpResponse(
            "the database did not answer: no series\n", status=503, content_type="text/plain"
        )
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
