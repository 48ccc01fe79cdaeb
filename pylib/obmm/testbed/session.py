"""One way up: :func:`bring_up` turns a :class:`~obmm.testbed.settings.Settings` into ready nodes.

Every front end (the guest suite, the cluster suite, the pytest plugin, `obmm-testbed run`,
`up --kmod`, the bench and the hardware stage's QEMU stand-ins) comes up through it:

    image -> driver modules -> accelerator -> start or restore -> payload
          -> module load (+ parameters) -> identity -> kernel-log guard

and gets a :class:`Session`: the cluster, its :class:`GuestNode` objects (the
:class:`obmm.testbed.node.Node` interface), the modules loaded and the guard.
:meth:`Session.stop` is the one way down (the cluster's teardown, which a second Ctrl-C or
SIGTERM waits for).  :func:`attach` gives the same Session for a cluster that is already up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from obmm.testbed import arch, provision, ubsmem
from obmm.testbed.errors import TestbedError
from obmm.testbed.parallel import on_each
from obmm.testbed.progress import Progress
from obmm.testbed.remote import RemoteNode, node_env
from obmm.testbed.settings import Settings
from obmm.testbed.ssh import Connection
from obmm.testbed.topology import Topology
from obmm.testbed.vm import ownership
from obmm.testbed.vm.cluster import Cluster, default_logdir, load_topology
from obmm.testbed.vm.kguard import KernelLogGuard
from obmm.testbed.vm.machine import Machine
from obmm.testbed.vm.reaping import reap_dead_owners
from obmm.testbed.vm.timeline import Timeline

if TYPE_CHECKING:
    from obmm.testbed.node import Node

log = logging.getLogger(__name__)


class SessionError(TestbedError, RuntimeError):
    """The nodes could not be brought up (the message says which step and why)."""


class GuestNode(RemoteNode):
    """A QEMU node of a cluster."""

    def __init__(self, cluster: Cluster, index: int) -> None:
        super().__init__(index, f"node{index}", addr=cluster.fabric_ip(index))
        self.cluster = cluster

    def connect(self, timeout: float | None = None, *, node_only: bool = True) -> Connection:
        return self.cluster.connect(self.index, timeout, node_only=node_only)

    def open_connection(self) -> Connection:
        return self.cluster.take_connection(self.index) or self.connect()

    @property
    def qemu_pid(self) -> int:
        """The node's QEMU process (to stop or kill it on purpose)."""
        return self.cluster.nodes[self.index].pid

    def alive(self) -> bool:
        return self.cluster.nodes[self.index].alive()

    def console_tail(self) -> str:
        return self.cluster.nodes[self.index].console_tail()

    def console_since(self, marker: str) -> str:
        return self.cluster.nodes[self.index].console_since(marker)


@dataclass
class Session:
    """Nodes that are up, and what was done to bring them up."""

    settings: Settings
    cluster: Cluster
    nodes: list[GuestNode]
    modules: list[Path] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    #: False for a cluster this session attached to: stop() leaves it running.
    owned: bool = True
    guard: KernelLogGuard | None = None

    def __post_init__(self) -> None:
        if self.guard is None:
            self.guard = KernelLogGuard(self.nodes)

    @property
    def name(self) -> str:
        return self.cluster.name

    @property
    def topology(self) -> Topology:
        return self.cluster.topology

    @property
    def timeline(self) -> Timeline:
        """Where the bring-up's seconds went, per node (obmm.testbed.vm.timeline)."""
        return self.cluster.timeline

    def __getitem__(self, index: int) -> GuestNode:
        return self.nodes[index]

    def __len__(self) -> int:
        return len(self.nodes)

    def connect(self, index: int = 0, timeout: float = 30.0) -> Connection:
        return self.nodes[index].connect(timeout)

    def fabric_ip(self, index: int) -> str:
        return self.nodes[index].addr

    def all_alive(self) -> bool:
        return self.cluster.all_alive()

    def refresh_payload(self, out: Path, *, test_hooks: bool = False) -> list[Path]:
        """The driver's modules built for this cluster's image into `out`, and a fresh payload
        (package, tests, those modules) on every node; the modules loaded stay as they are.  An
        attached session made current (the guest suite's attach, `obmm-testbed dev`)."""
        kos = provision.module_load_order(
            provision.build_guest_modules(
                self.cluster.image, out, self.settings.driver, test_hooks=test_hooks
            )
        )
        provision.push_payload(self.nodes, kos)
        return kos

    def reload_modules(self, kos: Sequence[Path], params: Sequence[str]) -> None:
        """Unload the modules and load `kos` with `params` on every node: the bring-up's module
        step again, for modules rebuilt or parameters changed (`obmm-testbed dev`)."""
        topology, driver = self.topology, self.settings.driver

        def one(node: GuestNode) -> None:
            provision.unload_modules(node, kos)
            provision.load_modules(node, topology, kos, params=params, driver=driver)

        on_each(self.nodes, one)
        self.modules = list(kos)

    def close_connections(self) -> None:
        """Close every SSH connection; the nodes run on (`up`, `run --keep`)."""
        for node in self.nodes:
            node.close()
        self.cluster.close_connections()

    def stop(self) -> None:
        """Close every connection and stop the cluster (not one this session attached to)."""
        self.close_connections()
        if self.owned:
            self.cluster.stop()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def topology_for(settings: Settings, default: str) -> Topology:
    """The settings' topology (or `default`) with their node count, memory and pool applied."""
    base = load_topology(settings.topology or default)
    topology = Topology(
        nodes=settings.nodes if settings.nodes is not None else base.nodes,
        memory_mib=settings.memory_mib if settings.memory_mib is not None else base.memory_mib,
        pool_mib=settings.pool_mib if settings.pool_mib is not None else base.pool_mib,
        cpus=base.cpus,
        description=base.description,
        ram_base=arch.get(settings.arch).ram_base,
    )
    return topology


def default_topology(nodes: int | None) -> str:
    """The topology a front end without its own uses: one node `single`, more `pair`."""
    return "single" if nodes == 1 else "pair"


def bring_up(
    settings: Settings,
    *,
    purpose: str,
    default_topology: str = "pair",
    load_modules: bool = True,
    detach: bool = False,
    logdir: Path | None = None,
    progress: Progress | None = None,
    extra_args: Callable[[int], Sequence[str]] | None = None,
    test_hooks: bool = False,
    timeline: Timeline | None = None,
) -> Session:
    """Bring the cluster the settings describe up, ready for work.

    `purpose` names the front end in progress lines (`run`, `qemu-test`, ...).  The settings'
    name must be set (front ends fill their default).  `load_modules=False` stops after the
    boot (`up` without --kmod).  `detach`: the nodes outlive this process (owned by nobody
    until `obmm-testbed down`).  `test_hooks`: the guest suite's build of the modules, with
    their test-only parameters (:func:`obmm.testbed.provision.build_guest_modules`).
    `timeline`: where each step is marked (`up` starts it at the process's start; default: now),
    the session's :attr:`Session.timeline`.  On any failure, Ctrl-C included, everything
    started is stopped.
    """
    from obmm.testbed.builds.image import find_recipe
    from obmm.testbed.builds.kernels import guest_image
    from obmm.testbed.paths import cache_dir, results_dir
    from obmm.testbed.vm import accel as accel_mod

    if settings.name is None:
        raise SessionError("bring_up: the settings have no cluster name")
    for name in reap_dead_owners():
        log.info("cluster %s: its owner died; its run directory was removed", name)
    for path in ownership.reap_scratch():
        log.info("%s: its owner died; removed", path)
    if settings.ubs_mem:
        if not load_modules:
            raise SessionError("--ubs-mem needs the driver loaded (up --kmod)")
        ubsmem.check_prefix(Path(settings.ubs_mem))  # one line before anything boots
    progress = progress or Progress(f"{purpose} {settings.name}")
    marks = timeline or Timeline()
    marks.mark("bring_up")
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    topology = topology_for(settings, default_topology)
    image = guest_image(
        find_recipe(settings.recipe), kernel=settings.kernel, progress=progress, arch=settings.arch
    )
    t1 = time.monotonic()
    marks.mark("image")
    timings["image"] = t1 - t0
    kos: list[Path] = []
    if load_modules:
        kos = provision.module_load_order(
            provision.build_guest_modules(
                image, results_dir() / "kmod", settings.driver, test_hooks=test_hooks
            )
        )
        progress.line("modules: " + (", ".join(k.name for k in kos) or "none"))
    t2 = time.monotonic()
    marks.mark("kmod")
    timings["kmod"] = t2 - t1
    accel = accel_mod.choose(settings.accel, image.kernel, cache_dir(), qemu=settings.qemu_binary)
    machine = Machine(
        image,
        topology,
        accel=accel,
        init=settings.init,
        qemu_binary=settings.qemu_binary,
        extra_args=extra_args,
    )
    cluster = Cluster.start(
        machine,
        name=settings.name,
        logdir=logdir or default_logdir(settings.name),
        detach=detach,
        timeout=settings.boot_timeout,
        timeout_scale=settings.timeout_scale,
        progress=progress,
        snapshot=settings.snapshot,
        timeline=marks,
    )
    t3 = time.monotonic()
    timings["boot"] = t3 - t2
    session = Session(
        settings, cluster, [GuestNode(cluster, i) for i in range(topology.nodes)], kos, timings
    )
    try:
        if load_modules:
            provision.prepare(
                session.nodes, topology, kos, params=settings.driver_params, driver=settings.driver
            )
            _identify(session)  # the controller the driver made; plain `up` needs none
            for node in session.nodes:
                marks.mark("modules", node.index)
        if settings.ubs_mem:
            progress.line(f"ubs-mem {settings.ubs_mem}: our UBSE and ubsmd on every node")
            ubsmem.provision(session.nodes, Path(settings.ubs_mem))
    except BaseException:
        session.stop()
        raise
    timings["prepare"] = time.monotonic() - t3
    marks.mark("ready")
    progress.line(
        f"ready: {topology.nodes} node(s)"
        + (f", modules loaded: {', '.join(k.name for k in kos)}" if kos else "")
        + "; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    )
    return session


def attach(settings: Settings, name: str) -> Session:
    """A Session for the running cluster `name` (left running by :meth:`Session.stop`)."""
    cluster = Cluster.attach(name)
    session = Session(
        settings.replace(name=name),
        cluster,
        [GuestNode(cluster, i) for i in range(cluster.topology.nodes)],
        owned=False,
    )
    _identify(session)
    return session


def _identify(session: Session) -> None:
    """Every node's command environment: its number, the fabric addresses, its identity."""
    addrs = [n.addr for n in session.nodes]
    identities = on_each(session.nodes, lambda n: n.read_identity())
    for node, identity in zip(session.nodes, identities):
        node.set_env(
            node_env(node.index, len(session.nodes), addrs, identity, session.settings.driver)
        )


if TYPE_CHECKING:

    def _conforms(n: GuestNode) -> Node:  # mypy: a QEMU node keeps to the Node interface
        return n
