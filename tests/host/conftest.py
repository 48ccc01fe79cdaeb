"""Host suite: no VM, no /dev/obmm. Puts tests/host on sys.path for its helper modules."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from obmm.testbed import paths
from obmm.tools import interrupts

sys.path.insert(0, str(Path(__file__).resolve().parent))
#: Where this run's skips for lack of an upstream input go (fixed before any test redirects it).
SKIPPED_INPUTS = paths.skipped_inputs_file()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # A test skipped for lack of an input given by path: its one line goes to the list `make test`
    # ends with (collected where the report lands: once, by the xdist controller or the only
    # process).
    if report.skipped and isinstance(report.longrepr, tuple) and not _is_xdist_worker:
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        if paths.is_input_skip(reason):
            paths.note_input_skip(f"host-test: {reason}", SKIPPED_INPUTS)


_is_xdist_worker = False


def pytest_configure(config: pytest.Config) -> None:
    global _is_xdist_worker
    _is_xdist_worker = hasattr(config, "workerinput")


@pytest.fixture(autouse=True)
def _skips_noted_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Code under test that skips for lack of an input notes its line: not in the run's list.
    monkeypatch.setattr(paths, "skipped_inputs_file", lambda: tmp_path / "skipped-inputs.txt")


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
