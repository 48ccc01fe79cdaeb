"""pytest plugin loaded inside a guest (``-p obmm.testbed.guest_plugin``): a result stream.

It writes one JSON object per line to the file descriptor named by ``$OBMM_EVENT_FD`` as each
test starts and each phase reports, so the host sees every result the moment it exists and
still knows which test was running if the kernel dies mid-test.  Only the standard library and
pytest are used: the guest has no paramiko.
"""

from __future__ import annotations

import json
import os
from typing import IO, Any

import pytest

EVENT_FD_ENV = "OBMM_EVENT_FD"
# Why a test marked emulator_only is skipped on real hardware (guest and cluster suites alike).
EMULATOR_ONLY_SKIP = (
    "emulator_only: holds for obmm_emu.ko only, not checked on real UB hardware "
    "(OBMM_TARGET=hardware)"
)
# Why a test marked testbed_fabric is skipped on real hardware (it runs on either testbed driver).
TESTBED_FABRIC_SKIP = (
    "testbed_fabric: needs the testbed's decoder windows (/sys/kernel/obmm_emu or "
    "/sys/kernel/ub_compat); on real UB hardware decoder addresses come from management software"
)
# ... and on the testbed's nodes running upstream's obmm.ko over kmod/ub_compat.
EMULATOR_ONLY_SKIP_REAL = (
    "emulator_only: holds for obmm_emu.ko only, not checked on the real obmm.ko (OBMM_DRIVER=real)"
)


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

    def emit(self, event: dict[str, Any]) -> None:
        self.stream.write(json.dumps(event) + "\n")
        self.stream.flush()

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
        self.emit({"event": "session_finish", "exitstatus": int(exitstatus)})


def pytest_configure(config: pytest.Config) -> None:
    fd = os.environ.get(EVENT_FD_ENV)
    if fd:
        stream = os.fdopen(int(fd), "w", buffering=1, closefd=False)
        config.pluginmanager.register(EventStream(stream), "obmm-event-stream")
