"""URL routes: the Django admin is the staff surface.

The probes /healthz and /readyz are answered by config.probes.ProbeMiddleware
before routing (and before the Host check), so they have no route here.
"""

from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

admin.site.site_header = "Workshop Reminders"
admin.site.site_title = "Workshop Reminders"
admin.site.index_title = "Workshops and reminders"

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
]
