"""System checks: a delivery channel that cannot be built is an error at start-up."""

from __future__ import annotations

from django.core.checks import Error, register

from clock import default_clock


@register()
def check_delivery_channel(app_configs, **kwargs):
    from reminders.worker.bridge import channel_problem

    if problem := channel_problem(clock=default_clock()):
        hint = "Fix the setting named in the message (see README, Configuration)."
        return [Error(problem, hint=hint, id="reminders.E001")]
    return []
