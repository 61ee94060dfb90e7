"""The replay and unknown-outcome actions in the admin: preview, permission, confirm, bad input."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from clock import SystemClock
from reminders.models import Reminder, StaffDecision
from tests.admin.conftest import move_later
from tests.support.plans import explained_discards, keeping

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/reminders/reminder/"
WORKSHOPS = "/admin/workshops/workshop/"


def post_action(
    client, action, ids, *, confirm=False, url=CHANGELIST, select_across=False, **extra
):
    """POST what the changelist form (or, with ``confirm``, the confirmation page) posts."""
    data = {
        "action": action,
        "_selected_action": [str(i) for i in ids],
        "select_across": "1" if select_across else "0",
        **extra,
    }
    if confirm:
        data["post"] = "yes"
    else:
        data["index"] = "0"
    return client.post(url, data, follow=confirm)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def statuses(ids) -> Counter:
    return Counter(Reminder.objects.filter(pk__in=ids).values_list("status", flat=True))


def published_ids(published) -> Counter:
    return Counter(i for batch in published for i in batch)


def test_replay_action_is_offered_only_to_users_with_the_replay_permission(
    make_reminders, login, replayer, viewer
):
    make_reminders(1, "failed")
    offered = login(replayer).get(CHANGELIST)
    hidden = login(viewer).get(CHANGELIST)
    assert "replay_selected" in offered.context["action_form"].fields["action"].choices[1]
    assert [name for name, _ in offered.context["action_form"].fields["action"].choices] == [
        "",
        "replay_selected",
    ]
    assert b"Replay selected reminders" in offered.content
    assert b"Replay selected reminders" not in hidden.content
    assert b"Decide reminders of unknown outcome" not in hidden.content


def test_confirmation_page_previews_the_outcome_and_changes_nothing(
    make_reminders, login, replayer, published, django_capture_on_commit_callbacks
):
    failed = make_reminders(3, "failed")
    sent = make_reminders(2, "sent")
    unknown = make_reminders(1, "unknown")
    cancelled = make_reminders(1, "cancelled")
    queued = make_reminders(1, "queued")
    with django_capture_on_commit_callbacks(execute=True):
        response = post_action(
            login(replayer), "replay_selected", failed + sent + unknown + cancelled + queued
        )
    assert response.status_code == 200
    assert response.templates[0].name == "admin/reminders/staff_action_confirmation.html"
    preview = response.context["preview"]
    assert (preview.selected, preview.eligible) == (8, 3)
    assert response.context["skipped_rows"] == [
        ("already sent", 2),
        ("cancelled", 1),
        ("outcome unknown (resolve it instead)", 1),
        ("already pending, queued or sending", 1),
    ]
    html = response.content.decode()
    assert 'value="Yes, replay 3 reminders"' in html
    assert "csrfmiddlewaretoken" in html
    assert statuses(failed) == {"failed": 3}
    assert published == [] and not StaffDecision.objects.exists()


def test_confirming_replays_queues_and_reports_the_counts(
    make_reminders, login, replayer, published, django_capture_on_commit_callbacks
):
    failed = make_reminders(3, "failed")
    sent = make_reminders(1, "sent")
    missed = make_reminders(1, "missed")
    with django_capture_on_commit_callbacks(execute=True):
        response = post_action(
            login(replayer), "replay_selected", failed + sent + missed, confirm=True
        )
    assert response.redirect_chain == [(CHANGELIST, 302)]
    assert messages_of(response) == [
        "Replayed 4 reminders: 4 queued for delivery. Skipped: 1 already sent."
    ]
    assert published_ids(published) == Counter(failed + missed)
    assert statuses(failed + missed) == {"queued": 4}
    assert statuses(sent) == {"sent": 1}
    audit = StaffDecision.objects.get()
    assert (audit.actor, audit.changed, audit.skipped) == (replayer, 4, {"sent": 1})


def test_double_click_on_confirm_queues_each_reminder_once(
    make_reminders, login, replayer, published, django_capture_on_commit_callbacks
):
    """D3."""
    failed = make_reminders(3, "failed")
    client = login(replayer)
    with django_capture_on_commit_callbacks(execute=True):
        post_action(client, "replay_selected", failed, confirm=True)
        second = post_action(client, "replay_selected", failed, confirm=True)
    assert messages_of(second) == [
        "Nothing was replayed. Skipped: 3 already pending, queued or sending."
    ]
    assert published_ids(published) == Counter(failed)


@pytest.mark.parametrize("confirm", [False, True])
def test_forged_replay_by_a_user_without_the_permission_gets_403_and_queues_nothing(
    make_reminders, login, viewer, published, confirm, django_capture_on_commit_callbacks
):
    failed = make_reminders(2, "failed")
    with django_capture_on_commit_callbacks(execute=True):
        response = login(viewer).post(
            CHANGELIST,
            {"action": "replay_selected", "_selected_action": failed, "post": "yes"}
            if confirm
            else {"action": "replay_selected", "_selected_action": failed, "index": "0"},
        )
    assert response.status_code == 403
    assert statuses(failed) == {"failed": 2}
    assert published == [] and not StaffDecision.objects.exists()


def test_replay_without_a_csrf_token_gets_403(
    make_reminders, login, replayer, published, django_capture_on_commit_callbacks
):
    failed = make_reminders(1, "failed")
    client = login(replayer, enforce_csrf_checks=True)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            CHANGELIST, {"action": "replay_selected", "_selected_action": failed, "post": "yes"}
        )
    assert response.status_code == 403
    assert statuses(failed) == {"failed": 1}
    assert published == []


def test_empty_selection_is_refused_with_a_message(
    make_reminders, login, replayer, published, django_capture_on_commit_callbacks
):
    make_reminders(1, "failed")
    with django_capture_on_commit_callbacks(execute=True):
        response = login(replayer).post(
            CHANGELIST, {"action": "replay_selected", "index": "0"}, follow=True
        )
    assert messages_of(response) == [
        "Items must be selected in order to perform actions on them. No items have been changed."
    ]
    assert published == [] and not StaffDecision.objects.exists()


@pytest.mark.parametrize("bad", ["abc", "-3", "1 OR 1=1", "99999999999999999999", "٣"])
def test_tampered_ids_are_refused_and_nothing_is_queued(
    make_reminders, login, replayer, published, bad, django_capture_on_commit_callbacks
):
    failed = make_reminders(2, "failed")
    with django_capture_on_commit_callbacks(execute=True):
        response = post_action(login(replayer), "replay_selected", [*failed, bad], confirm=True)
    assert response.redirect_chain == [(CHANGELIST, 302)]
    (message,) = messages_of(response)
    assert message.startswith("The selection held values that are not ids (")
    assert message.endswith("); nothing was changed. Select the items again.")
    assert statuses(failed) == {"failed": 2}
    assert published == [] and not StaffDecision.objects.exists()


def test_one_id_ticked_in_two_spellings_is_one_reminder_not_a_missing_one(
    make_reminders, login, replayer, published, django_capture_on_commit_callbacks
):
    """A hand-made POST may spell an id with a leading zero: it names the same reminder."""
    (failed,) = make_reminders(1, "failed")
    client = login(replayer)
    preview = post_action(client, "replay_selected", [failed, f"0{failed}"])
    assert preview.context["skipped_rows"] == []
    with django_capture_on_commit_callbacks(execute=True):
        done = post_action(client, "replay_selected", [failed, f"0{failed}"], confirm=True)
    assert messages_of(done) == ["Replayed 1 reminder: 1 queued for delivery."]


def test_ids_that_no_longer_exist_are_counted_and_skipped(
    make_reminders, login, replayer, published, django_capture_on_commit_callbacks
):
    failed = make_reminders(2, "failed")
    client = login(replayer)
    preview = post_action(client, "replay_selected", [*failed, 987654])
    assert ("no longer exist", 1) in preview.context["skipped_rows"]
    with django_capture_on_commit_callbacks(execute=True):
        done = post_action(client, "replay_selected", [*failed, 987654], confirm=True)
    assert messages_of(done) == [
        "Replayed 2 reminders: 2 queued for delivery. Skipped: 1 no longer exist."
    ]
    assert published_ids(published) == Counter(failed)


def test_a_replay_before_the_send_window_opens_says_the_reminders_wait_for_it(
    make_reminders, login, replayer, published, django_capture_on_commit_callbacks
):
    """The workshop moved three days later after its reminders failed: replayed now, they are
    pending, not queued, and the message says why nothing went to the broker."""
    failed = make_reminders(2, "failed")
    move_later(failed[0], timedelta(days=3))
    with django_capture_on_commit_callbacks(execute=True):
        done = post_action(login(replayer), "replay_selected", failed, confirm=True)
    assert messages_of(done) == [
        "Replayed 2 reminders: 0 queued for delivery, 2 waiting for their send window."
    ]
    assert published == [] and statuses(failed) == {"pending": 2}


def test_selection_of_nothing_replayable_offers_no_confirm_button(make_reminders, login, replayer):
    sent = make_reminders(2, "sent")
    response = post_action(login(replayer), "replay_selected", sent)
    html = response.content.decode()
    assert "Nothing in this selection can be replayed." in html
    assert 'id="confirm-staff-action"' not in html


def test_select_all_across_pages_replays_every_row_matching_the_filters(
    make_reminders, login, replayer, published, django_capture_on_commit_callbacks
):
    failed = make_reminders(5, "failed")
    other = make_reminders(3, "failed")
    sent = make_reminders(2, "sent")
    workshop_id = Reminder.objects.get(pk=failed[0]).workshop_id
    url = f"{CHANGELIST}?status__exact=failed&workshop__id__exact={workshop_id}"
    client = login(replayer)
    preview = post_action(client, "replay_selected", failed[:1], url=url, select_across=True)
    assert (preview.context["preview"].selected, preview.context["preview"].eligible) == (5, 5)
    html = preview.content.decode()
    assert 'name="select_across" value="1"' in html
    assert f'action="{url.replace("&", "&amp;")}"' in html
    with django_capture_on_commit_callbacks(execute=True):
        post_action(
            client, "replay_selected", failed[:1], url=url, select_across=True, confirm=True
        )
    assert published_ids(published) == Counter(failed)
    assert statuses(other) == {"failed": 3} and statuses(sent) == {"sent": 2}


def test_select_all_sent_as_any_true_value_is_carried_to_the_confirmation(
    make_reminders, login, replayer
):
    """Django's action form reads "yes" as select-all and previews every matching row; the
    confirmation must post the same selection back, not the one ticked row."""
    failed = make_reminders(3, "failed")
    workshop_id = Reminder.objects.get(pk=failed[0]).workshop_id
    url = f"{CHANGELIST}?status__exact=failed&workshop__id__exact={workshop_id}"
    preview = post_action(login(replayer), "replay_selected", failed[:1], url=url)
    assert preview.context["preview"].selected == 1
    data = {"action": "replay_selected", "_selected_action": [failed[0]], "index": "0"}
    preview = login(replayer).post(url, {**data, "select_across": "yes"})
    assert preview.context["preview"].selected == 3
    html = preview.content.decode()
    assert 'name="select_across" value="1"' in html
    assert "(every row matching the current filters)" in html


def _replay_request_queries(client, workshop, first: int, *, capture) -> list[str]:
    """Confirm a select-all replay of the workshop's failed reminders; return the SQL it ran."""
    url = f"{CHANGELIST}?status__exact=failed&workshop__id__exact={workshop.pk}"
    # Publishes run on commit (after the request's queries), one per batch.
    with capture(execute=True), CaptureQueriesContext(connection) as queries:
        response = client.post(
            url,
            {
                "action": "replay_selected",
                "_selected_action": [first],
                "select_across": "1",
                "post": "yes",
            },
        )
    assert response.status_code == 302
    return [query["sql"] for query in queries]


@pytest.mark.long
def test_replaying_10000_reminders_costs_the_same_queries_as_10(
    bulk_failed,
    login,
    replayer,
    published,
    settings,
    django_assert_max_num_queries,
    django_capture_on_commit_callbacks,
):
    """Set-based all the way: the selection is a subquery, never rows loaded into Python.
    (The in-request path; above REMINDERS_REPLAY_INLINE_LIMIT a worker does it.)"""
    settings.REMINDERS_REPLAY_INLINE_LIMIT = 20_000
    client = login(replayer)
    client.get(CHANGELIST)  # warm the session and the content types
    small, large = bulk_failed(10), bulk_failed(10_000)
    capture = django_capture_on_commit_callbacks
    ticked = {
        w: Reminder.objects.filter(workshop=w).values_list("pk", flat=True)[0]
        for w in (small, large)
    }
    at_10 = _replay_request_queries(client, small, ticked[small], capture=capture)
    published.clear()
    started = SystemClock().monotonic()
    with django_assert_max_num_queries(len(at_10)):
        at_10000 = _replay_request_queries(client, large, ticked[large], capture=capture)
    elapsed = SystemClock().monotonic() - started
    print(
        f"\nqueries for one replay request: {len(at_10)} at 10 reminders, "
        f"{len(at_10000)} at 10,000 ({elapsed:.2f} s, {len(published)} broker messages)"
    )
    assert len(at_10000) == len(at_10), "\n".join(at_10000)
    assert len(published) == 10_000 // settings.REMINDERS_BATCH_SIZE
    assert published_ids(published) == Counter(
        Reminder.objects.filter(workshop=large).values_list("pk", flat=True)
    )
    assert Reminder.objects.filter(workshop=large, status="queued").count() == 10_000


def test_a_replay_reads_each_selected_row_once_under_the_statistics_of_an_emptier_table(
    bulk_failed, login, replayer, published, django_capture_on_commit_callbacks
):
    """Statistics taken while the table was nearly empty (a young table, before autovacuum's
    next ANALYZE) say every filter keeps one row. A selection read as ``pk IN (subquery)`` of
    the table itself was then planned as nested loops reading the table once per row: 10,000
    failed reminders kept a replay request in PostgreSQL for minutes."""
    client = login(replayer)
    workshop = bulk_failed(300)
    first = Reminder.objects.filter(workshop=workshop).values_list("pk", flat=True)[0]
    with connection.cursor() as cursor:
        cursor.execute(
            # As ANALYZE leaves them on a table it found empty, before the rows came.
            "UPDATE pg_class SET reltuples = 0, relpages = pg_relation_size(oid) / 8192 "
            "WHERE oid = %s::regclass",
            [Reminder._meta.db_table],
        )
    statements = []
    with connection.execute_wrapper(keeping(statements)):
        _replay_request_queries(client, workshop, first, capture=django_capture_on_commit_callbacks)
    # Explained against the rows as the request found them.
    Reminder.objects.filter(workshop=workshop).update(status="failed", queued_until=None)
    discarded = explained_discards([s for s in statements if "reminders_reminder" in s[0]])
    # At most a pass over the selection per statement, never one per row.
    assert max(discarded.values()) <= 2 * 300, discarded


# --- Workshops -------------------------------------------------------------------


def test_workshop_replay_previews_and_replays_the_reminders_of_the_selected_workshops(
    make_reminders, login, replayer, viewer, published, django_capture_on_commit_callbacks
):
    failed = make_reminders(2, "failed")
    workshop = Reminder.objects.get(pk=failed[0]).workshop
    sent = make_reminders(1, "sent", workshop=workshop)
    elsewhere = make_reminders(2, "failed")
    assert b"Replay reminders for selected workshops" not in login(viewer).get(WORKSHOPS).content
    client = login(replayer)
    assert b"Replay reminders for selected workshops" in client.get(WORKSHOPS).content
    preview = post_action(client, "replay_for_selected", [workshop.pk], url=WORKSHOPS)
    assert (preview.context["preview"].selected, preview.context["preview"].eligible) == (3, 2)
    with django_capture_on_commit_callbacks(execute=True):
        done = post_action(
            client, "replay_for_selected", [workshop.pk, 424242], url=WORKSHOPS, confirm=True
        )
    assert messages_of(done) == [
        "Replayed 2 reminders: 2 queued for delivery. "
        "Skipped: 1 already sent, 1 selected workshops no longer exist."
    ]
    assert published_ids(published) == Counter(failed)
    assert statuses(elsewhere) == {"failed": 2} and statuses(sent) == {"sent": 1}


def test_forged_workshop_replay_gets_403(
    make_reminders, login, viewer, published, django_capture_on_commit_callbacks
):
    failed = make_reminders(1, "failed")
    workshop_id = Reminder.objects.get(pk=failed[0]).workshop_id
    with django_capture_on_commit_callbacks(execute=True):
        response = login(viewer).post(
            WORKSHOPS,
            {"action": "replay_for_selected", "_selected_action": [workshop_id], "post": "yes"},
        )
    assert response.status_code == 403
    assert statuses(failed) == {"failed": 1} and published == []


# --- Unknown outcomes ------------------------------------------------------------


def test_resolve_action_needs_its_own_permission(make_reminders, login, replayer, resolver):
    unknown = make_reminders(1, "unknown")
    assert b"Decide reminders of unknown outcome" in login(resolver).get(CHANGELIST).content
    assert b"Decide reminders of unknown outcome" not in login(replayer).get(CHANGELIST).content
    response = login(replayer).post(
        CHANGELIST,
        {
            "action": "resolve_unknown",
            "_selected_action": unknown,
            "post": "yes",
            "decision": "mark_sent",
            "reason": "forged",
        },
    )
    assert response.status_code == 403
    assert statuses(unknown) == {"unknown": 1}


def test_resolving_without_a_reason_shows_the_form_again_and_changes_nothing(
    make_reminders, login, resolver
):
    unknown = make_reminders(2, "unknown")
    response = post_action(
        login(resolver), "resolve_unknown", unknown, confirm=True, decision="mark_sent", reason=" "
    )
    assert response.status_code == 200
    assert response.context["form"].errors == {
        "reason": ["Give a reason: it is recorded with the decision."]
    }
    assert statuses(unknown) == {"unknown": 2}
    assert not StaffDecision.objects.exists()


def test_marking_unknown_reminders_sent_from_the_admin(make_reminders, login, resolver):
    unknown = make_reminders(2, "unknown")
    failed = make_reminders(1, "failed")
    client = login(resolver)
    preview = post_action(client, "resolve_unknown", unknown + failed)
    assert "decision" in preview.content.decode() and preview.context["preview"].eligible == 2
    done = post_action(
        client,
        "resolve_unknown",
        unknown + failed,
        confirm=True,
        decision="mark_sent",
        reason="provider log shows delivery",
    )
    assert messages_of(done) == ["Marked 2 reminders as sent. Skipped: 1 not of unknown outcome."]
    assert statuses(unknown) == {"sent": 2} and statuses(failed) == {"failed": 1}
    assert StaffDecision.objects.get().reason == "provider log shows delivery"


def test_the_resolve_confirmation_counts_what_each_decision_would_do(
    clock, make_reminders, login, resolver
):
    """Mark as sent takes every reminder of unknown outcome, one past the cutoff too; Send
    again only those still before it. The page counted for Send again alone: the late one
    showed as skipped, and Mark as sent then marked it sent."""
    late = make_reminders(1, "unknown", starts_in=timedelta(hours=1))
    on_time = make_reminders(2, "unknown")
    failed = make_reminders(1, "failed")
    clock.advance(45 * 60)
    client = login(resolver)
    page = post_action(client, "resolve_unknown", late + on_time + failed)
    preview = page.context["preview"]
    assert (preview.selected, preview.eligible) == (4, 3)
    assert page.context["effect_rows"] == [
        ("Send again: queued again (still before the deadline)", 2),
        ("Send again leaves alone: past the cutoff", 1),
    ]
    assert page.context["skipped_rows"] == [("not of unknown outcome", 1)]
    done = post_action(
        client,
        "resolve_unknown",
        late + on_time + failed,
        confirm=True,
        decision="mark_sent",
        reason="provider log shows delivery",
    )
    assert messages_of(done) == ["Marked 3 reminders as sent. Skipped: 1 not of unknown outcome."]


def test_sending_unknown_reminders_again_from_the_admin(
    make_reminders, login, resolver, published, django_capture_on_commit_callbacks
):
    unknown = make_reminders(2, "unknown")
    with django_capture_on_commit_callbacks(execute=True):
        done = post_action(
            login(resolver),
            "resolve_unknown",
            unknown,
            confirm=True,
            decision="send_again",
            reason="provider has no record of it",
        )
    assert messages_of(done) == ["Sending 2 reminders again: 2 queued."]
    assert published_ids(published) == Counter(unknown)


def test_a_decision_confirmed_twice_says_the_second_time_that_no_reminder_was_changed(
    make_reminders, login, resolver, published
):
    """A double click on "Record the decision" (or a colleague deciding first): the second
    post finds nothing of unknown outcome and says so, as a warning."""
    unknown = make_reminders(2, "unknown")
    client = login(resolver)
    decide = {"decision": "mark_sent", "reason": "provider log shows delivery"}
    first = post_action(client, "resolve_unknown", unknown, confirm=True, **decide)
    second = post_action(client, "resolve_unknown", unknown, confirm=True, **decide)
    assert messages_of(first) == ["Marked 2 reminders as sent."]
    [message] = second.context["messages"]
    assert (str(message), message.level_tag) == (
        "No reminder was changed. Skipped: 2 not of unknown outcome.",
        "warning",
    )
    assert statuses(unknown) == {"sent": 2} and published == []


def test_audit_records_are_listed_read_only(make_reminders, login, replayer, make_staff):
    failed = make_reminders(1, "failed")
    post_action(login(replayer), "replay_selected", failed, confirm=True)
    auditor = make_staff("reminders.view_staffdecision")
    client = login(auditor)
    listing = client.get(reverse("admin:reminders_staffdecision_changelist"))
    assert listing.status_code == 200 and b"replayer" in listing.content
    audit = StaffDecision.objects.get()
    assert (
        client.post(reverse("admin:reminders_staffdecision_change", args=[audit.pk])).status_code
        == 403
    )
    assert client.get(reverse("admin:reminders_staffdecision_add")).status_code == 403


def test_the_edited_text_is_an_explicit_choice_on_the_confirmation_and_goes_into_the_audit(
    make_reminders, login, replayer, published, django_capture_on_commit_callbacks, clock
):
    from reminders.models import MessageText

    failed = make_reminders(2, "failed")
    frozen = MessageText.objects.create(
        digest="d" * 64, language="en", subject_source="built_in", subject="Old",
        intro_source="built_in", intro="Old words.",
    )  # fmt: skip
    Reminder.objects.filter(pk__in=failed).update(text=frozen)
    client = login(replayer)
    page = post_action(client, "replay_selected", failed[:1]).content.decode()
    assert 'name="use_edited_text"' in page and "Use the edited text" in page
    with django_capture_on_commit_callbacks(execute=True):
        post_action(client, "replay_selected", failed[:1], confirm=True)
        post_action(client, "replay_selected", failed[1:], confirm=True, use_edited_text="on")
    kept, edited = (Reminder.objects.get(pk=pk) for pk in failed)
    assert (kept.text_id, edited.text_id) == (frozen.pk, None)
    audits = StaffDecision.objects.order_by("pk")
    assert [(a.reminder_ids, a.use_edited_text) for a in audits] == [
        ([failed[0]], False),
        ([failed[1]], True),
    ]
