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
