"""The staff decision list says in words why each decision skipped what it skipped."""

import re
from pathlib import Path

import pytest

import reminders.services
from reminders.admin.decision import DECISION_SKIPS
from reminders.selectors import SKIP_REASONS


def _recorded_skip_keys() -> set[str]:
    """Every skip key a service records: the replay's reasons and each ``skipped_as`` key."""
    keys = set(SKIP_REASONS)
    for module in Path(reminders.services.__file__).parent.glob("*.py"):
        keys |= set(re.findall(r'skipped_as\(\s*"(\w+)"', module.read_text()))
    return keys


def test_every_skip_a_service_records_has_words_in_the_decision_list():
    keys = _recorded_skip_keys()
    assert {"raced", "already_cancelled", "already_erased", "already_lifted"} <= keys
    assert sorted(keys - set(DECISION_SKIPS)) == []


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["action__exact=%00", "actor_name=%00", "reason__startswith=%00"])
def test_a_nul_in_a_filter_value_is_an_invalid_filter_not_a_500(admin_client, query):
    """PostgreSQL refuses NUL in text: the list answers as to any filter it cannot apply."""
    changelist = "/admin/reminders/staffdecision/"
    response = admin_client.get(f"{changelist}?{query}")
    assert (response.status_code, response["Location"]) == (302, f"{changelist}?e=1")


@pytest.mark.django_db
def test_a_decision_on_a_thousand_reminders_links_to_them_in_a_request_web_takes(
    admin_client, admin_user, make_workshop, enrol
):
    """web is gunicorn (Procfile), whose request line is at most ``limit_request_line`` bytes
    (config/gunicorn.py keeps the default): past it gunicorn answers 414 before Django. A
    decision's links name the decision, not its every id, so they open at any size."""
    from datetime import timedelta
    from html import unescape

    from gunicorn.config import LimitRequestLine

    from reminders.models import StaffDecision
    from reminders.services.workshop_decisions import workshops_cancel
    from workshops.models import Workshop

    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, 1000)
    workshops_cancel(
        workshops=Workshop.objects.filter(pk=workshop.pk), reason="storm", actor=admin_user
    )
    decision = StaffDecision.objects.get()
    assert len(decision.reminder_ids) == 1000
    page = admin_client.get(f"/admin/reminders/staffdecision/{decision.pk}/change/")
    links = {
        unescape(href).split("?")[0]: unescape(href)
        for href in re.findall(r'href="(/admin/(?:reminders|workshops)/\w+/\?[^"]*)"', page.text)
    }
    reminders, workshops = links["/admin/reminders/reminder/"], links["/admin/workshops/workshop/"]
    assert [len(f"GET {link} HTTP/1.1") <= LimitRequestLine.default for link in links.values()] == [
        True,
        True,
    ]
    assert admin_client.get(reminders).context["cl"].result_count == 1000
    listed = admin_client.get(workshops).context["cl"]
    assert [w.pk for w in listed.result_list] == [workshop.pk]
    assert admin_client.get("/admin/reminders/reminder/?decision=x")["Location"].endswith("?e=1")
    nobody = admin_client.get("/admin/workshops/attendee/?decision=999999")
    assert nobody.context["cl"].result_count == 0
