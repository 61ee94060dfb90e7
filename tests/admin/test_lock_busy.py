"""A staff request that meets a held row lock waits a bounded time, then is told to try again."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection

from reminders.locks import BUSY_MESSAGE
from reminders.models import Reminder, StaffDecision
from tests.admin.test_workshop_decisions import CANCELLER, post
from tests.support.races import held_rows
from workshops.models import Workshop

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_cancel_behind_a_held_lock_is_told_to_try_again_and_changes_nothing(
    make_staff, login, make_workshop, enrol, settings
):
    settings.REMINDERS_STAFF_LOCK_TIMEOUT = 0.2
    connection.close()  # this session opens again with that timeout
    workshop = make_workshop()
    enrol(workshop, count=2)
    with held_rows(Reminder.objects.filter(workshop=workshop)) as still_held:
        client = login(make_staff(*CANCELLER))
        page = post(client, "cancel_selected", [workshop.pk], confirm=True, reason="flooded")
        answered_while_held = still_held()
    assert answered_while_held, "the request waited for the lock to be released"
    assert page.status_code == 200
    assert [str(m) for m in page.context["messages"]] == [BUSY_MESSAGE]
    assert Workshop.objects.get(pk=workshop.pk).status == "scheduled"
    assert not StaffDecision.objects.exists()
    assert Counter(Reminder.objects.values_list("status", flat=True)) == {"pending": 2}
