"""Item 7: every time bound around a batch nests inside the next, for every valid setting."""

import itertools

import pytest

from config.timing import MARGIN_SECONDS, TimeBounds

# The whole range config/settings.py accepts, ends and points between.
BUDGETS = [5, 6, 30, 120, 600, 3599, 3600]
CALL_TIMEOUTS = [0.1, 0.5, 1, 9.9, 10, 15, 60, 299.9, 300]


@pytest.mark.parametrize(
    ("budget", "call_timeout"), list(itertools.product(BUDGETS, CALL_TIMEOUTS))
)
def test_each_bound_fits_inside_the_next_with_a_margin(budget, call_timeout):
    bounds = TimeBounds.derive(budget=budget, call_timeout=call_timeout)
    for inner, inner_seconds, outer, outer_seconds in bounds.nesting():
        assert inner_seconds + MARGIN_SECONDS <= outer_seconds or (
            inner.endswith("stop_grace") and inner_seconds <= outer_seconds
        ), f"{inner} ({inner_seconds}) does not fit in {outer} ({outer_seconds})"
    # The pieces a stopped batch still runs: the drain lets a whole call finish.
    assert bounds.drain >= call_timeout
    assert bounds.budget + bounds.drain + bounds.close + bounds.record_retry <= bounds.work
    assert bounds.soft_limit + bounds.drain + bounds.close + bounds.record_retry < bounds.hard_limit


def test_a_visibility_timeout_shorter_than_the_lease_is_refused_with_the_least_value():
    lease = TimeBounds.derive(budget=120, call_timeout=15).lease
    with pytest.raises(ValueError, match=rf"at least {lease + MARGIN_SECONDS:g} seconds"):
        TimeBounds.derive(budget=120, call_timeout=15, visibility_timeout=lease)
    ok = TimeBounds.derive(budget=120, call_timeout=15, visibility_timeout=lease + MARGIN_SECONDS)
    assert ok.visibility_timeout == lease + MARGIN_SECONDS


def test_the_defaults_as_documented():
    bounds = TimeBounds.derive(budget=120, call_timeout=15)
    assert (bounds.work, bounds.soft_limit, bounds.hard_limit, bounds.lease) == (
        185.0,
        195.0,
        260.0,
        320.0,
    )
    assert bounds.visibility_timeout == 440.0
