"""Staff copy a workshop past the enrollments its page lists ("Save as new"), in a real
browser: the copy is made without them, as staff.md says (enrol them by a CSV import)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reminders.admin.workshop import INLINE_ENROLLMENTS_MAX
from tests.browser.conftest import PASSWORD, log_in
from workshops.models import Enrollment, Workshop

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def test_save_as_new_copies_a_workshop_past_its_listed_enrollments(
    live_server, plain_http_cookies, live_clock, make_workshop, enrol, new_page, django_user_model
):
    workshop = make_workshop(starts_in=timedelta(days=3), title="Kiln safety")
    enrol(workshop, INLINE_ENROLLMENTS_MAX + 1)
    django_user_model.objects.create_superuser(username="organiser", password=PASSWORD)
    page = new_page()
    change = f"/admin/workshops/workshop/{workshop.pk}/change/"
    log_in(page, live_server.url, "organiser", change)
    assert page.locator("#enrollments-group").count() == 0  # not listed past the limit
    page.fill("#id_title", "Kiln safety (again)")
    page.click("input[name=_saveasnew]")
    page.wait_for_load_state()
    errors = page.locator(".errornote, .errorlist").all_inner_texts()
    copies = list(Workshop.objects.exclude(pk=workshop.pk).values_list("title", flat=True))
    assert (errors, copies) == ([], ["Kiln safety (again)"])
    copy = Workshop.objects.exclude(pk=workshop.pk).get()
    assert Enrollment.objects.filter(workshop=copy).count() == 0
    assert Enrollment.objects.filter(workshop=workshop).count() == INLINE_ENROLLMENTS_MAX + 1
