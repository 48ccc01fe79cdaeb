"""A cluster for other projects' tests: nodes with `run`, background processes, files, handles.

What the pytest plugin (:mod:`obmm.testbed.pytest_cluster`) hands a test, usable without pytest
too.  :func:`boot` brings a cluster up (:func:`obmm.testbed.session.bring_up`: modules built,
booted or restored from a snapshot, the driver loaded on every node) and returns a
:class:`UserCluster`, whose nodes are :class:`obmm.testbed.node.Node` objects:

* ``cluster.nodes[i].run(command, timeout=...)``: exit status and both streams
  (:class:`obmm.testbed.ssh.Result`); at the deadline the command's process group is killed and
  :class:`~obmm.testbed.ssh.CommandTimeout` raised;
* ``node.start(command, ready_line=..., ready_port=...)``: a process in the background
  with ``wait``/``stop`` and its output;
* ``node.put``/``node.get`` and ``cluster.put`` (a directory to every node as one archive);
* ``node.fetch_handle(server, name, port)``: a handle another node serves with ``obmm.exchange``
  (or the C exchange helpers), fetched on this node over the inter-node network;
  ``node.serve_handles({name: handle})`` publishes handles made on the host;
* :meth:`UserCluster.check_start` / :meth:`UserCluster.check_end`: the kernel-log guard
  (:mod:`obmm.testbed.vm.kguard`), the leak check (regions, shmdev nodes, pool ``used``) and the
  clean state between tests (processes stopped, leaked regions removed).

Every command gets the environment `obmm-testbed run` gives its commands
(:func:`obmm.testbed.remote.node_env`: node id, CNA, EID, fabric addresses, ``OBMM_CFLAGS``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from obmm.testbed.node import DEFAULT_TIMEOUT_S, Node
from obmm.testbed.parallel import on_each
from obmm.testbed.remote import RemoteNode, dir_archive, unpack_on
from obmm.testbed.session import GuestNode, Session
from obmm.testbed.settings import Settings
from obmm.testbed.ssh import Result, SshError
from obmm.testbed.topology import Topology
from obmm.testbed.vm.kguard import KernelLogGuard

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 60.0
#: One line per region (``region obmm_shmdev<id> <type>``), device node and memory pool.
STATE_COMMAND = (
    'for d in /sys/devices/obmm/obmm_shmdev*; do [ -e "$d" ] && '
    'echo "region ${d##*/} $(cat "$d/type" 2>/dev/null)"; done; '
    'for d in /dev/obmm_shmdev*; do [ -e "$d" ] && echo "dev ${d##*/}"; done; '
    "for f in /sys/kernel/obmm_mempool/obmm-*/used; do "
    '[ -e "$f" ] && echo "pool $(cat "$f")"; done; true'
)
#: Remove the regions given as ``export:ID`` / ``import:ID`` arguments (the leak cleanup).
REMOVE_SCRIPT = """\
import sys, obmm
with obmm.Obmm() as dev:
    for arg in sys.argv[1:]:
        kind, _, mem_id = arg.partition(":")
        try:
            (dev.unexport if kind == "export" else dev.unimport)(int(mem_id))
        except obmm.ObmmError as exc:
            print(f"{kind} {mem_id}: {exc}")
"""


# -- the emulator state the leak check compares -----------------------------------------------


@dataclass(frozen=True)
class ObmmState:
    """What a leaked region leaves on a node: regions (id -> type), device nodes, pool used."""

    regions: Mapping[int, str]
    devs: frozenset[int]
    pool_used: int

    @classmethod
    def parse(cls, text: str) -> ObmmState:
        regions: dict[int, str] = {}
        devs: set[int] = set()
        used = 0
        for line in text.splitlines():
            word, _, rest = line.strip().partition(" ")
            name, _, kind = rest.partition(" ")
            if word == "region" and name.startswith("obmm_shmdev"):
                regions[int(name.removeprefix("obmm_shmdev"))] = kind.strip() or "?"
            elif word == "dev" and name.startswith("obmm_shmdev"):
                devs.add(int(name.removeprefix("obmm_shmdev")))
            elif word == "pool":
                used += int(name, 0)
        return cls(regions, frozenset(devs), used)

    def leaks_since(self, before: ObmmState) -> str:
        """'' if nothing was left over since `before`, else what was."""
        parts = []
        new = sorted(set(self.regions) - set(before.regions))
        if new:
            parts.append("regions " + ", ".join(f"{self.regions[i]} {i}" for i in new))
        devs = sorted(self.devs - before.devs)
        if devs:
            parts.append("device nodes " + ", ".join(f"/dev/obmm_shmdev{i}" for i in devs))
        if self.pool_used != before.pool_used:
            parts.append(f"pool used {before.pool_used:#x} -> {self.pool_used:#x}")
        return "; ".join(parts)


# -- per node ---------------------------------------------------------------------------------


def node_state(node: Node) -> ObmmState:
    """The emulator state of a node that the leak check compares."""
    return ObmmState.parse(node.run(STATE_COMMAND, timeout=CHECK_TIMEOUT_S, bare=True).out)


def remove_regions(node: RemoteNode, regions: Mapping[int, str]) -> str:
    """Unexport / unimport `regions` (id -> type) on `node`; what could not be removed."""
    if not regions:
        return ""
    args = [f"{'import' if kind == 'import' else 'export'}:{i}" for i, kind in regions.items()]
    res = node.python(REMOVE_SCRIPT, *args, timeout=CHECK_TIMEOUT_S)
    return (res.out + res.err).strip()


# -- the cluster --------------------------------------------------------------------------------


@dataclass
class UserCluster:
    """The cluster a user's tests run on: a :class:`~obmm.testbed.session.Session` with the
    checks around each test."""

    session: Session
    guard: KernelLogGuard | None = None
    before: dict[int, ObmmState] = field(default_factory=dict)

    @property
    def nodes(self) -> list[GuestNode]:
        return self.session.nodes

    @property
    def topology(self) -> Topology:
        return self.session.topology

    def __getitem__(self, index: int) -> GuestNode:
        return self.nodes[index]

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def name(self) -> str:
        return self.session.name

    def put(self, local: Path, remote: str | PurePosixPath) -> None:
        """A file or directory to `remote` on every node (a directory as one archive, to all
        nodes at once)."""
        local = Path(local)
        if local.is_dir():
            data, _ = dir_archive(local)
            unpack_on(self.nodes, data, PurePosixPath(remote))
        else:
            for node in self.nodes:
                node.put(local, remote)

    def run_all(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                check: bool = False) -> list[Result]:  # fmt: skip
        """`command` on every node at once; the results in node order."""
        return on_each(self.nodes, lambda n: n.run(command, timeout=timeout, check=check))

    # -- between tests ----------------------------------------------------------------------

    def check_start(self, name: str, *, kernel_guard: bool, leak_check: bool) -> None:
        """Before a test: mark the kernel logs, note the emulator state."""
        self.guard = None
        if kernel_guard:
            self.guard = self.session.guard
            assert self.guard is not None
            self.guard.start(name)
        self.before = {n.index: node_state(n) for n in self.nodes} if leak_check else {}

    def check_end(self) -> list[str]:
        """After a test: stop its processes, scan the kernel logs, compare the emulator state
        (removing what leaked, so the next test starts clean); one failure text per finding."""
        for node in self.nodes:
            if node.alive():
                for line in node.stop_all():
                    log.info("%s", line)
        failures = []
        if self.guard is not None:
            reports = self.guard.failures()
            if reports:
                failures.append("kernel report during the test:\n" + "\n\n".join(reports))
        for index, before in self.before.items():
            node = self.nodes[index]
            if not node.alive():
                continue
            after = node_state(node)
            leaks = after.leaks_since(before)
            if leaks:
                new = {i: k for i, k in after.regions.items() if i not in before.regions}
                problem = remove_regions(node, new)
                note = f" (cleanup: {problem})" if problem else " (removed)"
                failures.append(f"leak check: {node.name}: the test left {leaks}{note}")
        self.guard = None
        self.before = {}
        return failures

    def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(SshError, OSError):
                if node.alive():
                    node.stop_all()
        self.session.stop()


def boot(settings: Settings) -> UserCluster:
    """Bring the settings' cluster up with the driver loaded on each node."""
    from obmm.testbed.session import bring_up, default_topology
    from obmm.testbed.vm.cluster import default_logdir

    assert settings.name is not None
    session = bring_up(
        settings,
        purpose="pytest cluster",
        default_topology=default_topology(settings.nodes),
        logdir=default_logdir(settings.name),
    )
    return UserCluster(session)


__all__: Sequence[str] = (
    "ObmmState",
    "UserCluster",
    "boot",
    "node_state",
    "remove_regions",
)
