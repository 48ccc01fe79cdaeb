"""Cluster suite: host-side pytest that orchestrates a multi-node QEMU cluster over SSH.

These tests run on the host (they are not copied into the guests).  One session fixture brings a
cluster up (:func:`obmm.testbed.session.bring_up`; default topology ``pair``, 2 nodes), the
harness copies the guest helpers (``guest_side/``: ``GUEST_HELPERS``) and ``examples/`` into
every node and hands tests a :class:`ClusterHarness` to run commands and Python snippets on
node *i*.

Handles travel as in production: the exporter guest publishes them with ``obmm.exchange`` bound
to its link-local address on the inter-node network, the importer guest fetches them from there.

Kernel-log guard: before each test a marker is written into every node's kernel log; after it,
each node that is still alive has its messages since the marker scanned with ``obmm.tools.logscan``
(and its taint mask compared); a report fails the test with the excerpt.

Tests marked ``destroys_cluster`` (killing a node) run last.  Every wait is bounded.

Environment: the testbed's settings (``OBMM_TESTBED_*``, :mod:`obmm.testbed.settings`; the name
defaults to ``cluster-test-<pid>``) and ``OBMM_TESTBED_ATTACH=NAME`` to run against a cluster
started with ``obmm-testbed up --nodes 2 --kmod --name NAME`` instead of booting one (it is left
running; the node-killing test kills its node 0).  ``OBMM_CLUSTER_SHARD=I/N`` runs the I-th of N
parts of the selection (split by file and the seconds each test took last time,
``results/cluster-durations.json``), so N runs side by side, each on its own cluster, take every
test once.

Hardware mode: when ``$OBMM_HW_CONFIG_JSON`` is set (the hardware stage, ``make hw-test``, sets
it) the nodes are the stage's hosts (:func:`obmm.testbed.hw.stage.cluster_from_env`): nothing is
booted, built or loaded; the package and helpers go to a fresh directory under the stage's
``remote_tmp`` on every host (removed at the end unless ``HW_KEEP=1``); each host's processes get
``OBMM_NODE_ID`` (its position in the host list) and ``OBMM_DECODER``; tests marked
``emulator_only`` or ``testbed_fabric`` are skipped with the reason.  When the nodes run
upstream's obmm.ko (``$OBMM_TESTBED_DRIVER=real``), those marked ``emulator_only`` are.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest
from xharness import ClusterHarness

from obmm import envvars
from obmm.testbed import provision
from obmm.testbed.hw import stage as hwstage
from obmm.testbed.parallel import on_each
from obmm.testbed.paths import is_input_skip, note_input_skip, repo_root, results_dir
from obmm.testbed.provision import payload_tar
from obmm.testbed.session import Session, attach, bring_up, topology_for
from obmm.testbed.settings import Settings
from obmm.testbed.ssh import SshError
from obmm.testbed.suite import durations
from obmm.testbed.suite.guest_plugin import mark_for_driver
from obmm.tools import interrupts

HARDWARE = bool(envvars.HW_CONFIG_JSON.raw())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "destroys_cluster: kills a node; runs last and leaves the cluster degraded"
    )
    config.addinivalue_line(
        "markers",
        "after_destroys: runs after the destroys_cluster tests (provokes kernel reports)",
    )
    # CI cancelling the job unwinds like Ctrl-C, so the cluster is torn down.
    interrupts.install_sigterm_unwinds()


#: The seconds each test took (setup, call and teardown) on the emulator last time, by node id:
#: what OBMM_CLUSTER_SHARD splits the suite by.
DURATIONS_FILE = "cluster-durations.json"
_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
    # A test skipped for lack of an input given by path (libobmm): its line goes to the list
    # `make test` ends with.
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        if is_input_skip(reason):
            note_input_skip(reason)


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Only the emulator's times: they weigh the split of make qemu-test's cluster job.
    if not HARDWARE and Settings.from_env().driver == "emu":
        durations.save(results_dir() / DURATIONS_FILE, _seconds)


def _keep_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    """OBMM_CLUSTER_SHARD=I/N: keep the I-th of N parts of the selection (the others deselected),
    split by file and recorded seconds, so N runs side by side end at about the same time."""
    try:
        spec = durations.parse_shard(envvars.CLUSTER_SHARD.get())
    except ValueError as exc:
        raise pytest.UsageError(f"{envvars.CLUSTER_SHARD.name}: {exc}") from None
    if spec is None:
        return
    weights = durations.load(results_dir() / DURATIONS_FILE)
    mine = set(durations.shard([item.nodeid for item in items], *spec, weights))
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in mine])
    items[:] = [item for item in items if item.nodeid in mine]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_for_driver(items, "hardware" if HARDWARE else Settings.from_env().driver)
    _keep_shard(config, items)

    # Node-killing tests last; after them only tests that dirty a kernel log on purpose, so no
    # test that scans a node's whole log sees their reports.
    def order(item: pytest.Item) -> tuple[bool, bool]:
        last = item.get_closest_marker("after_destroys") is not None
        return (last or item.get_closest_marker("destroys_cluster") is not None, last)

    items.sort(key=order)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Session | hwstage.HwCluster]:
    """The nodes: brought up (obmm.testbed.session.bring_up, the testbed's settings, default
    topology ``pair``), the running cluster named by $OBMM_TESTBED_ATTACH (left running), or
    the hardware stage's hosts."""
    hardware = hwstage.cluster_from_env()
    if hardware is not None:
        yield hardware
        return
    settings = Settings.from_env().with_defaults(name=f"cluster-test-{os.getpid()}")
    assert settings.name is not None
    attach_to = envvars.ATTACH.get()
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if attach_to:
        session = attach(settings, attach_to)
    else:
        nodes = topology_for(settings, "pair").nodes
        if nodes < 2:
            pytest.exit(f"the cluster suite needs at least 2 nodes, the settings give {nodes}")
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            session = bring_up(
                settings,
                purpose="cluster",
                default_topology="pair",
                logdir=results_dir() / "qemu" / settings.name,
            )
    try:
        yield session
    finally:
        # Its "stopping cluster" line reaches the terminal, as the boot's lines do.
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            session.stop()


#: Copied into every node's helper directory (``ClusterHarness.helpers``).
GUEST_HELPERS = (
    "xnode.py",
    "ctlpoke.py",
    "atomics.c",
    "libobmm_xnode.c",
    "ubse_harness.c",
    "coherence_side.py",
)


@pytest.fixture(scope="session")
def xc(cluster: Session | hwstage.HwCluster) -> Iterator[ClusterHarness]:
    """The harness: the cluster with the helpers and examples copied in (and on hardware hosts
    the package, into a per-run directory)."""
    if isinstance(cluster, hwstage.HwCluster):
        harness = _hardware_harness(cluster)
    else:
        harness = ClusterHarness(cluster.nodes)  # bring_up copied the package to GUEST_ROOT
    root = repo_root()
    helpers = [Path(__file__).parent / "guest_side" / name for name in GUEST_HELPERS]
    try:
        for i in range(harness.nodes):
            harness.run(i, f"rm -rf {harness.helpers} {harness.examples}")
            harness.run(i, f"mkdir -p {harness.helpers}")
            conn = harness.conn(i)
            for helper in helpers:
                conn.put(helper, f"{harness.helpers}/{helper.name}")
            conn.put(root / "examples", str(harness.root))
        yield harness
    finally:
        if harness.hardware and envvars.HW_KEEP.get() != "1":
            for i in range(harness.nodes):
                try:
                    harness.run(i, f"rm -rf {harness.root}", check=False)
                except SshError as exc:  # the run's own result says more; keep cleaning
                    print(f"node{i}: could not remove {harness.root}: {exc}")
        harness.close()


def _hardware_harness(hw: hwstage.HwCluster) -> ClusterHarness:
    """Hosts get the package in one new directory (the same path on every host); the stage's
    run marker goes into each kernel log so it can cut this run's messages out."""
    config = hw.config
    run_id = envvars.HW_RUN_ID.get() or uuid.uuid4().hex[:12]
    workdir = PurePosixPath(config.remote_tmp) / f"obmm-xnode.{run_id}"
    harness = ClusterHarness(
        hw.nodes, root=workdir, python=config.python, hardware=True, extra_env=hw.node_env
    )
    payload = payload_tar(repo_root())
    made: list[int] = []
    try:
        for i in range(harness.nodes):
            # mkdir (not -p) fails on an existing path: never unpack into another's directory.
            harness.run(i, f"mkdir -m 0700 {workdir}")
            made.append(i)
            harness.run(i, f"tar -xzf - -C {workdir}", timeout=300, stdin=payload)
            harness.run(i, f"echo '{hwstage.KMSG_MARKER} {run_id}' > /dev/kmsg 2>/dev/null; true")
    except BaseException:
        for i in made:
            harness.run(i, f"rm -rf {workdir}", check=False)
        harness.close()
        raise
    return harness


@pytest.fixture(autouse=True)
def kernel_log_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    if "xc" not in request.fixturenames:
        yield
        return
    harness: ClusterHarness = request.getfixturevalue("xc")
    harness.guard_start(request.node.name)
    yield
    destroys = request.node.get_closest_marker("destroys_cluster") is not None
    failures = harness.guard_failures(allow_dead=destroys)
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)


#: How long a test waits for the real driver's pool to refill (its thread wakes every 5 s).
POOL_SETTLE_S = 30.0


@pytest.fixture(autouse=True)
def settle_real_pool(request: pytest.FixtureRequest) -> None:
    """On the real obmm.ko, every test starts with each node's pool whole and cleared, as it
    always is on the emulator: the real driver refills it in the background after an unexport,
    and an export made meanwhile gets granules out of order (not one run, so no window reaches
    it in one piece: ub_compat's UMMU), or a borrow's memory block unaligned."""
    if HARDWARE or "xc" not in request.fixturenames:
        return
    cluster = request.getfixturevalue("cluster")
    if not isinstance(cluster, Session) or cluster.settings.driver != "real":
        return
    harness: ClusterHarness = request.getfixturevalue("xc")
    live = [n for i, n in enumerate(harness.node_list) if harness.alive(i)]
    on_each(live, lambda n: provision.wait_real_pool(n, cluster.topology, POOL_SETTLE_S))


@pytest.fixture
def guest_tmp(xc: ClusterHarness) -> Iterator[str]:
    """A per-test directory name under /tmp in the guests (created on every live node)."""
    path = f"/tmp/xt-{uuid.uuid4().hex[:10]}"
    _on_live_nodes(xc, f"mkdir -p {path}", check=True)
    yield path
    _on_live_nodes(xc, f"rm -rf {path}", check=False)


def _on_live_nodes(xc: ClusterHarness, command: str, *, check: bool) -> None:
    """`command` on every live node at once (one SSH round trip each, in parallel)."""
    on_each([i for i in range(xc.nodes) if xc.alive(i)], lambda i: xc.run(i, command, check=check))
