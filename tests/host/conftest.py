"""Host suite: no VM, no /dev/obmm. Puts tests/host on sys.path for its helper modules."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from obmm.tools import interrupts

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _no_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    # Host tests boot fake QEMUs: never read or write the user's cluster snapshots.
    monkeypatch.setenv("OBMM_TESTBED_SNAPSHOT", "off")


@pytest.fixture(autouse=True)
def _signals_act_again() -> Iterator[None]:
    # A test may start an unwinding (SIGTERM, KeyboardInterrupt), which holds later signals for
    # the rest of a process's life; the next test in this worker starts with them acting.
    before = {sig: signal.getsignal(sig) for sig in interrupts.HELD}
    yield
    interrupts.unwound(before)  # type: ignore[arg-type]
