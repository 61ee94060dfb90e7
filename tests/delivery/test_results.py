"""summarise() groups results; cancellation is neither success nor failure."""

from __future__ import annotations

import pytest

from delivery import DeliveryResult, Outcome, summarise


def result(reminder_id: int, outcome: Outcome) -> DeliveryResult:
    return DeliveryResult(
        reminder_id=reminder_id,
        key=f"k{reminder_id}",
        outcome=outcome,
        message_id="m" if outcome is Outcome.SENT else None,
        error="" if outcome is Outcome.SENT else "why",
        attempts=1,
        provider_reached=True,
        maybe_delivered=outcome is Outcome.SENT,
    )


def test_results_are_grouped_into_successes_failures_and_unfinished():
    results = [result(i, outcome) for i, outcome in enumerate(Outcome, start=1)]

    summary = summarise(results)

    assert list(summary.successes) == [1]
    assert sorted(summary.failures) == [2, 3, 4, 6]
    assert list(summary.unfinished) == [5, 7]
    assert summary.total == 7
    assert summary.counts[Outcome.CANCELLED] == 1
    assert summary.failures[6].outcome is Outcome.EXPIRED


def test_two_results_for_one_reminder_are_refused():
    with pytest.raises(ValueError, match="reminder 1 has two results"):
        summarise([result(1, Outcome.SENT), result(1, Outcome.PERMANENT)])


def test_outcomes_are_plain_strings_for_the_database():
    assert [str(o) for o in Outcome] == [
        "sent",
        "transient",
        "permanent",
        "timed_out",
        "cancelled",
        "expired",
        "withdrawn",
    ]
