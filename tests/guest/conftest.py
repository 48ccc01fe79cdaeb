"""Guest suite plumbing: a kernel splat while a test runs fails that test.

Before each test the kernel log is marked (everything already logged is set
aside); after each phase (setup, call, teardown) the messages logged during
it are scanned with obmm.tools.logscan, and /proc/sys/kernel/tainted is compared.
A WARN, BUG, oops, KASAN, lockdep, stall, hung-task or panic report, or a
new non-benign taint flag, turns that phase's report into a failure that
shows the excerpt.  Messages logged between tests and growth of the taint
mask that no test owns fail the session at the end.

A test that provokes a splat on purpose takes the messages itself with the
``kernel_log`` fixture (``kernel_log.take()``), or allows a known line with
``@pytest.mark.kernel_log_allow(regex, reason)``.

Runs in the guests with Debian 12's pytest 7.2: only APIs that version has.
Set OBMM_KMSG_GUARD=off to disable the guard; OBMM_KMSG_PATH and
OBMM_TAINTED_PATH point it at other files (for testing the guard itself).

Tests marked ``emulator_only`` are skipped, with the reason in the report, where
the driver under test is not the emulator (the hardware stage, or the real
driver on the testbed); those marked ``testbed_fabric`` on real UB hardware; a
test marked ``real_driver_differs(reason)`` is expected to fail on the real
driver (strict xfail: its passing would fail it).  One place decides it all:
obmm.testbed.suite.guest_plugin.mark_for_driver.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from obmm import envvars
from obmm.testbed.suite.guest_plugin import driver_under_test, mark_for_driver
from obmm.tools import logscan

# The OBMM fixtures (dev, fabric, leak check) live beside this file; a copy of
# this conftest on its own (the guard's host test) runs without them.
pytest_plugins = ["obmm_fixtures"] if (Path(__file__).parent / "obmm_fixtures.py").is_file() else []

# Overridable so the guard itself can be tested on the host against files.
KMSG = envvars.KMSG_PATH.get()
TAINTED = envvars.TAINTED_PATH.get()


@dataclass
class KmsgGuard:
    """Session state of the guard (one per pytest run, kept in config.stash)."""

    watcher: logscan.KmsgWatcher | None
    off_reason: str = ""
    taint: int = 0
    unowned: list[str] = field(default_factory=list)  # text logged between tests
    boot_reports: list[logscan.Report] = field(default_factory=list)
    session_reports: list[logscan.Report] = field(default_factory=list)
    session_taint: str = ""

    def read(self) -> str:
        return self.watcher.read_new() if self.watcher is not None else ""


class KernelLog:
    """Handle for one test: take() claims the new kernel messages so the guard skips them."""

    def __init__(self, guard: KmsgGuard) -> None:
        self._guard = guard

    @property
    def active(self) -> bool:
        return self._guard.watcher is not None

    def take(self) -> str:
        """Kernel messages logged since the last check; the test now owns them and their taint."""
        text = self._guard.read()
        self._guard.taint = read_taint()
        return text

    def take_reports(self) -> list[logscan.Report]:
        """take(), scanned (without the default allow-list, so every report shows)."""
        return logscan.scan(self.take(), allow=())


GUARD_KEY = pytest.StashKey[KmsgGuard]()


def read_taint() -> int:
    try:
        with open(TAINTED) as fh:
            return int(fh.read().strip() or "0")
    except (OSError, ValueError):
        return 0


def _boot_log() -> str:
    """Everything still in the ring buffer, read through a second, unseeked descriptor."""
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    try:

        def read_raw() -> bytes:
            return os.read(fd, 16384)

        records, _ = logscan.drain_records(read_raw, None)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return "".join(r.format() + "\n" for r in records)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kernel_log_allow(regex, reason): a kernel log line this test may produce (AllowRule)",
    )
    if envvars.KMSG_GUARD.get().lower() in ("0", "off", "no", "false"):
        guard = KmsgGuard(None, f"disabled by {envvars.KMSG_GUARD.name}")
    else:
        try:
            guard = KmsgGuard(logscan.KmsgWatcher(KMSG))
        except OSError as exc:
            guard = KmsgGuard(None, f"{KMSG}: {exc.strerror or exc}")
    if guard.watcher is not None:
        guard.boot_reports = logscan.scan(_boot_log())
    guard.taint = read_taint()
    config.stash[GUARD_KEY] = guard


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_for_driver(items, driver_under_test())


def pytest_collection_finish(session: pytest.Session) -> None:
    # The fixtures call gc.collect() after every test and around every export, so that
    # mappings a test forgot are gone before cleanup.  A full collection walks every object:
    # pytest's, the test modules', cffi's; about 35 ms under TCG, half of what a trivial test
    # costs.  What exists now is not garbage: frozen, it is never walked again.
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    guard = config.stash.get(GUARD_KEY, None)
    if guard is not None and guard.watcher is not None:
        guard.watcher.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    guard = item.config.stash[GUARD_KEY]
    if guard.watcher is not None:
        # The mark: what is already logged belongs to no test.
        guard.unowned.append(guard.read())
        logscan.write_marker(f"obmm-test: begin {item.nodeid}\n", KMSG)
    yield


def _allow_rules(item: pytest.Item) -> list[logscan.AllowRule]:
    rules = list(logscan.DEFAULT_ALLOW)
    for mark in item.iter_markers("kernel_log_allow"):
        rules.append(logscan.AllowRule(*mark.args, **mark.kwargs))
    return rules


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:  # Any: pluggy 1.0's result type is private
    outcome = yield
    guard = item.config.stash[GUARD_KEY]
    if guard.watcher is None:
        return
    report: pytest.TestReport = outcome.get_result()
    text = guard.read()
    reports = logscan.scan(text, allow=_allow_rules(item))
    taint = read_taint()
    gained = logscan.new_taint(guard.taint, taint)
    guard.taint = taint
    if not reports and not gained:
        return
    parts = []
    if reports:
        parts.append(logscan.format_reports(reports))
    if gained:
        parts.append(f"kernel taint gained {gained} during {report.when} (tainted={taint})")
    message = f"kernel log guard: splat during {report.when}\n" + "\n".join(parts)
    if report.failed:
        report.sections.append(("kernel log guard", message))
        return
    # A passing (or skipped) phase that made the kernel complain is a failure.
    report.outcome = "failed"
    report.longrepr = message


#: vm.max_map_count, raised by ``many_maps``.
MAX_MAP_COUNT = Path("/proc/sys/vm/max_map_count")


@pytest.fixture
def many_maps() -> Iterator[None]:
    """Room for more than 65535 mappings in this process (a page's u16 reader count overflows
    past that; the default limit is 65530), restored after the test."""
    old = MAX_MAP_COUNT.read_text()
    MAX_MAP_COUNT.write_text(str(0xFFFF + 4096))
    try:
        yield
    finally:
        MAX_MAP_COUNT.write_text(old)


@pytest.fixture(autouse=True)
def kernel_log(request: pytest.FixtureRequest) -> Generator[KernelLog, None, None]:
    """Every test gets the guard; tests that expect a splat call kernel_log.take()."""
    yield KernelLog(request.config.stash[GUARD_KEY])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    guard = session.config.stash.get(GUARD_KEY, None)
    if guard is None or guard.watcher is None:
        return
    guard.unowned.append(guard.read())
    guard.session_reports = logscan.scan("".join(guard.unowned))
    taint = read_taint()
    guard.session_taint = logscan.new_taint(guard.taint, taint)
    if guard.session_reports or guard.session_taint:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    guard = terminalreporter.config.stash.get(GUARD_KEY, None)
    if guard is None:
        return
    tr = terminalreporter
    if guard.watcher is None:
        tr.write_line(f"kernel log guard: off ({guard.off_reason})")
        return
    if guard.boot_reports:
        tr.write_sep("-", "kernel log before the tests (not failing the run)")
        tr.write_line(logscan.format_reports(guard.boot_reports))
    if guard.session_reports:
        tr.write_sep("=", "kernel log between tests: FAILED", red=True)
        tr.write_line(logscan.format_reports(guard.session_reports))
    if guard.session_taint:
        tr.write_line(f"kernel log guard: taint gained outside any test: {guard.session_taint}")
    if not guard.session_reports and not guard.session_taint:
        tr.write_line("kernel log guard: clean between tests")
