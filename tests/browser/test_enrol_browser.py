"""Staff enrol attendees by the attendee autocomplete, in a workshop's inline and on the
enrollment page, in a real browser."""

from __future__ import annotations

import pytest

from tests.browser.conftest import PASSWORD, log_in
from workshops.models import Enrollment
from workshops.services import attendee_get_or_create, enrollment_create

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.django_db(transaction=True),
]


def _search(page, field, term: str) -> list[str]:
    """Open ``field``'s autocomplete, type ``term``, scroll to its last page; return its choices."""
    field.locator(".select2-selection").click()
    page.fill(".select2-search__field", term)
    options = page.locator(".select2-results__option")
    page.wait_for_function("!document.querySelector('.select2-results__option.loading-results')")
    while page.locator(
        ".select2-results__option.loading-results, .select2-results__option--load-more"
    ).count():
        # Scroll the list itself: the "load more" item is replaced when the next page comes,
        # so a handle to it can be detached by the time it is used (seen under CI's load).
        page.eval_on_selector(
            ".select2-results__options", "list => { list.scrollTop = list.scrollHeight; }"
        )
        page.wait_for_timeout(200)
    return options.all_inner_texts()


def test_staff_enrol_through_the_attendee_autocomplete_in_its_order_page_after_page(
    live_server, plain_http_cookies, make_workshop, new_page, admin_user
):
    """More matches than a page of the autocomplete (20) load as staff scroll, each once, in
    the attendee list's order (by email)."""
    workshop = make_workshop(title="Kiln basics")
    for number in range(25, 0, -1):
        attendee_get_or_create(email=f"smith{number:02}@example.com", name=f"Sam Smith {number}")
    other, _ = attendee_get_or_create(email="zoe@example.com", name="Zoë")
    enrollment_create(attendee=other, workshop=workshop)  # a saved row: the new one is second
    admin_user.set_password(PASSWORD)
    admin_user.save()
    wanted = [f"Sam Smith {n} <smith{n:02}@example.com>" for n in range(1, 26)]

    page = new_page()
    log_in(
        page,
        live_server.url,
        admin_user.username,
        f"/admin/workshops/workshop/{workshop.pk}/change/",
    )
    page.locator("#enrollments-group .add-row a").click()
    assert _search(page, page.locator("#enrollments-1"), "Smith") == wanted
    page.locator(".select2-results__option", has_text="smith07@").click()
    page.get_by_role("button", name="Save and continue editing").click()
    assert "was changed successfully" in page.locator(".messagelist").inner_text()

    page.goto(f"{live_server.url}/admin/workshops/enrollment/add/")
    assert _search(page, page.locator(".field-attendee"), "Smith") == wanted
    page.locator(".select2-results__option", has_text="smith08@").click()
    page.locator(".field-workshop .select2-selection").click()
    page.fill(".select2-search__field", "Kiln")
    page.locator(".select2-results__option", has_text="Kiln basics").click()
    page.get_by_role("button", name="Save", exact=True).click()
    assert "was added successfully" in page.locator(".messagelist").inner_text()
    enrolled = Enrollment.objects.filter(workshop=workshop).values_list(
        "attendee__email", flat=True
    )
    assert sorted(enrolled) == ["smith07@example.com", "smith08@example.com", "zoe@example.com"]
