"""Count events in sliding time windows (how a provider sees a rate)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["max_in_window"]


def max_in_window(times: Iterable[float], window: float = 1.0) -> int:
    """Return the largest number of ``times`` inside any half-open window of ``window`` s.

    Two events exactly ``window`` apart are in different windows.
    """
    ordered = sorted(times)
    best = 0
    first = 0
    for last, moment in enumerate(ordered):
        while moment - ordered[first] >= window:
            first += 1
        best = max(best, last - first + 1)
    return best
