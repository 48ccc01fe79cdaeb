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

Shape: ``@pytest.mark.obmm_cluster(nodes=2, memory_mib=1024, pool_mib=256, params=[...])`` on a
test (or a module's ``pytestmark``), else the testbed's settings from ``--obmm-*`` options
(``--obmm-nodes``, ``--obmm-memory``, ``--obmm-pool``, ``--obmm-param NAME=VALUE``, ...; every
knob of :mod:`obmm.testbed.settings`), the ini options ``obmm_nodes`` / ``obmm_memory_mib`` /
``obmm_pool_mib``, or the ``OBMM_TESTBED_*`` environment (default: 2 nodes, the ``pair``
topology's memory).  One cluster per session: booted (restored from a snapshot when one fits)
for the first test that needs it and reused; a test asking for other settings replaces it.
``params`` are module parameters of the driver (``["ubc_index=1", "ubc_dev=00002"]``);
``coherence="strict"`` runs the emulator's strict coherence model (docs/coherence.md; else
``--obmm-coherence`` / ``$OBMM_TESTBED_COHERENCE``).
``@pytest.mark.obmm_cluster(kernel_guard=False)`` / ``leak_check=False`` (or the ini options
``obmm_kernel_guard`` / ``obmm_leak_check``, ``--obmm-no-kernel-guard`` /
``--obmm-no-leak-check``) turn a check off.  ``--obmm-driver real`` (ini ``obmm_driver``,
else ``$OBMM_TESTBED_DRIVER``) loads upstream's obmm.ko over kmod/ub_compat instead of the emulator.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from obmm.testbed import settings as settings_mod
from obmm.testbed.errors import TestbedError
from obmm.testbed.settings import Settings
from obmm.tools import interrupts

if TYPE_CHECKING:  # imported when a test uses a fixture: loading the plugin stays cheap
    from obmm.testbed.session import GuestNode
    from obmm.testbed.usercluster import UserCluster

MARKER = "obmm_cluster"
DEFAULT_NODES = 2
SHAPE_KEYS = ("nodes", "memory_mib", "pool_mib", "params", "coherence")
CHECK_KEYS = ("kernel_guard", "leak_check")
INI_SHAPE = {"nodes": "obmm_nodes", "memory_mib": "obmm_memory_mib", "pool_mib": "obmm_pool_mib"}


class PluginError(TestbedError, ValueError):
    """The plugin was configured with something it cannot use (a bad marker argument)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("obmm-testbed", "obmm-testbed clusters (the obmm_cluster fixture)")
    settings_mod.add_pytest_options(group)
    group.addoption("--obmm-cold", action="store_true", help="boot cold even if a snapshot fits")
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
        f"{MARKER}(nodes=2, memory_mib=None, pool_mib=None, params=(), coherence=None, "
        "kernel_guard=True, "
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
        self.settings: Settings | None = None
        self.boots = 0

    def default_settings(self) -> Settings:
        """The options over the environment over the ini file; 2 nodes unless told."""
        ini: dict[str, Any] = {k: _int_or_none(self.config.getini(v)) for k, v in INI_SHAPE.items()}
        ini["accel"] = self.config.getini("obmm_accel") or None
        ini["driver"] = self.config.getini("obmm_driver") or None
        from_env = settings_mod.set_in_environment()
        base = Settings.from_env().replace(**{k: v for k, v in ini.items() if k not in from_env})
        settings = settings_mod.from_pytest(self.config, base)
        if self.config.getoption("--obmm-cold"):
            settings = settings.replace(snapshot="off")
        return settings.with_defaults(nodes=DEFAULT_NODES)

    def cluster(
        self,
        nodes: int | None = None,
        memory_mib: int | None = None,
        pool_mib: int | None = None,
        params: Sequence[str] | None = None,
        coherence: str | None = None,
    ) -> UserCluster:
        """The cluster of these settings (the defaults for what is not given), booted if
        needed."""
        wanted = self.default_settings().replace(
            nodes=nodes, memory_mib=memory_mib, pool_mib=pool_mib, coherence=coherence,
            params=settings_mod.merge_params(params) if params is not None else None,
        )  # fmt: skip
        if self.current is not None and self.settings == wanted:
            return self.current
        from obmm.testbed.usercluster import boot

        self.close()
        self.boots += 1
        # From the first boot on, SIGTERM (a CI job cancelled) unwinds like Ctrl-C: the
        # cluster is stopped, not left to the next command (a run that boots none is untouched).
        interrupts.install_sigterm_unwinds()
        named = wanted.replace(name=f"pytest-{os.getpid()}-{self.boots}")
        capman = self.config.pluginmanager.getplugin("capturemanager")
        if capman is not None:  # the boot's progress lines are the user's to see
            with capman.global_and_fixture_disabled():
                self.current = boot(named)
        else:
            self.current = boot(named)
        self.settings = wanted
        return self.current

    def close(self) -> None:
        if self.current is not None:
            current, self.current, self.settings = self.current, None, None
            capman = self.config.pluginmanager.getplugin("capturemanager")
            if capman is not None:  # as the boot's: the teardown's line is the user's to see
                with capman.global_and_fixture_disabled():
                    current.close()
            else:
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
    kwargs = dict(marker.kwargs)
    params = kwargs.get("params")
    if isinstance(params, str):
        raise PluginError(f"@pytest.mark.{MARKER}: params is a list of NAME=VALUE strings")
    return kwargs


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
def obmm_nodes(obmm_cluster: UserCluster) -> list[GuestNode]:
    """The nodes of ``obmm_cluster`` (node 0 first)."""
    return obmm_cluster.nodes
