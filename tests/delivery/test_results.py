"""Outcomes are stored as plain strings."""

from __future__ import annotations

from delivery import Outcome


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
