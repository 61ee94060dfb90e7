"""URL routes: the Django admin is the staff surface.

The probes /healthz and /readyz are answered by config.probes.ProbeMiddleware
before routing (and before the Host check), so they have no route here.
/metrics (reminders/web_metrics.py) is off unless METRICS_TOKEN is set;
/hooks/http/events (reminders/webhooks.py) unless REMINDERS_HTTP_CALLBACK_SECRET is.
"""

from django.contrib import admin
from django.http import HttpResponse
from django.urls import include, path
from django.views.generic import RedirectView

from intake.api import api, no_such_path
from reminders.attendance import attend, unsubscribe
from reminders.webhooks import http_events


def metrics_view(request):
    """Serve /metrics (reminders/web_metrics.py), importing it, and so prometheus_client, on first use.

    A worker loads this URLconf too (Celery's Django fix-up runs the system
    checks), before it has chosen prometheus_client's multiprocess mode
    (reminders/worker/telemetry.py); the library must not be imported before that.
    """
    from reminders.web_metrics import metrics_view as view

    return view(request)


def no_icon(request):
    """Answer a browser's /favicon.ico: no icon, for a week. Every page view of staff and
    attendees asked for it, and each ask was a 404 logged as a warning."""
    return HttpResponse(status=204, headers={"Cache-Control": "public, max-age=604800"})


admin.site.site_header = "Workshop Reminders"
admin.site.site_title = "Workshop Reminders"
admin.site.index_title = "Workshops and reminders"

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("favicon.ico", no_icon),
    # The HTTP API (intake/api/): Bearer tokens; schema at /api/schema, docs at /api/docs.
    path("api/", api.urls),
    path("api/<path:rest>", no_such_path),
    path("metrics", metrics_view, name="metrics"),
    path("hooks/http/events", http_events, name="http_events"),
    # The attendee's own links in each message (reminders/attendance.py): no login.
    path("attend/<str:token>/", attend, name="attend"),
    path("unsubscribe/<str:token>/", unsubscribe, name="unsubscribe"),
    # The django channel's provider reports (reminders/receivers.py): ignored unless
    # ANYMAIL_WEBHOOK_SECRET is set, which each of these views then requires.
    path("anymail/", include("anymail.urls")),
]

# A link cut right after /attend/ matches no pattern: its 404 is the attendance page's, and
# so is a failure under the attendee's links. Elsewhere both are Django's.
handler404 = "reminders.attendance.page_not_found"
handler500 = "reminders.attendance.server_error"
