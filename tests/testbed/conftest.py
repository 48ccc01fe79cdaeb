"""The testbed's own tests against real QEMU nodes (``make testbed-test``): how the runner meets
guests that WARN, hang or panic, snapshots and their fallbacks, and ``obmm-testbed run`` from an
installed wheel.  They test the testbed, not OBMM code, so ``make qemu-test`` (the guest and
cluster suites a user's edit-run cycle needs) leaves them out; ``make test`` and CI run them.

The same plugin as tests/qemu: ``guest_session`` is a node of this run's own (restored or booted).

``make testbed-test`` shares them out over pytest-xdist workers (``-n``): one case mostly waits
on its guests.  Which tests must run in one worker, one after the other, is :func:`group` (the
scheduler below asks it; xdist's own ``xdist_group`` mark does not group under pytest 9).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest_plugins = ["obmm.testbed.suite.pytest_qemu"]

#: Signal-matrix entries whose cases name their clusters alike (`up`'s sig-up, the bench's
#: bench-1 and bench-data), and so share a console-log directory.
SIGNALS_SAME_NAMES = ("up", "bench")


def group(nodeid: str) -> str:
    """The unit of work a worker takes whole.  A module's tests share something (a booted node:
    test_runner_selftest; a snapshot each test leaves for the next: test_snapshot_restore; the
    /tmp scratch check: test_run_cli), so a module is one unit; test_signals' cases each have a
    run root and a TMPDIR of their own, so each is one, but those of an entry in
    SIGNALS_SAME_NAMES."""
    path, _, name = nodeid.partition("::")
    if not path.endswith("test_signals.py"):
        return path
    entry = name.partition("[")[2].partition("-")[0]
    return f"{path}::{entry}" if entry in SIGNALS_SAME_NAMES else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group(nodeid)

    return ByGroup(config, log)
