"""URL routes: the Django admin is the staff surface.

The probes /healthz and /readyz are answered by config.probes.ProbeMiddleware
before routing (and before the Host check), so they have no route here.
/metrics (reminders/metrics.py) is off unless METRICS_TOKEN is set.
"""

from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from reminders.metrics import metrics_view

admin.site.site_header = "Workshop Reminders"
admin.site.site_title = "Workshop Reminders"
admin.site.index_title = "Workshops and reminders"

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
]
