"""The chaos run's verdict (bench.chaos.verdict): which counts break a channel's promise.

The run itself takes minutes (tests/chaos); this checks the judging alone, on the
counts a run hands it, so a rule dropped from the verdict fails here at once.
"""

from __future__ import annotations

import pytest

from bench.chaos import VERDICT_ROWS, verdict


def _result(**counts) -> dict:
    base = {key: 0 for key, _ in VERDICT_ROWS}
    base.update(due=300, sent=290, unknown=0)
    base.update(counts)
    return {"counts": base, "unknown_allowed": 8, "staff": ["a change"]}


def test_a_run_with_every_promise_kept_passes():
    assert verdict(_result(unknown=8)) == []


@pytest.mark.parametrize(
    "counts, broken",
    [
        ({"unknown": 9}, "unknown 9 > 8 allowed"),
        # http: an unknown that does not say it may have been sent and cannot be retried
        ({"unknown": 1, "unknown_unexplained": 1}, "unknown on http, not as maybe sent"),
        ({"status_disagrees": 1}, "arrived, but recorded missed/failed 1"),
        ({"duplicates": 1}, "duplicate emails"),
        ({"late": 1}, "late (arrived after its deadline) 1"),
    ],
)
def test_each_broken_promise_fails_the_run(counts, broken):
    assert any(line.startswith(broken) for line in verdict(_result(**counts))), broken


def test_a_count_the_run_did_not_report_fails_it():
    """A missing count is not taken as zero: a collector that lost a row cannot pass."""
    result = _result()
    del result["counts"]["unknown_unexplained"]
    assert any("unknown on http" in line for line in verdict(result))
