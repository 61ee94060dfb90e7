"""'Send me a test' (issue 12, item 4): the preview goes to the staff member's own address
through the configured channel, audited, and no reminder row or sent marker is touched."""

from __future__ import annotations

import re

import pytest

from loopback.http_sink import HttpSink
from reminders.models import DeliveryAttempt, Reminder, StaffDecision
from reminders.services.testsend import NOT_QUEUED, UNQUEUED, reminder_send_test_request
from reminders.worker.testsend import reminder_send_test_run
from workshops.services import attendee_get_or_create, enrollment_create

pytestmark = pytest.mark.django_db(transaction=True)

SEND = "reminders.send_test_reminder"
VIEW = ("workshops.view_workshop", "reminders.view_reminder")


@pytest.fixture
def enrolled(make_workshop):
    workshop = make_workshop(title="Kiln basics")
    attendee, _ = attendee_get_or_create(email="anna@example.com", name="Anna")
    enrollment_create(attendee=attendee, workshop=workshop)
    return workshop, attendee


def _rows():
    return list(
        Reminder.objects.order_by("pk").values_list("pk", "status", "attempts", "updated_at")
    )


def _tester(make_staff, email="ops@example.org"):
    user = make_staff(*VIEW, SEND, username="tester")
    user.email = email
    user.save()
    return user


def test_a_test_goes_to_the_staff_member_over_smtp_and_touches_no_reminder(
    enrolled, make_staff, settings, smtp_sink, live_clock
):
    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    workshop, attendee = enrolled
    before = _rows()
    queued: list[int] = []
    decision = reminder_send_test_request(
        workshop=workshop, attendee=attendee, actor=_tester(make_staff), publish_task=queued.append
    )
    assert queued == [decision.pk]
    assert decision.state == "running"

    done = reminder_send_test_run(decision_id=decision.pk)
    assert done.state == "done" and done.changed == 1
    assert done.outcome.startswith("sent to ops@example.org as <")
    (message,) = smtp_sink.received()
    assert message.rcpt_tos == ("ops@example.org",)
    assert message.subject.startswith("[Test] Reminder: Kiln basics starts")
    assert "Hello Anna," in message.parsed().get_body(("plain",)).get_content()
    assert _rows() == before
    assert not DeliveryAttempt.objects.exists()
    # The task delivered again sends nothing more.
    assert reminder_send_test_run(decision_id=decision.pk).outcome == done.outcome
    assert len(smtp_sink.received()) == 1


@pytest.mark.parametrize("change", ["workshop cancelled", "enrollment cancelled"])
def test_a_test_asked_for_before_a_cancel_is_not_sent_after_it(
    change, enrolled, make_staff, settings, smtp_sink, live_clock
):
    from workshops.models import Enrollment
    from workshops.services import enrollment_cancel, workshop_cancel

    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    workshop, attendee = enrolled
    decision = reminder_send_test_request(
        workshop=workshop, attendee=attendee, actor=_tester(make_staff), publish_task=[].append
    )
    if change == "workshop cancelled":
        workshop_cancel(workshop=workshop)
    else:
        enrollment_cancel(enrollment=Enrollment.objects.get(workshop=workshop, attendee=attendee))
    done = reminder_send_test_run(decision_id=decision.pk)
    assert done.state == "done" and done.changed == 0
    expected = "the workshop is cancelled" if change == "workshop cancelled" else "no longer"
    assert done.outcome.startswith("not sent: ") and expected in done.outcome
    assert smtp_sink.received() == []


def test_a_test_goes_through_the_http_channel_under_a_key_of_its_own(
    enrolled, make_staff, settings, live_clock
):
    workshop, attendee = enrolled
    with HttpSink(secret="s") as sink:
        settings.REMINDERS_CHANNEL = "http"
        settings.REMINDERS_HTTP_URL, settings.REMINDERS_HTTP_SECRET = sink.url, "s"
        decision = reminder_send_test_request(
            workshop=workshop, attendee=attendee, actor=_tester(make_staff), publish_task=id
        )
        done = reminder_send_test_run(decision_id=decision.pk)
        (request,) = sink.requests
    assert done.outcome.startswith("sent to ops@example.org")
    real_key = Reminder.objects.get().key
    assert request.key == f"test-{decision.pk}" != real_key
    assert request.json()["recipient"]["email"] == "ops@example.org"
    assert request.json()["payload"]["test"] == "true"


def test_a_staff_member_without_an_address_is_told_what_to_do_and_nothing_is_recorded(
    enrolled, make_staff
):
    workshop, attendee = enrolled
    with pytest.raises(Exception, match="set it on your user in the admin"):
        reminder_send_test_request(
            workshop=workshop, attendee=attendee, actor=_tester(make_staff, email=""),
            publish_task=id,
        )  # fmt: skip
    assert not StaffDecision.objects.exists()


def test_the_admin_button_needs_its_own_permission(client, enrolled, make_staff):
    workshop, attendee = enrolled
    viewer = make_staff(*VIEW, username="viewer")
    viewer.email = "v@example.org"
    viewer.save()
    client.force_login(viewer)
    url = f"/admin/workshops/workshop/{workshop.pk}/preview/"
    assert "Send me a test" not in client.get(url).content.decode()
    assert client.post(url, {"attendee": attendee.pk}).status_code == 403
    assert not StaffDecision.objects.exists()


def test_the_admin_button_queues_the_test_and_says_where_its_outcome_is(
    client, enrolled, make_staff, monkeypatch
):
    workshop, attendee = enrolled
    published: list[int] = []
    monkeypatch.setattr("reminders.queue.publish_test", published.append)
    client.force_login(_tester(make_staff))
    url = f"/admin/workshops/workshop/{workshop.pk}/preview/"
    assert "Send me a test" in client.get(url).content.decode()
    answer = client.post(url, {"attendee": attendee.pk}, follow=True)
    decision = StaffDecision.objects.get()
    assert published == [decision.pk]
    assert (decision.action, decision.actor_name) == ("send_test", "tester")
    assert "is on its way to ops@example.org" in answer.content.decode()
    # The reminder's own timeline does not list the test.
    from reminders.trace import reminder_lookup, trace_lines

    assert not any(
        "send_test" in line for line in trace_lines(reminder_lookup(str(Reminder.objects.get().pk)))
    )


@pytest.mark.parametrize(
    ("problem", "error"),
    [
        (
            "no staff address",
            "Your user's email address cannot receive a test (it is empty); set it on your "
            "user in the admin (Users) and try again.",
        ),
        (
            "enrollment cancelled",
            "That attendee is not enrolled in this workshop; choose one from the list.",
        ),
    ],
)
def test_a_test_that_cannot_be_asked_for_says_why_on_the_preview_and_queues_nothing(
    client, enrolled, make_staff, monkeypatch, problem, error
):
    from workshops.models import Enrollment
    from workshops.services import enrollment_cancel

    workshop, attendee = enrolled
    published: list[int] = []
    monkeypatch.setattr("reminders.queue.publish_test", published.append)
    if problem == "enrollment cancelled":
        enrollment_cancel(enrollment=Enrollment.objects.get(workshop=workshop, attendee=attendee))
    client.force_login(
        _tester(make_staff, **({"email": ""} if problem == "no staff address" else {}))
    )
    url = f"/admin/workshops/workshop/{workshop.pk}/preview/"

    answer = client.post(url, {"attendee": attendee.pk}, follow=True)

    assert answer.redirect_chain == [(f"{url}?attendee={attendee.pk}", 302)]
    [message] = answer.context["messages"]
    assert (str(message), message.level_tag) == (error, "error")
    assert (published, StaffDecision.objects.exists()) == ([], False)


@pytest.mark.parametrize("malformed", ["7", True, 0, -1, None, [1]])
def test_the_task_refuses_a_malformed_decision_id_and_sends_nothing(malformed, smtp_sink):
    from reminders.tasks import send_test

    assert send_test(malformed) == {"rejected": 1}
    assert smtp_sink.received() == []


@pytest.mark.parametrize("wanted", ["²", "9" * 5000, ""])
def test_an_attendee_that_is_not_an_id_is_asked_for_again_and_nothing_is_queued(
    client, enrolled, make_staff, monkeypatch, wanted
):
    workshop, _ = enrolled
    published: list[int] = []
    monkeypatch.setattr("reminders.queue.publish_test", published.append)
    client.force_login(_tester(make_staff))
    url = f"/admin/workshops/workshop/{workshop.pk}/preview/"

    answer = client.post(url, {"attendee": wanted}, follow=True)

    assert answer.status_code == 200
    assert "Choose an attendee to test." in answer.content.decode()
    assert (published, StaffDecision.objects.exists()) == ([], False)


@pytest.mark.parametrize("identifier", ["²", "9" * 5000])
def test_the_trace_lookup_of_something_that_is_not_an_id_finds_nothing(identifier, db):
    from reminders.trace import reminder_lookup

    with pytest.raises(Reminder.DoesNotExist):
        reminder_lookup(identifier)


def test_a_double_click_on_send_me_a_test_sends_one_test(client, enrolled, make_staff, monkeypatch):
    """Issue 34, item 13: the same form posted twice (a double click, a resubmission) records
    and queues one test; the second answer points at the same decision."""
    workshop, attendee = enrolled
    published: list[int] = []
    monkeypatch.setattr("reminders.queue.publish_test", published.append)
    client.force_login(_tester(make_staff))
    url = f"/admin/workshops/workshop/{workshop.pk}/preview/"
    page = client.get(url).content.decode()
    [token] = re.findall(r'name="request_token" value="([0-9a-f]{32})"', page)

    answers = [
        client.post(url, {"attendee": attendee.pk, "request_token": token}, follow=True)
        for _ in range(2)
    ]

    decision = StaffDecision.objects.get()
    assert published == [decision.pk]
    for answer in answers:
        assert "is on its way to ops@example.org" in answer.content.decode()
    # A fresh page is a fresh request: a second test on purpose still goes.
    [again] = re.findall(
        r'name="request_token" value="([0-9a-f]{32})"', client.get(url).content.decode()
    )
    assert again != token
    client.post(url, {"attendee": attendee.pk, "request_token": again})
    assert StaffDecision.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_two_requests_with_one_token_at_once_record_one_test(enrolled, make_staff):
    """The two posts of a double click can run at once: the unique token decides. Raced
    five times (with the IntegrityError branch planted out, most rounds fail)."""
    import threading

    from django.db import connections

    workshop, attendee = enrolled
    actor = _tester(make_staff)
    published: list[int] = []
    errors: list[BaseException] = []

    def post(token: str, start: threading.Barrier, decisions: list) -> None:
        try:
            start.wait(10)
            decisions.append(
                reminder_send_test_request(
                    workshop=workshop,
                    attendee=attendee,
                    actor=actor,
                    publish_task=published.append,
                    request_token=token,
                )  # fmt: skip
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    for round_ in range(5):
        start, decisions = threading.Barrier(2), []
        threads = [
            threading.Thread(target=post, args=(f"{round_:032x}", start, decisions))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert len(decisions) == 2 and decisions[0].pk == decisions[1].pk
    assert StaffDecision.objects.count() == 5 and len(published) == 5


def test_a_test_the_broker_refuses_says_so_and_a_fresh_form_sends_it_once_it_is_back(
    client, enrolled, make_staff, refusing_port, broker, monkeypatch
):
    """The task queue is down when staff press the button: they are told nothing was sent, the
    decision ends so (not "running" for good), and the same form posted again says the same."""
    from celery import Celery, current_app

    workshop, attendee = enrolled
    client.force_login(_tester(make_staff))
    url = f"/admin/workshops/workshop/{workshop.pk}/preview/"

    def form() -> dict:
        page = client.get(url, {"attendee": attendee.pk}).content.decode()
        [token] = re.findall(r'name="request_token" value="([0-9a-f]{32})"', page)
        return {"attendee": attendee.pk, "request_token": token}

    def press(data: dict) -> tuple[str, str]:
        [message] = client.post(url, data, follow=True).context["messages"]
        return str(message), message.level_tag

    first = form()
    working = current_app._get_current_object()
    with monkeypatch.context() as patched:
        # Configured as the project's app, but for the broker's address (read from here).
        patched.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{refusing_port()}/0")
        down = Celery("down", set_as_current=False)
        down.config_from_object("django.conf:settings", namespace="CELERY")
        down.set_current()
        try:
            assert press(first) == (NOT_QUEUED, "error")
        finally:
            working.set_current()
    decision = StaffDecision.objects.get()
    assert (decision.state, decision.queued, decision.outcome) == ("done", 0, UNQUEUED)

    assert press(first) == (NOT_QUEUED, "error")  # the same form again: nothing queued
    assert StaffDecision.objects.count() == 1
    assert press(form())[1] == "success"
    assert StaffDecision.objects.filter(state="running", outcome="").count() == 1


@pytest.mark.parametrize("notice", [False, True], ids=["reminder", "notice"])
def test_a_test_carries_none_of_the_attendees_own_links(
    enrolled, make_staff, settings, smtp_sink, live_clock, notice
):
    """The staff member's mail client offers List-Unsubscribe as a button: in a test it must not
    unsubscribe the attendee, nor its "can't attend" link cancel their place."""
    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    settings.REMINDERS_PUBLIC_URL = "https://reminders.example.com"
    workshop, attendee = enrolled
    assert Reminder.objects.filter(attendee=attendee).exists()  # planned: it has its links
    decision = reminder_send_test_request(
        workshop=workshop,
        attendee=attendee,
        actor=_tester(make_staff),
        notice=notice,
        publish_task=lambda pk: None,
    )
    assert reminder_send_test_run(decision_id=decision.pk).changed == 1
    (message,) = smtp_sink.received()
    parsed = message.parsed()
    assert parsed["List-Unsubscribe"] is None
    assert "/attend/" not in parsed.get_body(("plain",)).get_content()


def test_a_test_to_a_suppressed_staff_address_is_not_sent_and_says_why(
    enrolled, make_staff, settings, smtp_sink, live_clock
):
    """The staff member's own address bounced hard (or they marked a reminder as spam): a test
    to it makes no call, as a reminder to it would not, until staff lift the suppression."""
    from reminders.models import Suppression
    from reminders.services.feedback import address_key

    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    workshop, attendee = enrolled
    now = live_clock.now()
    Suppression.objects.create(
        address_key=address_key("ops@example.org"), address="ops@example.org", cause="bounced",
        caused_at=now, created_at=now,
    )  # fmt: skip
    tester = _tester(make_staff, email="Ops@Example.org")
    outcomes = []
    for notice in (False, True):
        decision = reminder_send_test_request(
            workshop=workshop, attendee=attendee, actor=tester, publish_task=id, notice=notice
        )
        done = reminder_send_test_run(decision_id=decision.pk)
        outcomes.append((done.state, done.changed, done.outcome[:31]))
    assert outcomes == [("done", 0, "not sent: suppressed: bounced o")] * 2, outcomes
    assert smtp_sink.received() == []
