"""The attendee's own links (issue 36): "can't attend" and RFC 8058 one-click unsubscribe,
from a message a real SMTP server received, through the web views on PostgreSQL."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client

from reminders import attendance, web_metrics
from reminders.content import reminder_envelope
from reminders.links import attendance_token, unsubscribe_token
from reminders.models import Notice, Reminder, StaffDecision
from reminders.worker import pipeline
from reminders.worker.notices import deliver_notices
from workshops.models import Enrollment
from workshops.services import workshop_update

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC = "https://reminders.example.com"


@pytest.fixture
def delivered(clock, make_workshop, enrol, mail, published, notices_published, settings):
    """Two attendees reminded over SMTP with links on; return (message, reminder) of the first."""
    settings.REMINDERS_PUBLIC_URL = PUBLIC
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3), location="Room 1")
    enrol(workshop, count=2)
    pipeline.scan(clock=clock)
    for batch in list(published):
        pipeline.deliver(batch, clock=clock)
    reminder = Reminder.objects.select_related("attendee").order_by("pk").first()
    [message] = [m for m in mail.received() if m.rcpt_tos == (reminder.attendee.email,)]
    return message, reminder


def _link(message, path: str) -> str:
    body = message.parsed().get_body(("plain",)).get_content()
    [url] = re.findall(rf"{re.escape(PUBLIC)}/{path}/\S+", body)
    return url


def test_each_message_carries_its_links_and_the_one_click_headers(delivered):
    message, reminder = delivered
    url = _link(message, "attend")
    assert url == f"{PUBLIC}/attend/{attendance_token(reminder.pk)}/"
    # No personal data in clear: the token names the reminder's id, signed.
    assert reminder.attendee.email not in url and reminder.attendee.name not in url
    assert message.header("List-Unsubscribe") == (
        f"<{PUBLIC}/unsubscribe/{unsubscribe_token(reminder.pk)}/>"
    )
    assert message.header("List-Unsubscribe-Post") == "List-Unsubscribe=One-Click"
    html = message.parsed().get_body(("html",)).get_content()
    assert f'href="{url}"' in html

    # Deterministic: a retry under the same key, rendered from a fresh read, carries the same
    # bytes, and the links of the message already sent.
    def fresh():
        rows = Reminder.objects.select_related("attendee", "workshop", "text")
        return reminder_envelope(reminder=rows.get(pk=reminder.pk))

    first, again = fresh(), fresh()
    assert (
        first == again
        and first.unsubscribe_url == f"{PUBLIC}/unsubscribe/{unsubscribe_token(reminder.pk)}/"
    )
    assert url in first.text_body


def test_get_changes_nothing_and_the_confirming_post_cancels_once(delivered, clock):
    message, reminder = delivered
    path = _link(message, "attend").removeprefix(PUBLIC)
    browser = Client(enforce_csrf_checks=True)
    for _ in range(3):  # a mail scanner following every link
        page = browser.get(path)
        assert page.status_code == 200 and b'id="confirm"' in page.content
    assert Enrollment.objects.get(pk=reminder.enrollment_id).status == "active"
    done = browser.post(path)
    assert done.status_code == 200 and b'id="done"' in done.content
    assert browser.post(path).status_code == 200
    assert Enrollment.objects.get(pk=reminder.enrollment_id).status == "cancelled"
    decision = StaffDecision.objects.get()
    assert decision.actor is None and decision.actor_name == "the attendee (their own link)"
    assert decision.enrollment_ids == [reminder.enrollment_id]
    assert "no-store" in page["Cache-Control"] and page["Referrer-Policy"] == "no-referrer"


def test_a_browser_that_keeps_no_cookies_can_confirm_and_a_wrong_token_cannot(delivered):
    """The confirmation's CSRF check refused (403, Django's English page) every attendee whose
    browser or mail app keeps no cookies; the token in the URL is what a forger lacks."""
    message, reminder = delivered
    path = _link(message, "attend").removeprefix(PUBLIC)
    cookieless = Client(enforce_csrf_checks=True)
    assert cookieless.post(path.replace(path[-6:-1], "xxxxx")).status_code == 404
    assert Enrollment.objects.get(pk=reminder.enrollment_id).status == "active"
    done = cookieless.post(path)
    assert done.status_code == 200 and b'id="done"' in done.content and not done.cookies
    assert Enrollment.objects.get(pk=reminder.enrollment_id).status == "cancelled"


@pytest.mark.parametrize(
    "make_path",
    [
        lambda r: f"/attend/{attendance_token(r.pk)[:-1]}x/",  # tampered
        lambda r: f"/attend/{unsubscribe_token(r.pk)}/",  # another purpose's token
        lambda r: f"/attend/{r.pk + 1000}/",  # unsigned
        lambda r: f"/unsubscribe/{attendance_token(r.pk)}/",
    ],
)
def test_a_tampered_or_foreign_link_gets_a_clear_page_and_changes_nothing(delivered, make_path):
    _, reminder = delivered
    client = Client()
    for method in (client.get, client.post):
        page = method(make_path(reminder))
        assert page.status_code == 404
        assert b"This link does not work" in page.content
    assert Enrollment.objects.get(pk=reminder.enrollment_id).status == "active"
    assert Reminder.objects.get(pk=reminder.pk).unsubscribed_at is None


def test_the_link_ends_with_the_workshop_as_it_is_now(delivered, clock):
    message, reminder = delivered
    path = _link(message, "attend").removeprefix(PUBLIC)
    workshop = reminder.workshop
    earlier = clock.now() - timedelta(hours=2)
    workshop_update(workshop=workshop, starts_at=earlier, ends_at=earlier + timedelta(hours=1))
    page = Client().post(path)
    assert page.status_code == 410 and b"has ended" in page.content
    assert Enrollment.objects.get(pk=reminder.enrollment_id).status == "active"


def test_the_page_speaks_the_attendees_language(delivered):
    message, reminder = delivered
    reminder.attendee.language = "de"
    reminder.attendee.save()
    page = Client().get(_link(message, "attend").removeprefix(PUBLIC))
    assert "Ja, meinen Platz freigeben" in page.content.decode()
    page = Client().get(message.header("List-Unsubscribe").strip("<>").removeprefix(PUBLIC))
    assert "Keine Nachrichten mehr zu diesem Workshop? Ihr Platz bleibt Ihnen erhalten." in (
        page.content.decode()
    )


@pytest.mark.parametrize(
    ("language", "said"),
    [("en", "This workshop is cancelled for now. If it is back on, you will hear of it."),
     ("de", "Dieser Workshop ist vorerst abgesagt. Findet er doch statt, erfahren Sie es."),
     ("fr", "Cet atelier est annulé pour l’instant. S’il a finalement lieu, nous vous le dirons.")],
)  # fmt: skip
def test_the_page_of_a_cancelled_workshop_says_so_before_offering_to_cancel_the_place(
    delivered, language, said
):
    """It asked "Can't attend? Cancel your place" as if the workshop were on; the place still
    matters, should the workshop be back on."""
    from workshops.services import workshop_cancel

    message, reminder = delivered
    reminder.attendee.language = language
    reminder.attendee.save()
    path = _link(message, "attend").removeprefix(PUBLIC)
    assert "called-off" not in Client().get(path).content.decode()
    workshop_cancel(workshop=reminder.workshop, reason="The teacher is ill")
    page = Client().get(path).content.decode()
    assert f'<p id="called-off">{said}</p>' in page and 'id="confirm"' in page


@pytest.mark.parametrize(
    ("language", "heading"),
    [("en", "This link does not work"), ("de", "Dieser Link funktioniert nicht"),
     ("fr", "Ce lien ne fonctionne pas")],
)  # fmt: skip
def test_a_link_that_names_no_reminder_answers_in_the_browsers_language(language, heading):
    """A cut-short link names no reminder, so no attendee's language: the browser's it is."""
    page = Client(HTTP_ACCEPT_LANGUAGE=f"{language},en;q=0.5").get("/attend/1.cut-short/")
    assert page.status_code == 404
    assert f'<html lang="{language}">' in page.content.decode()
    assert f"<h1>{heading}</h1>" in page.content.decode()


@pytest.mark.parametrize(
    ("language", "title"),
    [("en", "This link does not work – Workshop reminders"),
     ("de", "Dieser Link funktioniert nicht – Workshop-Erinnerungen")],
)  # fmt: skip
def test_a_link_that_does_not_work_says_so_in_the_pages_title(language, title):
    """The title is what a screen reader announces first, and what names the tab."""
    page = Client(HTTP_ACCEPT_LANGUAGE=language).get("/attend/1.cut-short/")
    assert f"<title>{title}</title>" in page.content.decode()


@pytest.mark.parametrize(
    "path", ["/attend/", "/unsubscribe/", "/attend/1.cut/short/", "/unsubscribe/1.x/y/"]
)
def test_a_link_no_route_matches_says_so_as_a_bad_token_does(path):
    """A link cut right after /attend/, or with a slash of its own, matches no URL pattern:
    the attendee meets the same page in their browser's language, not Django's English 404."""
    page = Client(HTTP_ACCEPT_LANGUAGE="de").get(path)
    assert page.status_code == 404
    assert "<h1>Dieser Link funktioniert nicht</h1>" in page.content.decode()
    assert b'name="viewport"' in page.content


@pytest.mark.parametrize("path", ["/attend/", "/unsubscribe/1.x/y/", "/attend/1.cut-short/"])
def test_a_page_in_the_browsers_language_is_kept_by_no_cache(path):
    """A shared cache keeping a 404 it was given no rule for (Fastly keeps one an hour)
    served the first browser's language to every later one: the pages no route matches had
    no Cache-Control, and none said it varies by Accept-Language."""
    pages = [Client(HTTP_ACCEPT_LANGUAGE=language).get(path) for language in ("de", "fr")]
    assert [page.status_code for page in pages] == [404, 404]
    assert [("no-store" in page.get("Cache-Control", ""), page.get("Vary")) for page in pages] == [
        (True, "Accept-Language"),
        (True, "Accept-Language"),
    ]


def test_a_404_outside_the_attendees_links_is_djangos_own():
    page = Client(HTTP_ACCEPT_LANGUAGE="de").get("/attendance/")
    assert page.status_code == 404 and b"<h1>Not Found</h1>" in page.content


def test_the_icon_every_browser_asks_for_is_no_logged_404(caplog):
    """Each page an attendee or staff member opens makes the browser ask for /favicon.ico."""
    with caplog.at_level("WARNING", logger="django.request"):
        answer = Client().get("/favicon.ico")
    assert answer.status_code == 204 and answer.content == b""
    assert answer["Cache-Control"] == "public, max-age=604800"
    assert not caplog.records


@pytest.mark.parametrize(
    ("language", "heading"),
    [("en", "Something went wrong on our side"), ("de", "Bei uns ist etwas schiefgelaufen"),
     ("fr", "Un problème est survenu de notre côté")],
)  # fmt: skip
@pytest.mark.parametrize("path", ["/attend/1.x/", "/unsubscribe/1.x/"])
def test_a_failure_on_our_side_says_so_in_the_browsers_language(
    monkeypatch, path, language, heading
):
    """A 500 under an attendee's link is a short page of its own, not Django's English one."""

    def broken(*args, **kwargs):
        raise RuntimeError("the database is away")

    monkeypatch.setattr(attendance, "reminder_for_link", broken)
    client = Client(raise_request_exception=False, HTTP_ACCEPT_LANGUAGE=language)
    page = client.get(path)
    assert page.status_code == 500
    assert "no-store" in page["Cache-Control"] and page["Vary"] == "Accept-Language"
    html = page.content.decode()
    assert f'<html lang="{language}">' in html and 'name="viewport"' in html
    assert f"<title>{heading} – " in html and f"<h1>{heading}</h1>" in html


def test_a_failure_outside_the_attendees_links_is_djangos_own(monkeypatch):
    monkeypatch.setattr(web_metrics, "metrics_view", lambda request: 1 / 0)
    page = Client(raise_request_exception=False).get("/metrics")
    assert page.status_code == 500 and b"<h1>Server Error (500)</h1>" in page.content


def test_one_click_unsubscribe_stops_notices_and_keeps_the_seat(
    delivered, clock, mail, notices_published
):
    """RFC 8058: the client POSTs without cookies or a CSRF token."""
    message, reminder = delivered
    url = message.header("List-Unsubscribe").strip("<>").removeprefix(PUBLIC)
    page = Client(enforce_csrf_checks=True).post(
        url, "List-Unsubscribe=One-Click", content_type="application/x-www-form-urlencoded"
    )
    assert page.status_code == 200
    assert Reminder.objects.get(pk=reminder.pk).unsubscribed_at is not None
    assert Enrollment.objects.get(pk=reminder.enrollment_id).status == "active"
    before = len(mail.received())
    workshop_update(workshop=reminder.workshop, location="Room 9")
    pipeline.scan(clock=clock)
    pipeline.scan(clock=clock)
    for batch in list(notices_published):
        deliver_notices(batch, clock=clock)
    # The other attendee hears of the move; the one who unsubscribed does not.
    other = Reminder.objects.exclude(pk=reminder.pk).get().attendee.email
    assert [list(m.rcpt_tos) for m in mail.received()[before:]] == [[other]]
    assert all(reminder.attendee.email not in m.rcpt_tos for m in mail.received()[before:])
    assert not Notice.objects.filter(reminder=reminder).exists()


def test_the_reminders_page_shows_when_its_attendee_unsubscribed(delivered, admin_client, settings):
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    _, reminder = delivered
    Client().post(f"/unsubscribe/{unsubscribe_token(reminder.pk)}/")
    page = admin_client.get(f"/admin/reminders/reminder/{reminder.pk}/change/").content.decode()
    assert "Unsubscribed at" in page and "UTC" in page


def test_a_change_notice_carries_the_same_links(delivered, clock, notices_published):
    from reminders.content import notice_envelope

    _, reminder = delivered
    workshop_update(workshop=reminder.workshop, location="Room 9")
    pipeline.scan(clock=clock)
    pipeline.scan(clock=clock)
    notice = Notice.objects.select_related("attendee", "workshop", "revision", "reminder").get(
        reminder=reminder
    )
    envelope = notice_envelope(notice=notice)
    url = f"{PUBLIC}/attend/{attendance_token(reminder.pk)}/"
    assert envelope.payload["attendance_url"] == url and url in envelope.text_body
    assert f'<a href="{url}"' in envelope.html_body  # as in a reminder's HTML
    assert envelope.unsubscribe_url == f"{PUBLIC}/unsubscribe/{unsubscribe_token(reminder.pk)}/"


def test_operations_lists_every_field_of_the_http_bodys_payload(
    delivered, clock, notices_published
):
    """docs/operations.md's table of the http channel's body names every payload field a
    reminder or a change notice carries (it named seven of fourteen)."""
    from pathlib import Path

    from reminders.content import notice_envelope

    _, reminder = delivered
    workshop_update(
        workshop=reminder.workshop, location="Room 9", join_url="https://meet.example/k",
        contact_email="organiser@example.com",
    )  # fmt: skip
    pipeline.scan(clock=clock)
    pipeline.scan(clock=clock)
    related = ("attendee", "workshop", "revision", "reminder")
    notice = Notice.objects.select_related(*related).get(reminder=reminder)
    reminder = Reminder.objects.select_related("attendee", "workshop").get(pk=reminder.pk)
    carried = {
        *reminder_envelope(reminder=reminder).payload,
        *notice_envelope(notice=notice).payload,
    }
    operations = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
    [row] = [line for line in operations.read_text().splitlines() if line.startswith("| `payload`")]
    assert set(re.findall(r"`(\w+)`", row.split("|")[3])) == carried


def test_a_notice_in_flight_when_its_attendee_unsubscribes_is_not_sent_on_its_retry(
    delivered, clock, mail, notices_published
):
    """The unsubscribe silences pending notices; one a worker holds then comes back pending
    after a transient failure, and its next claim judges the reminder as it is now."""
    from delivery.results import DeliveryResult, Outcome
    from reminders.services.notices import notice_claim, notice_record
    from reminders.services.record import retry_delay

    message, reminder = delivered
    workshop_update(workshop=reminder.workshop, location="Room 9")
    pipeline.scan(clock=clock)
    pipeline.scan(clock=clock)
    notice = Notice.objects.get(reminder=reminder)
    claim = notice_claim(ids=[notice.pk], channel="smtp", clock=clock)
    assert [held.pk for held in claim.notices] == [notice.pk]
    url = message.header("List-Unsubscribe").strip("<>").removeprefix(PUBLIC)
    page = Client().post(
        url, "List-Unsubscribe=One-Click", content_type="application/x-www-form-urlencoded"
    )
    assert page.status_code == 200
    refused = DeliveryResult(
        reminder_id=notice.pk, key=notice.key, outcome=Outcome.TRANSIENT, message_id=None,
        error="421 try later", attempts=1, provider_reached=True, maybe_delivered=False,
    )  # fmt: skip
    notice_record(claim=claim, results=[refused], clock=clock)
    clock.advance(retry_delay(1).total_seconds() + 1)
    before = len(mail.received())
    notices_published.clear()
    pipeline.scan(clock=clock)
    for batch in list(notices_published):
        deliver_notices(batch, clock=clock)
    assert all(reminder.attendee.email not in m.rcpt_tos for m in mail.received()[before:])
    notice.refresh_from_db()
    assert (notice.status, notice.status_reason) == ("silenced", "the attendee unsubscribed")


def test_an_erased_attendees_links_reveal_nothing_and_change_nothing(delivered, admin_user):
    """After erasure nothing ties the link to the workshop the person was enrolled in."""
    from reminders.services.erasure import attendees_erase
    from workshops.models import Attendee

    message, reminder = delivered
    attendees_erase(
        attendees=Attendee.objects.filter(pk=reminder.attendee_id), reason="asked", actor=admin_user
    )
    title = reminder.workshop.title.encode()
    unsubscribe = message.header("List-Unsubscribe").strip("<>").removeprefix(PUBLIC)
    for path in (_link(message, "attend").removeprefix(PUBLIC), unsubscribe):
        for method in (Client().get, Client().post):
            page = method(path)
            assert page.status_code == 404 and b"This link does not work" in page.content
            assert title not in page.content
    assert Reminder.objects.get(pk=reminder.pk).unsubscribed_at is None


def test_a_link_checkers_head_answers_as_the_page_does_and_changes_nothing(delivered, caplog):
    """Mail scanners and link checkers ask HEAD before (or instead of) GET: it got 405, which
    reads as a broken link, and a warning in the log naming the working token."""
    message, reminder = delivered
    attend = _link(message, "attend").removeprefix(PUBLIC)
    unsubscribe = message.header("List-Unsubscribe").strip("<>").removeprefix(PUBLIC)
    with caplog.at_level("WARNING", logger="django.request"):
        answers = [Client().head(path) for path in (attend, unsubscribe) for _ in range(2)]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 200]
    assert all(
        answer.content == b"" and "no-store" in answer["Cache-Control"] for answer in answers
    )
    assert not caplog.records
    assert Enrollment.objects.get(pk=reminder.enrollment_id).status == "active"
    assert Reminder.objects.get(pk=reminder.pk).unsubscribed_at is None
    assert not StaffDecision.objects.exists()


@pytest.mark.parametrize(
    ("language", "said", "thanks"),
    [("en", "Your place is cancelled.", "Thank you for letting us know."),
     ("de", "Ihr Platz ist freigegeben.", "Danke, dass Sie uns Bescheid gegeben haben."),
     ("fr", "Votre place est libérée.", "Merci de nous avoir prévenus.")],
)  # fmt: skip
def test_a_place_staff_cancelled_is_said_cancelled_without_thanking_the_attendee(
    delivered, admin_user, language, said, thanks
):
    """The page thanked the attendee "for letting us know" of a cancel they never made: staff
    cancelled the place (unpaid, a wrong enrolment), and the link, opened or confirmed, said
    the attendee had. Only their own confirming click is thanked."""
    from reminders.services.enrollment_decisions import enrollments_cancel

    message, reminder = delivered
    reminder.attendee.language = language
    reminder.attendee.save()
    path = _link(message, "attend").removeprefix(PUBLIC)
    other = Reminder.objects.exclude(pk=reminder.pk).get()
    enrollments_cancel(
        enrollments=Enrollment.objects.filter(pk=reminder.enrollment_id),
        reason="not paid",
        actor=admin_user,
    )
    pages = [Client().get(path), Client().post(path)]
    assert [page.status_code for page in pages] == [200, 200]
    assert [(said in page.content.decode(), thanks in page.content.decode()) for page in pages] == [
        (True, False),
        (True, False),
    ]
    assert StaffDecision.objects.filter(actor=None).count() == 0
    # The attendee's own click is thanked.
    other.attendee.language = language
    other.attendee.save()
    own = Client().post(f"/attend/{attendance_token(other.pk)}/").content.decode()
    assert f'<p id="done">{said} {thanks}</p>' in own


@pytest.mark.parametrize(
    ("language", "asked", "done", "kept"),
    [("en", "Stop messages about this workshop?",
      "You will get no more messages about this workshop.", "Your place is kept."),
     ("de", "Keine Nachrichten mehr zu diesem Workshop?",
      "Sie erhalten keine Nachrichten mehr zu diesem Workshop.", "Ihr Platz bleibt"),
     ("fr", "Ne plus recevoir de messages sur cet atelier\N{NO-BREAK SPACE}?",
      "Vous ne recevrez plus de messages sur cet atelier.", "Votre place est")],
)  # fmt: skip
def test_the_unsubscribe_page_of_a_cancelled_place_does_not_say_it_is_kept(
    delivered, language, asked, done, kept
):
    """The cancellation notice (and every earlier message) carries the one-click unsubscribe:
    opened after the attendee cancelled their place, its page said "Your place is kept"."""
    message, reminder = delivered
    reminder.attendee.language = language
    reminder.attendee.save()
    assert Client().post(_link(message, "attend").removeprefix(PUBLIC)).status_code == 200
    path = message.header("List-Unsubscribe").strip("<>").removeprefix(PUBLIC)
    pages = [Client().get(path).content.decode(), Client().post(path).content.decode()]
    assert (asked in pages[0], done in pages[1]) == (True, True)
    assert [kept in page for page in pages] == [False, False]
    assert Reminder.objects.get(pk=reminder.pk).unsubscribed_at is not None


def test_a_click_behind_a_held_lock_is_asked_to_try_again_not_sent_back_to_the_question(
    delivered, settings
):
    """A worker or staff holding the row past the lock timeout: the staff pages' middleware
    answered the attendee's POST with a redirect to the same link (a GET: the question again,
    no word of why) and an English staff message in a new session cookie; a mail provider's
    one-click POST followed it and the unsubscribe was lost."""
    from django.db import connection

    from tests.support.races import held_rows

    settings.REMINDERS_STAFF_LOCK_TIMEOUT = 0.2
    connection.close()  # this session opens again with that timeout
    message, reminder = delivered
    reminder.attendee.language = "de"
    reminder.attendee.save()
    attend = _link(message, "attend").removeprefix(PUBLIC)
    unsubscribe = message.header("List-Unsubscribe").strip("<>").removeprefix(PUBLIC)
    answers = []
    for path, rows in (
        (attend, Enrollment.objects.filter(pk=reminder.enrollment_id)),
        (unsubscribe, Reminder.objects.filter(pk=reminder.pk)),
    ):
        with held_rows(rows) as still_held:
            page = Client().post(
                path, "List-Unsubscribe=One-Click", content_type="application/x-www-form-urlencoded"
            )
            assert still_held(), "the request waited for the lock to be released"
        said = "<h1>Bei uns ist etwas schiefgelaufen</h1>" in page.content.decode()
        answers.append((page.status_code, page.get("Retry-After"), sorted(page.cookies), said))
    assert answers == [(503, "10", [], True), (503, "10", [], True)]
    assert Enrollment.objects.get(pk=reminder.enrollment_id).status == "active"
    assert Reminder.objects.get(pk=reminder.pk).unsubscribed_at is None
    assert not StaffDecision.objects.exists()
    # Once the lock is gone, the same click does it.
    assert Client().post(attend).status_code == 200
    assert Enrollment.objects.get(pk=reminder.enrollment_id).status == "cancelled"
