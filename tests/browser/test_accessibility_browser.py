"""axe-core finds no WCAG 2.1 A/AA violation on the pages the project renders itself: the
attendee's pages under the links of their messages (in each language, on a desk and on a
phone) and the project's own admin pages. See tests/browser/axe.py for the rules run."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django_celery_beat.models import PeriodicTask

from reminders import attendance
from reminders.links import attendance_token, unsubscribe_token
from reminders.models import Reminder, ScanRun
from reminders.schedule import SCAN_NAME, ensure_scan_schedule
from tests.browser.axe import assert_no_violations, axe_violations
from tests.browser.conftest import PASSWORD, PHONE, log_in
from workshops.services import enrollment_create

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DESK = {"viewport": {"width": 1280, "height": 900}}
# Django's own admin chrome, which the project neither restyles nor patches; only these
# rules, only there. The breadcrumbs' links differ from the text between them by colour
# alone (Django's stylesheet). The attendee chooser of a new enrollment row is Django's
# autocomplete (its bundled Select2): Select2 names its combobox by the text of the choice
# made, so before one is made the combobox has no name, whatever label the select has.
DJANGO_CHROME = {
    "link-in-text-block": ".breadcrumbs a",
    "aria-input-field-name": ".select2-selection, .select2-selection__rendered",
}


@pytest.mark.parametrize(
    "device",
    [pytest.param(PHONE, id="phone"), pytest.param(DESK, id="desk", marks=pytest.mark.long)],
)
@pytest.mark.parametrize("language", ["en", "de", "fr"])
def test_the_attendees_pages_have_no_violations(
    live_server, live_clock, make_workshop, make_attendee, chromium, monkeypatch, language, device
):
    """Every state of the attendee's page: asked, done, opened again, unsubscribe asked and done, a link that
    does not work (a bad token, no route), a failure on our side, and a workshop ended."""
    workshop = make_workshop(starts_in=timedelta(hours=5), title="Wheel throwing")
    attendee = make_attendee(language=language)
    reminder = Reminder.objects.get(
        enrollment=enrollment_create(attendee=attendee, workshop=workshop)
    )
    attend = f"{live_server.url}/attend/{attendance_token(reminder.pk)}/"
    unsubscribe = f"{live_server.url}/unsubscribe/{unsubscribe_token(reminder.pk)}/"
    context = chromium.new_context(**device, extra_http_headers={"Accept-Language": language})
    found: dict[str, list[dict]] = {}
    languages: dict[str, str | None] = {}
    try:
        page = context.new_page()

        def check(name: str, url: str | None = None, *, status: int = 200) -> None:
            if url is not None:
                assert page.goto(url).status == status, name
            found[name] = axe_violations(page)
            languages[name] = page.locator("html").get_attribute("lang")

        check("can't attend: asked", attend)
        page.locator("#confirm").click()
        page.wait_for_selector("#done")
        check("can't attend: done")
        check("can't attend: cancelled before", attend)
        check("unsubscribe: asked", unsubscribe)
        page.locator("#confirm").click()
        page.wait_for_selector("#done")
        check("unsubscribe: done")
        check("bad token (404)", f"{live_server.url}/attend/1.cut-short/", status=404)
        check("no route (404)", f"{live_server.url}/unsubscribe/1.x/y/", status=404)

        def broken(*args, **kwargs):
            raise RuntimeError("the database is away")

        with monkeypatch.context() as patch:
            patch.setattr(attendance, "reminder_for_link", broken)
            check("failure on our side (500)", attend, status=500)
        live_clock.advance(timedelta(hours=7).total_seconds())
        check("workshop ended (410)", attend, status=410)
    finally:
        context.close()
    assert_no_violations(found)
    # axe asks for a valid lang; the page's language must also be the attendee's.
    assert set(languages.values()) == {language}, languages


class StaffPages:
    """A superuser's browser page; ``check`` runs axe on it and keeps what it found."""

    def __init__(self, page, base: str) -> None:
        self.page, self.base = page, base
        self.found: dict[str, list[dict]] = {}

    def check(self, name: str, path: str | None = None) -> None:
        """Run axe on the page as it is, or first open ``path``; keep it under ``name``."""
        if path is not None:
            assert self.page.goto(self.base + path).ok, name
        self.found[name] = axe_violations(self.page, ignore=DJANGO_CHROME)

    def action(self, changelist: str, label: str, name: str) -> None:
        """Check ``changelist``, tick all its rows, run the action ``label``: check its
        confirmation."""
        self.check(f"{name}: list", changelist)
        self.page.check("#action-toggle")
        self.page.select_option("select[name=action]", label=label)
        self.page.click("button[name=index]")
        self.page.wait_for_selector("#staff-preview")
        self.check(name)


@pytest.fixture(params=["light", "dark"])
def staff(request, live_server, plain_http_cookies, chromium, admin_user):
    """Return a function that logs a superuser in at a path: their ``StaffPages``.

    In a browser set to the light and to the dark scheme: Django's admin follows it, and
    the project's own colours must read in both."""
    admin_user.set_password(PASSWORD)
    admin_user.save()
    context = chromium.new_context(**DESK, color_scheme=request.param)
    context.set_default_timeout(20_000)

    def enter(first: str) -> StaffPages:
        page = context.new_page()
        log_in(page, live_server.url, admin_user.username, first)
        return StaffPages(page, live_server.url)

    yield enter
    context.close()


@pytest.mark.long
def test_the_workshop_pages_have_no_violations(live_clock, make_workshop, enrol, staff):
    """The workshop's page (the project's links), the preview of a reminder and of a
    notice, the confirmation of a cancel."""
    workshop = make_workshop(starts_in=timedelta(hours=5), title="Kiln basics")
    enrol(workshop, 3)
    pages = staff(f"/admin/workshops/workshop/{workshop.pk}/change/")
    page, check = pages.page, pages.check
    check("workshop change page")
    page.locator("#enrollments-group .add-row a").click()
    check("workshop change page, a row added")
    page.get_by_role("link", name="Preview reminder").click()
    page.wait_for_selector("#preview-html")
    check("reminder preview")
    check("notice preview", f"/admin/workshops/workshop/{workshop.pk}/preview/?message=notice")
    pages.action("/admin/workshops/workshop/", "Cancel selected workshops", "cancel")
    assert_no_violations(pages.found)


@pytest.mark.long
def test_the_reminder_pages_have_no_violations(live_clock, make_workshop, enrol, staff):
    """The reminders list with its health line, the scheduler's health page (never scanned,
    then running), a reminder's timeline, the confirmations of a replay and of a decision on
    unknown outcomes."""
    enrol(make_workshop(starts_in=timedelta(hours=5)), 3)
    first, second, third = Reminder.objects.order_by("pk")
    Reminder.objects.filter(pk=first.pk).update(status="failed", last_error="550 disabled")
    Reminder.objects.filter(pk=second.pk).update(status="unknown")
    Reminder.objects.filter(pk=third.pk).update(status="sent", channel="smtp")
    pages = staff("/admin/reminders/reminder/")
    check = pages.check
    check("reminders list with its health line")
    check("scheduler health, never scanned", "/admin/reminders/reminder/health/")
    PeriodicTask.objects.filter(pk=ensure_scan_schedule().pk).update(last_run_at=live_clock.now())
    ScanRun.objects.create(name=SCAN_NAME, finished_at=live_clock.now(), duration_seconds=0.1)
    check("scheduler health, running", "/admin/reminders/reminder/health/")
    assert pages.page.locator("#scheduler-ok").count() == 1
    check("reminder timeline", f"/admin/reminders/reminder/{third.pk}/change/")
    reminders = "/admin/reminders/reminder/?status__exact="
    pages.action(reminders + "failed", "Replay selected reminders", "replay")
    pages.action(reminders + "unknown", "Decide reminders of unknown outcome", "unknown")
    assert_no_violations(pages.found)


@pytest.mark.long
def test_the_intake_pages_have_no_violations(make_workshop, staff, tmp_path):
    """The CSV import's upload form, its preview (blocked by an invalid row, then ready to
    import) and the API token shown once."""
    workshop = make_workshop(starts_in=timedelta(hours=5), title="Glazing")
    pages = staff(f"/admin/intake/csvtransfer/import/{workshop.pk}/")
    page, check = pages.page, pages.check
    check("CSV import: upload")
    csv = tmp_path / "attendees.csv"
    for name, rows in (("blocked", "Ada;ada@example.com\nNo Mail;\n"), ("ready", "Ada;a@x.org\n")):
        csv.write_text("name;email\n" + rows)
        page.set_input_files("#id_file", str(csv))
        page.get_by_role("button", name="Preview").click()
        page.wait_for_selector("#import-preview")
        assert page.locator("#import-blocked").count() == (name == "blocked")
        check(f"CSV import: preview, {name}")
    assert page.locator("#import-confirm").count() == 1
    page.goto(pages.base + "/admin/intake/apitoken/add/")
    page.fill("#id_integration_name", "shop")
    page.fill("#id_name", "production")
    page.get_by_role("button", name="Save", exact=True).click()
    page.wait_for_selector("#api-token")
    check("API token shown once")
    assert_no_violations(pages.found)
