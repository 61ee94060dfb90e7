"""DeliveryLimits rejects nonsense with messages that name the fix."""

from __future__ import annotations

import math
import re

import pytest

from delivery import DeliveryLimits


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"concurrency": 0}, "DeliveryLimits.concurrency must be an integer >= 1 (got 0)"),
        ({"concurrency": True}, "DeliveryLimits.concurrency must be an integer >= 1 (got True)"),
        (
            {"max_attempts": 0},
            "DeliveryLimits.max_attempts must be an integer >= 1 (got 0); pass 1",
        ),
        ({"call_timeout": 0}, "DeliveryLimits.call_timeout must be a finite number of seconds > 0"),
        ({"call_timeout": math.inf}, "DeliveryLimits.call_timeout must be a finite number"),
        (
            {"backoff_base": -1},
            "DeliveryLimits.backoff_base must be a finite number of seconds >= 0",
        ),
        ({"backoff_base": 5, "backoff_max": 1}, "backoff_max (1) is below backoff_base (5)"),
        ({"jitter": 1.5}, "DeliveryLimits.jitter must be a fraction between 0 and 1"),
        ({"budget": 0}, "DeliveryLimits.budget must be a finite number of seconds > 0"),
    ],
)
def test_invalid_policy_values_are_refused_with_a_clear_error(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        DeliveryLimits(**fields)


def test_the_defaults_have_a_timeout_and_a_budget():
    policy = DeliveryLimits()

    assert policy.call_timeout == 10.0
    assert policy.budget == 240.0
