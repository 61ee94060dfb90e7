"""Writers that meet on the same rows, with their interleaving forced by a held lock.

A third session holds the first row; the two writers are started one after
the other and each is seen blocked in PostgreSQL before the lock is let go.
Both then finish, neither is aborted as a deadlock, and the rows end as the
order of their commits says.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from reminders.models import Reminder
from reminders.services import reminder_claim_batch
from tests.support.races import Step, blocked_or_done
from workshops.models import Workshop
from workshops.services import workshop_cancel

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_claim_and_a_staff_cancel_waiting_on_the_same_row_both_finish(
    clock, make_workshop, enrol
):
    workshop = make_workshop()
    enrol(workshop, count=4)
    ids = sorted(Reminder.objects.values_list("id", flat=True))
    held, release = threading.Event(), threading.Event()

    def hold_the_first_row() -> None:
        with transaction.atomic():
            list(Reminder.objects.select_for_update().filter(pk=ids[0]))
            held.set()
            release.wait(30)

    holder = Step(hold_the_first_row)
    holder.start()
    assert held.wait(10)
    # The claim takes the rows from the last to the first id; the cancel's settle from
    # the first. Locked in id order, both wait on the held row holding nothing else.
    claim = Step(lambda: reminder_claim_batch(ids=list(reversed(ids)), channel="file", clock=clock))
    claim.start()
    blocked_or_done(claim)
    cancel = Step(lambda: workshop_cancel(workshop=Workshop.objects.get(pk=workshop.pk)))
    cancel.start()
    blocked_or_done(cancel)
    assert claim.is_alive() and cancel.is_alive(), "neither waited: the test proves nothing"
    release.set()
    holder.finish()
    taken = claim.finish()
    cancel.finish()
    connection.close()
    statuses = dict(Reminder.objects.values_list("id", "status"))
    # The claim was first in line: it took all four; the cancel then found none open
    # (the claim watch and the record decide those, tests/integration/test_staff_changes.py).
    assert sorted(taken.ids) == ids
    assert set(statuses.values()) == {"sending"}
    assert Workshop.objects.get(pk=workshop.pk).status == "cancelled"
