"""pytest plugin loaded inside a guest (``-p obmm.testbed.suite.guest_plugin``): a result stream.

It writes one JSON object per line to the file descriptor named by ``$OBMM_EVENT_FD`` as each
test starts and each phase reports, so the host sees every result the moment it exists and
still knows which test was running if the kernel dies mid-test.  Only the standard library and
pytest are used: the guest has no paramiko.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import IO, Any

import pytest

from obmm import envvars

#: Seconds between the stream's "alive" events: the host pings a node (a new SSH login) only
#: after 30 s without an event, and a node busy with a long test (65,535 mappings under KASAN)
#: may take minutes to log a new session in while its running one still flows.
HEARTBEAT_S = 10.0

DRIVERS_SHOWN = {"real": "real obmm.ko on the testbed", "hardware": "real obmm.ko of a UB host"}


def emulator_only_reason(driver: str) -> str:
    """Why a test marked emulator_only is skipped where the driver is not the emulator."""
    shown = DRIVERS_SHOWN.get(driver, driver)
    return f"emulator_only: holds for the emulator only, not checked on the {shown}"


def driver_under_test() -> str:
    """``emu``, ``real`` (upstream obmm.ko on the testbed) or ``hardware`` (a UB host), from
    the node environment the testbed and the hardware stage give (obmm.envvars)."""
    if envvars.TARGET.get() == "hardware":
        return "hardware"
    return str(envvars.NODE_DRIVER.get())


def skip_emulator_only(items: list[pytest.Item], driver: str) -> None:
    """Mark the ``emulator_only`` tests skipped, with the reason, unless `driver` is ``emu``.
    The one place both suites (guest and cluster) decide it."""
    if driver == "emu":
        return
    # A skipif put first: pytest evaluates skipif before skip, the item's own marks before its
    # module's, so the driver's reason wins over a test's own condition (the hardware stages
    # check the reason).
    skip = pytest.mark.skipif(True, reason=emulator_only_reason(driver))
    for item in items:
        if item.get_closest_marker("emulator_only") is not None:
            item.add_marker(skip, append=False)


#: Why a test marked testbed_fabric is skipped on a UB host (it runs on either testbed driver).
TESTBED_FABRIC_SKIP = (
    "testbed_fabric: needs the testbed's decoder windows (/sys/kernel/obmm_emu or "
    "/sys/kernel/ub_compat); on real UB hardware decoder addresses come from management software"
)


def mark_for_driver(items: list[pytest.Item], driver: str) -> None:
    """What the driver markers mean under `driver` (:func:`driver_under_test`), for both suites:
    ``emulator_only`` skips off the emulator; ``testbed_fabric`` skips on a UB host;
    ``real_driver_differs(reason)`` is a strict xfail on the real obmm.ko of the testbed (the
    difference is known; the test passing there fails it, so the marker cannot go stale)."""
    fabric_skip = pytest.mark.skipif(True, reason=TESTBED_FABRIC_SKIP)  # first, as above
    for item in items:
        if driver == "hardware" and item.get_closest_marker("testbed_fabric") is not None:
            item.add_marker(fabric_skip, append=False)
    # After the fabric skip, so it goes before it: a test that is both says emulator_only.
    skip_emulator_only(items, driver)
    for item in items:
        differs = item.get_closest_marker("real_driver_differs")
        if driver == "real" and differs is not None:
            why = differs.args[0] if differs.args else "the real driver does otherwise"
            item.add_marker(pytest.mark.xfail(reason=f"real_driver_differs: {why}", strict=True))


def _longrepr(report: pytest.CollectReport | pytest.TestReport) -> str:
    if report.longrepr is None:
        return ""
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        return str(report.longrepr[2])
    return str(report.longreprtext)


class EventStream:
    """Hook implementations writing JSON lines to one stream."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.collect_errors: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # the heartbeat's thread writes too
        self._stopped = threading.Event()

    def emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.stream.write(json.dumps(event) + "\n")
            self.stream.flush()

    def beat(self, every: float = HEARTBEAT_S) -> None:
        """Emit an "alive" event every `every` seconds until stopped or the stream closes: the
        guest's userspace still runs, whatever a test keeps busy (the host's silence timer).
        Run in a thread of its own, which takes no signal: a test's SIGALRM or SIGINT must
        interrupt the main thread's blocking call."""
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while not self._stopped.wait(every):
            try:
                self.emit({"event": "alive"})
            except (OSError, ValueError):  # the host went away, or the stream closed
                return

    def start_heartbeat(self, every: float = HEARTBEAT_S) -> None:
        threading.Thread(
            target=self.beat, args=(every,), name="obmm-heartbeat", daemon=True
        ).start()

    def stop_heartbeat(self) -> None:
        self._stopped.set()

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collect_errors.append(
                {"event": "collect_error", "nodeid": report.nodeid, "longrepr": _longrepr(report)}
            )

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for event in self.collect_errors:
            self.emit(event)
        # The marker names too, so the host can select (e.g. emulator_only) without a second
        # collection in the guest (a Python start-up: seconds under TCG).
        markers = {i.nodeid: sorted({m.name for m in i.iter_markers()}) for i in session.items}
        self.emit(
            {
                "event": "collected",
                "nodeids": [i.nodeid for i in session.items],
                "markers": markers,
            }
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.emit({"event": "start", "nodeid": nodeid})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.emit(
            {
                "event": "report",
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "wasxfail": getattr(report, "wasxfail", None),
                "longrepr": _longrepr(report),
                "sections": [[title, text] for title, text in report.sections],
                "duration": report.duration,
            }
        )

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.emit({"event": "finish", "nodeid": nodeid})

    def pytest_sessionfinish(self, exitstatus: int) -> None:
        self.stop_heartbeat()
        self.emit({"event": "session_finish", "exitstatus": int(exitstatus)})


def pytest_configure(config: pytest.Config) -> None:
    fd = envvars.EVENT_FD.raw()
    if fd:
        stream = os.fdopen(int(fd), "w", buffering=1, closefd=False)
        events = EventStream(stream)
        config.pluginmanager.register(events, "obmm-event-stream")
        events.start_heartbeat()
