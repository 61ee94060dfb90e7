"""System checks: a delivery channel that cannot be built is an error at start-up."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, register

from clock import default_clock


@register()
def check_delivery_channel(app_configs, **kwargs):
    from reminders.worker.bridge import check_channel

    try:
        check_channel(settings.REMINDERS_CHANNEL, clock=default_clock())
    except (ValueError, TypeError) as exc:
        return [
            Error(
                f"REMINDERS_CHANNEL={settings.REMINDERS_CHANNEL} cannot be built: {exc}",
                hint="Fix the setting named in the message (see README, Configuration).",
                id="reminders.E001",
            )
        ]
    return []
