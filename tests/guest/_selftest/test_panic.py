"""Deliberately fatal guest test: a kernel panic must end the run fast with the console tail.

Not part of the guest suite; the runner's self-test runs it last, on a cluster it may destroy.
"""

from __future__ import annotations

from pathlib import Path

TESTHOOK = Path("/dev/obmm_testhook")


def test_triggers_panic() -> None:
    with TESTHOOK.open("w") as hook:
        hook.write("panic\n")
        hook.flush()


def test_never_runs() -> None:
    raise AssertionError("the guest should be dead by now")
