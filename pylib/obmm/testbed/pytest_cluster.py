"""The pytest plugin for other projects' tests (entry point ``pytest11``: ``obmm_testbed``).

Installed with the package; it does nothing unless a test asks for one of its fixtures (no
autouse fixture, no hook that changes collection or reports), so other suites run as before.

Fixtures:

* ``obmm_cluster`` (per test): the session's :class:`obmm.testbed.usercluster.UserCluster`,
  with the checks around the test: the kernel-log guard (a WARN, oops, KASAN... report or a node
  that died during the test fails it with the excerpt) and the leak check (a region, shmdev node
  or pool memory left on a node fails it; the leftovers are removed), and every background
  process the test started is stopped, so the next test starts from a clean emulator.
* ``obmm_nodes``: ``obmm_cluster.nodes``.
* ``obmm_testbed`` (session): the :class:`Testbed` that boots clusters; ``.cluster()`` is the
  session's cluster without the per-test checks, for session- or module-scoped setup (building).

Shape: ``@pytest.mark.obmm_cluster(nodes=2, memory_mib=1024, pool_mib=256)`` on a test (or a
module's ``pytestmark``), else ``--obmm-nodes`` / ``--obmm-memory`` / ``--obmm-pool`` or the ini
options ``obmm_nodes`` / ``obmm_memory_mib`` / ``obmm_pool_mib`` (default: 2 nodes, the
``pair`` topology's memory).  One cluster per session: booted (restored from a snapshot when one
fits) for the first test that needs it and reused; a test asking for another shape replaces it.
``@pytest.mark.obmm_cluster(kernel_guard=False)`` / ``leak_check=False`` (or the ini options
``obmm_kernel_guard`` / ``obmm_leak_check``, ``--obmm-no-kernel-guard`` /
``--obmm-no-leak-check``) turn a check off.  ``--obmm-driver real`` (ini ``obmm_driver``, else
``$OBMM_TESTBED_DRIVER``) loads upstream's obmm.ko over kmod/ub_compat instead of the emulator.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from obmm.testbed.errors import TestbedError

if TYPE_CHECKING:  # imported when a test uses a fixture: loading the plugin stays cheap
    from obmm.testbed.usercluster import UserCluster, UserNode

MARKER = "obmm_cluster"
DEFAULT_NODES = 2
SHAPE_KEYS = ("nodes", "memory_mib", "pool_mib")
CHECK_KEYS = ("kernel_guard", "leak_check")


class PluginError(TestbedError, ValueError):
    """The plugin was configured with something it cannot use (a bad marker argument)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("obmm-testbed", "obmm-testbed clusters (the obmm_cluster fixture)")
    group.addoption("--obmm-nodes", type=int, help="nodes of the session's cluster (default 2)")
    group.addoption("--obmm-memory", type=int, metavar="MIB", help="RAM per node")
    group.addoption("--obmm-pool", type=int, metavar="MIB", help="export pool per node")
    group.addoption("--obmm-accel", choices=("auto", "kvm", "tcg"), help="accelerator")
    group.addoption("--obmm-driver", choices=("emu", "real"), help="the OBMM driver (default emu)")
    group.addoption(
        "--obmm-cold", action="store_true", help="boot cold even if a snapshot of the shape exists"
    )
    group.addoption(
        "--obmm-no-kernel-guard", action="store_true", help="do not fail tests on kernel reports"
    )
    group.addoption("--obmm-no-leak-check", action="store_true", help="no leak check")
    parser.addini("obmm_nodes", "nodes of the session's cluster", default=str(DEFAULT_NODES))
    parser.addini("obmm_memory_mib", "RAM per node in MiB (default: the pair topology's)")
    parser.addini("obmm_pool_mib", "export pool per node in MiB (default: the topology's)")
    parser.addini("obmm_accel", "accelerator: auto, kvm or tcg", default="")
    parser.addini("obmm_driver", "OBMM driver: emu or real (upstream's obmm.ko)", default="")
    parser.addini("obmm_kernel_guard", "fail a test on a kernel report", type="bool", default=True)
    parser.addini("obmm_leak_check", "fail a test that leaks OBMM state", type="bool", default=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(nodes=2, memory_mib=None, pool_mib=None, kernel_guard=True, "
        "leak_check=True): the obmm-testbed cluster this test needs",
    )


def _int_or_none(value: object) -> int | None:
    return int(str(value)) if value not in (None, "") else None


class Testbed:
    """Boots the session's cluster on demand; one at a time."""

    __test__ = False

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.current: UserCluster | None = None
        self.shape: tuple[int, int | None, int | None] | None = None
        self.boots = 0

    def default_shape(self) -> tuple[int, int | None, int | None]:
        opt = self.config.getoption
        ini = self.config.getini
        nodes = opt("--obmm-nodes") or _int_or_none(ini("obmm_nodes")) or DEFAULT_NODES
        memory = opt("--obmm-memory") or _int_or_none(ini("obmm_memory_mib"))
        pool = opt("--obmm-pool") or _int_or_none(ini("obmm_pool_mib"))
        return int(nodes), memory, pool

    def cluster(
        self, nodes: int | None = None, memory_mib: int | None = None, pool_mib: int | None = None
    ) -> UserCluster:
        """The cluster of this shape (the defaults for what is not given), booted if needed."""
        d_nodes, d_memory, d_pool = self.default_shape()
        shape = (
            nodes if nodes is not None else d_nodes,
            memory_mib if memory_mib is not None else d_memory,
            pool_mib if pool_mib is not None else d_pool,
        )
        if self.current is not None and self.shape == shape:
            return self.current
        from obmm.testbed.usercluster import boot

        self.close()
        self.boots += 1
        name = f"pytest-{os.getpid()}-{self.boots}"
        accel = self.config.getoption("--obmm-accel") or self.config.getini("obmm_accel") or None
        driver = self.config.getoption("--obmm-driver") or self.config.getini("obmm_driver") or None
        capman = self.config.pluginmanager.getplugin("capturemanager")
        kwargs: dict[str, Any] = {
            "nodes": shape[0], "memory_mib": shape[1], "pool_mib": shape[2], "name": name,
            "accel": accel, "cold": bool(self.config.getoption("--obmm-cold")), "driver": driver,
        }  # fmt: skip
        if capman is not None:  # the boot's progress lines are the user's to see
            with capman.global_and_fixture_disabled():
                self.current = boot(**kwargs)
        else:
            self.current = boot(**kwargs)
        self.shape = shape
        return self.current

    def close(self) -> None:
        if self.current is not None:
            current, self.current, self.shape = self.current, None, None
            current.close()


def _marker_kwargs(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        return {}
    if marker.args:
        raise PluginError(f"@pytest.mark.{MARKER} takes keyword arguments only")
    unknown = set(marker.kwargs) - set(SHAPE_KEYS) - set(CHECK_KEYS)
    if unknown:
        raise PluginError(
            f"@pytest.mark.{MARKER}: unknown argument(s) {', '.join(sorted(unknown))}; "
            f"expected {', '.join(SHAPE_KEYS + CHECK_KEYS)}"
        )
    return dict(marker.kwargs)


@pytest.fixture(scope="session")
def obmm_testbed(request: pytest.FixtureRequest) -> Iterator[Testbed]:
    """Boots the session's cluster when a test first needs it; stops it at the end."""
    testbed = Testbed(request.config)
    try:
        yield testbed
    finally:
        testbed.close()


@pytest.fixture
def obmm_cluster(request: pytest.FixtureRequest, obmm_testbed: Testbed) -> Iterator[UserCluster]:
    """The cluster, with the kernel-log guard, the leak check and a clean state per test."""
    kwargs = _marker_kwargs(request)
    cluster = obmm_testbed.cluster(**{k: kwargs[k] for k in SHAPE_KEYS if k in kwargs})
    config = request.config
    guard = kwargs.get("kernel_guard", True) and config.getini("obmm_kernel_guard")
    guard = guard and not config.getoption("--obmm-no-kernel-guard")
    leaks = kwargs.get("leak_check", True) and config.getini("obmm_leak_check")
    leaks = leaks and not config.getoption("--obmm-no-leak-check")
    cluster.check_start(request.node.nodeid, kernel_guard=bool(guard), leak_check=bool(leaks))
    yield cluster
    failures = cluster.check_end()
    if failures:
        pytest.fail(f"obmm-testbed, {cluster.name}: " + "\n\n".join(failures), pytrace=False)


@pytest.fixture
def obmm_nodes(obmm_cluster: UserCluster) -> list[UserNode]:
    """The nodes of ``obmm_cluster`` (node 0 first)."""
    return obmm_cluster.nodes
