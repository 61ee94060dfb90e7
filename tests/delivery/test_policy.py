"""DeliveryPolicy rejects nonsense with messages that name the fix."""

from __future__ import annotations

import math
import re

import pytest

from delivery import DeliveryPolicy


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"concurrency": 0}, "DeliveryPolicy.concurrency must be an integer >= 1 (got 0)"),
        ({"concurrency": True}, "DeliveryPolicy.concurrency must be an integer >= 1 (got True)"),
        (
            {"max_attempts": 0},
            "DeliveryPolicy.max_attempts must be an integer >= 1 (got 0); pass 1",
        ),
        ({"call_timeout": 0}, "DeliveryPolicy.call_timeout must be a finite number of seconds > 0"),
        ({"call_timeout": math.inf}, "DeliveryPolicy.call_timeout must be a finite number"),
        (
            {"backoff_base": -1},
            "DeliveryPolicy.backoff_base must be a finite number of seconds >= 0",
        ),
        ({"backoff_base": 5, "backoff_max": 1}, "backoff_max (1) is below backoff_base (5)"),
        ({"jitter": 1.5}, "DeliveryPolicy.jitter must be a fraction between 0 and 1"),
        ({"budget": 0}, "DeliveryPolicy.budget must be a finite number of seconds > 0"),
    ],
)
def test_invalid_policy_values_are_refused_with_a_clear_error(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        DeliveryPolicy(**fields)


def test_the_defaults_have_a_timeout_and_a_budget():
    policy = DeliveryPolicy()

    assert policy.call_timeout == 10.0
    assert policy.budget == 240.0
