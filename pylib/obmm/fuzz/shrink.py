"""Delta debugging (Zeller's ddmin) of a failing operation list.

A candidate list "fails the same way" when running it from an idle node ends in a failure with
the same signature (which check, at which kind of operation).  The operations refer to regions,
files and mappings by position among the live ones, so any subset is a valid run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from obmm.fuzz.ops import Op


def suffix_first(
    ops: Sequence[Op], fails: Callable[[Sequence[Op]], bool], *, budget_s: float
) -> tuple[list[Op], int]:
    """The shortest tail (8, 32, 128, ... operations) of ``ops`` that still fails, tried
    first: a failure mostly needs only the recent state, and a short run costs little."""
    runs = 0
    deadline = time.monotonic() + budget_s
    k = 8
    while k < len(ops) and time.monotonic() < deadline:
        runs += 1
        tail = list(ops[-k:])
        if fails(tail):
            return tail, runs
        k *= 4
    return list(ops), runs


def ddmin(
    ops: Sequence[Op],
    fails: Callable[[Sequence[Op]], bool],
    *,
    budget_s: float = 120.0,
    max_runs: int = 400,
) -> tuple[list[Op], int]:
    """A 1-minimal (within the budget) sub-list of ``ops`` for which ``fails`` holds."""
    current = list(ops)
    runs = 0
    deadline = time.monotonic() + budget_s
    n = 2
    while len(current) >= 2 and runs < max_runs and time.monotonic() < deadline:
        chunk = max(1, len(current) // n)
        parts = [current[i : i + chunk] for i in range(0, len(current), chunk)]
        reduced = False
        for i in range(len(parts)):
            complement = [op for j, p in enumerate(parts) if j != i for op in p]
            runs += 1
            if complement and fails(complement):
                current = complement
                n = max(n - 1, 2)
                reduced = True
                break
            if runs >= max_runs or time.monotonic() >= deadline:
                break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), n * 2)
    return current, runs
