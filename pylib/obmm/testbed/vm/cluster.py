"""Cluster life cycle: boot N QEMU nodes, find them again later, tear everything down.

A cluster named NAME lives in the run directory ``/dev/shm/obmm-testbed-NAME/`` (tmpfs; override
the parent with ``$OBMM_TESTBED_RUN_ROOT``): the nodes' RAM files, the control region, qcow2
overlays, QMP sockets, pid files and ``state.json``, which later CLI invocations read.  Console
logs and QEMU's own stderr go to the log directory (default ``<cache>/logs/NAME/``) so they
survive ``down`` for debugging.  ``stop()`` kills every QEMU and removes the run directory.

Two clusters never collide: the run directory is per name, and ports are allocated under a
global lock, checked free, and re-allocated if QEMU still fails to bind one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from obmm import envvars
from obmm.testbed.builds.image import Image, create_overlay
from obmm.testbed.errors import TestbedError
from obmm.testbed.parallel import on_each
from obmm.testbed.paths import cache_dir, qemu_dir, run_root
from obmm.testbed.progress import Progress
from obmm.testbed.settings import scaled
from obmm.testbed.ssh import Connection, GuestGone, Target
from obmm.testbed.topology import Topology
from obmm.testbed.vm import kmemleak, numa, ownership, pvh, qemu
from obmm.testbed.vm import snapshot as snapshot_mod
from obmm.testbed.vm.machine import Machine
from obmm.testbed.vm.timeline import READY_LINE, ConsoleWatch, Timeline, cpu_seconds
from obmm.tools import interrupts, logscan

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
OWNER_FILE = "owner.json"
RUN_PREFIX = "obmm-testbed-"
PORT_RETRIES = 3
QMP_QUIT_TIMEOUT_S = 5.0
TERM_TIMEOUT_S = 5.0
HUB_READY_TIMEOUT_S = 15.0
CONSOLE_TAIL_LINES = 40
BIND_GRACE_S = 0.2
__all__ = ["READY_LINE"]  # re-exported: its home is obmm.testbed.vm.timeline
CONSOLE_POLL_S = 0.02
#: The first login after the ready line: sshd listens, so a slow answer is load, not absence.
READY_LOGIN_TIMEOUT_S = 10.0
#: A cold boot whose console stays silent this long before sshd (times the timeout scale;
#: boots print a line every few seconds) has hung: the debug kernel has, on a loaded host, in
#: its early RCU-tasks self test.  The cluster then boots again, BOOT_RETRIES times at most.
BOOT_STALL_S = 60.0
BOOT_RETRIES = 1
PR_SET_PDEATHSIG = 1
DEFAULT_NAME = "default"  # the cluster `up`, `ssh`, `down` use unless told
# Host randomness written into a restored guest's pool.
SEED_BYTES = 64
#: A login to a booted node on an idle machine takes well under this.
CONNECT_S = 30.0
_DEATH_MARKERS = ("Kernel panic", "BUG:", "Oops:", "general protection fault")


class ClusterError(TestbedError, RuntimeError):
    """The cluster cannot be started or found."""


class BootStalled(ClusterError):
    """A node's console printed nothing for BOOT_STALL_S while it booted."""


class NodeDied(GuestGone):
    """A node's QEMU exited (kernel panic, crash, or killed); carries the console tail."""

    def __init__(self, node: int, returncode: int | None, console_tail: str) -> None:
        status = "" if returncode is None else f" (QEMU exit status {returncode})"
        super().__init__(f"node{node}: QEMU exited{status}; last console lines:\n{console_tail}")
        self.node = node
        self.console_tail = console_tail


def rundir_for(name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise ClusterError(f"invalid cluster name {name!r}")
    return run_root() / f"{RUN_PREFIX}{name}"


def default_logdir(name: str) -> Path:
    return cache_dir() / "logs" / name


def load_topology(spec: str) -> Topology:
    """A topology by name (qemu/topologies/NAME.json) or path."""
    path = Path(spec)
    if not path.suffix:
        path = qemu_dir() / "topologies" / f"{spec}.json"
    return Topology.load(path)


def boot_timeout(topology: Topology, accel: str, scale: float = 1.0) -> float:
    """Seconds to wait for every node's sshd: TCG nodes share the host's cores (times `scale`,
    the settings' timeout_scale, for slower kernels)."""
    if accel == "kvm":
        return (60.0 + 10.0 * topology.nodes) * scale
    cores = os.cpu_count() or 1
    base = 120.0 + 60.0 * max(0, topology.nodes - 1) * max(1.0, 2.0 / cores)
    return base * scale


def allocate_ports(count: int, avoid: Sequence[int] = ()) -> list[int]:
    """Free TCP ports on 127.0.0.1, distinct from each other and from `avoid`."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            port = int(s.getsockname()[1])
            if port not in avoid and port not in ports:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


def _ports_in_use_by_clusters() -> set[int]:
    used: set[int] = set()
    for d in run_root().glob(f"{RUN_PREFIX}*"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            state = json.loads((d / STATE_FILE).read_text())
            used.update(int(n["ssh_port"]) for n in state["nodes"])
    return used


@contextlib.contextmanager
def _global_lock() -> Iterator[None]:
    root = run_root()
    root.mkdir(parents=True, exist_ok=True)
    # Lock the run root directory itself: no lock file is left on tmpfs after the last cluster.
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_pid_start_time = ownership.pid_start_time


def _pdeathsig() -> None:
    # Runs in the child between fork and exec: die with the process that owns the cluster.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class NodeProcess:
    """One node's QEMU process and its files (not :class:`obmm.testbed.node.Node`, the interface
    to a node's system: GuestNode wraps a cluster's NodeProcess in that)."""

    index: int
    ssh_port: int
    pid: int
    pid_start: int | None
    console_log: Path
    qemu_log: Path
    qmp_socket: Path
    overlay: Path
    argv: list[str] = field(default_factory=list)
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        return f"node{self.index}"

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        start = _pid_start_time(self.pid)
        return start is not None and (self.pid_start is None or start == self.pid_start)

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def console_since(self, marker: str) -> str:
        try:
            text = self.console_log.read_bytes().decode(errors="replace").replace("\r", "")
        except OSError:
            return ""
        return logscan.after_marker(text, marker)

    def console_tail(self, lines: int = CONSOLE_TAIL_LINES) -> str:
        try:
            text = self.console_log.read_bytes().decode(errors="replace")
        except OSError:
            return "(no console log)"
        all_lines = text.replace("\r", "").splitlines()
        start = len(all_lines) - lines
        # Show a panic from its first line even when its trace is longer than `lines`.
        for i in range(len(all_lines) - 1, max(-1, len(all_lines) - 4 * lines), -1):
            if any(m in all_lines[i] for m in _DEATH_MARKERS):
                start = min(start, i - 2)
                break
        return "\n".join(all_lines[max(0, start) :])

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "ssh_port": self.ssh_port,
            "pid": self.pid,
            "pid_start": self.pid_start,
            "console_log": str(self.console_log),
            "qemu_log": str(self.qemu_log),
            "qmp_socket": str(self.qmp_socket),
            "overlay": str(self.overlay),
            "argv": self.argv,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeProcess:
        return cls(
            index=int(d["index"]),
            ssh_port=int(d["ssh_port"]),
            pid=int(d["pid"]),
            pid_start=d.get("pid_start"),
            console_log=Path(d["console_log"]),
            qemu_log=Path(d["qemu_log"]),
            qmp_socket=Path(d["qmp_socket"]),
            overlay=Path(d["overlay"]),
            argv=list(d.get("argv", [])),
        )


@dataclass
class Cluster:
    name: str
    rundir: Path
    logdir: Path
    topology: Topology
    accel: str
    image: Image
    init: str = qemu.INIT_FAST
    nodes: list[NodeProcess] = field(default_factory=list)
    # The snapshot this cluster was restored from (None: booted cold).
    restored_from: str | None = None
    #: The process the cluster dies with (None: `up`/`--keep`, owned by nobody until `down`).
    owner: ownership.Owner | None = None
    # The inter-node network hub (obmm.testbed.vm.hub) of a multi-node cluster.
    hub_pid: int | None = None
    hub_pid_start: int | None = None
    hub_popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    qemu_binary: str = envvars.QEMU.default
    _ready: dict[int, Connection] = field(default_factory=dict, repr=False, compare=False)
    #: Where the start's seconds went (obmm.testbed.vm.timeline); kept in state.json.
    timeline: Timeline = field(default_factory=Timeline, repr=False, compare=False)
    _kernel: Path | None = field(default=None, repr=False, compare=False)
    #: Where the start's lines went (its front end's); the stop says it begins there too.
    progress: Progress | None = field(default=None, repr=False, compare=False)
    #: Seconds of a silent console that make wait_ssh raise BootStalled (None: no limit).
    boot_stall: float | None = field(default=None, repr=False, compare=False)
    #: The settings' timeout_scale (slower kernels): connect's default bound scales with it.
    timeout_scale: float = field(default=1.0, repr=False, compare=False)

    # -- discovery --------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.rundir / STATE_FILE

    def save(self) -> None:
        state = {
            "name": self.name,
            "rundir": str(self.rundir),
            "logdir": str(self.logdir),
            "topology": self.topology.to_dict(),
            "accel": self.accel,
            "init": self.init,
            "restored_from": self.restored_from,
            "image": str(self.image.directory),
            "owner": self.owner.to_dict() if self.owner else None,
            "hub_pid": self.hub_pid,
            "hub_pid_start": self.hub_pid_start,
            "qemu_binary": self.qemu_binary,
            "nodes": [n.to_dict() for n in self.nodes],
            "timeline": self.timeline.to_dict(),
            "saved_at": time.time(),
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_file)

    @classmethod
    def attach(cls, name: str = DEFAULT_NAME) -> Cluster:
        """The cluster `name` started earlier (by this or another process)."""
        rundir = rundir_for(name)
        try:
            state = json.loads((rundir / STATE_FILE).read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster named {name!r} (no {rundir / STATE_FILE})") from None
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cluster {name!r}: unreadable state: {exc}") from exc
        try:
            return cls._from_state(state)
        except (KeyError, TypeError, ValueError) as exc:
            # A state another obmm-testbed version wrote (a topology key this one lacks): a
            # clear error for `down`/`status`, which the reaper treats like any unreadable state.
            raise ClusterError(
                f"cluster {name!r}: state this version cannot read ({exc}); was it started by "
                f"another obmm-testbed version? Stop it with that one, or remove {rundir}"
            ) from exc

    @classmethod
    def _from_state(cls, state: dict[str, Any]) -> Cluster:
        return cls(
            name=state["name"],
            rundir=Path(state["rundir"]),
            logdir=Path(state["logdir"]),
            topology=Topology.from_mapping(state["topology"]),
            accel=state["accel"],
            init=state.get("init", qemu.INIT_SYSTEMD),
            restored_from=state.get("restored_from"),
            image=Image.open(Path(state["image"])),
            owner=ownership.Owner.from_dict(state.get("owner")),
            hub_pid=state.get("hub_pid"),
            hub_pid_start=state.get("hub_pid_start"),
            qemu_binary=state.get("qemu_binary", envvars.QEMU.default),
            nodes=[NodeProcess.from_dict(n) for n in state["nodes"]],
            timeline=Timeline.from_dict(state.get("timeline")) or Timeline(),
        )

    @staticmethod
    def names() -> list[str]:
        return sorted(
            d.name[len(RUN_PREFIX) :] for d in run_root().glob(f"{RUN_PREFIX}*") if d.is_dir()
        )

    # -- start ------------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        machine: Machine,
        *,
        name: str = DEFAULT_NAME,
        logdir: Path | None = None,
        detach: bool = False,
        wait: bool = True,
        timeout: float | None = None,
        timeout_scale: float = 1.0,
        progress: Progress | None = None,
        snapshot: str = snapshot_mod.MODE_AUTO,
        timeline: Timeline | None = None,
        boot_retries: int = BOOT_RETRIES,
    ) -> Cluster:
        """Boot every node of `machine` and (by default) wait until each accepts an SSH login.

        With `detach` the QEMUs outlive this process (the CLI's `up`: it calls :meth:`disown`
        once the cluster is ready); otherwise they are killed if it dies.  On any failure,
        Ctrl-C included, everything started is torn down.
        `snapshot` ("auto" or "off"): with "auto" a saved snapshot of this cluster shape is
        restored instead of booting (see :mod:`obmm.testbed.vm.snapshot`), and a cold boot saves
        one.  A snapshot that does not fit or verify is reported and the cluster boots cold.
        Front ends come here through :func:`obmm.testbed.session.bring_up`.  `timeline`: where
        the steps are marked (default: a new one starting now).
        """
        snap_mode = snapshot
        image, topology, accel, init = machine.image, machine.topology, machine.accel, machine.init
        if init not in qemu.INIT_MODES:
            raise ClusterError(f"init must be one of {', '.join(qemu.INIT_MODES)}, got {init!r}")
        if snap_mode not in snapshot_mod.MODES:
            raise ClusterError(f"snapshot must be one of {', '.join(snapshot_mod.MODES)}")
        rundir = rundir_for(name)
        logdir = logdir or default_logdir(name)
        progress = progress or Progress(f"cluster {name}")
        cluster = cls(
            name=name,
            rundir=rundir,
            logdir=logdir,
            topology=topology,
            accel=accel,
            image=image,
            init=init,
            # Owned while it comes up, detached or not: a `up` killed during boot leaves
            # nothing (disown() hands a detached cluster to nobody once it is ready).
            owner=ownership.Owner.me(),
            qemu_binary=machine.binary,
            progress=progress,
            timeline=timeline or Timeline(),
        )
        marks = cluster.timeline

        def again(retries: int) -> Cluster:
            """Start over cold (the steps before the cluster's own stand; its own start again)."""
            return cls.start(
                machine, name=name, logdir=logdir, detach=detach, wait=wait, timeout=timeout,
                timeout_scale=timeout_scale, progress=progress, snapshot=snap_mode,
                boot_retries=retries,
                timeline=Timeline(
                    origin=marks.origin,
                    cluster={k: v for k, v in marks.cluster.items() if k in _BEFORE},
                ),
            )  # fmt: skip

        key: snapshot_mod.Key | None = None
        snap: snapshot_mod.Snapshot | None = None
        try:
            with _global_lock():
                cls._reap_stale(name)
                rundir.mkdir(mode=0o700, parents=True)
                # First: a start killed before state.json exists is still attributed.
                (rundir / OWNER_FILE).write_text(
                    json.dumps(cluster.owner.to_dict() if cluster.owner else None) + "\n"
                )
                logdir.mkdir(parents=True, exist_ok=True)
                if snap_mode == snapshot_mod.MODE_AUTO and wait:
                    try:
                        key = cluster._snapshot_key(machine.extra_args)
                    except snapshot_mod.SnapshotError as exc:
                        progress.line(f"snapshots off for this cluster: {exc}")
                    if key is not None:
                        snap = cluster._restore_files(key, progress)
                if snap is None:
                    cluster._prepare_files()
                marks.kind = "boot" if snap is None else "restore"
                marks.mark("files")
                if topology.nodes > 1:
                    cluster._start_hub(detach=detach)
                cluster._launch_all(
                    detach=detach, extra_args=machine.extra_args, incoming=snap is not None
                )
                if topology.nodes > 1:
                    cluster._wait_hub()
                marks.mark("launched")
                cluster.restored_from = snap.digest if snap is not None else None
                cluster.save()
            how = f"restored from snapshot {snap.digest}" if snap else "started"
            progress.line(
                f"{topology.nodes} node(s) {how} ({accel}); consoles in {logdir}; ssh ports "
                + ", ".join(str(n.ssh_port) for n in cluster.nodes)
            )
            if snap is not None:
                try:
                    snapshot_mod.load_states(
                        [n.qmp_socket for n in cluster.nodes], snap, cluster._qtest_sockets()
                    )
                    for n in cluster.nodes:
                        marks.mark("loaded", n.index)
                except snapshot_mod.SnapshotError as exc:
                    why = snapshot_mod.refusal(str(exc), cluster._exited_nodes())
                    progress.line(f"snapshot {snap.digest} not used: {why}; booting cold")
                    snapshot_mod.discard(snap)
                    cluster.stop()
                    return again(boot_retries)
            if wait:
                cluster.timeout_scale = max(1.0, timeout_scale)
                cluster.boot_stall = BOOT_STALL_S * cluster.timeout_scale
                wait_s = timeout or boot_timeout(topology, accel, timeout_scale)
                try:
                    cluster.wait_ssh(wait_s, progress)
                except BootStalled as exc:
                    if boot_retries <= 0:
                        raise
                    progress.line(f"{exc}\nbooting the cluster again")
                    cluster.stop()
                    return again(boot_retries - 1)
            if key is not None and snap is None:
                cluster._save_snapshot(key, progress)
                marks.mark("snapshot")
        except BaseException:
            cluster.stop()
            raise
        return cluster

    # -- snapshots --------------------------------------------------------------------------

    def _snapshot_key(self, extra_args: Callable[[int], Sequence[str]] | None) -> snapshot_mod.Key:
        argvs = []
        for i in range(self.topology.nodes):
            extra = tuple(extra_args(i)) if extra_args else ()
            argv = qemu.build_argv(self.topology, self._node_launch(i, 0, extra))
            argvs.append(snapshot_mod.blank_argv(argv, self.rundir, self.logdir, 0))
        return snapshot_mod.Key.make(
            image_fingerprint=str(self.image.manifest.get("fingerprint", self.image.directory)),
            qemu=snapshot_mod.qemu_identity(self.qemu_binary),
            topology=self.topology,
            init=self.init,
            accel=self.accel,
            argvs=argvs,
        )

    def _restore_files(
        self, key: snapshot_mod.Key, progress: Progress
    ) -> snapshot_mod.Snapshot | None:
        """The snapshot for `key` with its files copied into the run dir, or None (cold)."""
        try:
            snap = snapshot_mod.find(key)
            if snap is None:
                progress.line(f"no snapshot of this cluster shape yet ({key.digest}); booting cold")
                return None
            snap.verify_states()
            snap.restore_into(self.rundir)
            return snap
        except snapshot_mod.SnapshotError as exc:
            progress.line(f"snapshot not used: {exc}; booting cold and saving a new one")
            shutil.rmtree(snapshot_mod.snapshots_dir() / key.digest, ignore_errors=True)
            for f in self.rundir.iterdir():
                f.unlink()
            return None

    def _qtest_sockets(self) -> list[Path] | None:
        """Where a restore writes each node's PCI configuration, on a machine with ECAM only
        (obmm.testbed.arch's pci_config); None: through the configuration ports."""
        if self.image.arch.pci_config != "ecam":
            return None
        return [self.rundir / f"node{i}.qtest" for i in range(self.topology.nodes)]

    def _exited_nodes(self) -> list[tuple[int, int | None, str]]:
        """(index, exit status, QEMU log) of each node whose QEMU has exited."""
        out = []
        # The monitor closes as QEMU exits: give it (all nodes together) a moment to finish.
        deadline = time.monotonic() + 1.0
        for n in self.nodes:
            if n.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    n.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            if not n.alive():
                with contextlib.suppress(OSError):
                    out.append((n.index, n.returncode(), n.qemu_log.read_text(errors="replace")))
        return out

    def _save_snapshot(self, key: snapshot_mod.Key, progress: Progress) -> None:
        """Save this freshly booted, idle cluster; a failure costs only the snapshot."""
        try:
            snap = snapshot_mod.save(
                key, self.rundir, [n.qmp_socket for n in self.nodes], self.topology.nodes
            )
        except snapshot_mod.SnapshotError as exc:
            progress.line(f"snapshot not saved: {exc}")
            return
        progress.line(f"snapshot {snap.digest} saved ({snap.size >> 20} MiB)")

    @staticmethod
    def _reap_stale(name: str) -> None:
        rundir = rundir_for(name)
        if not rundir.exists():
            return
        try:
            old = Cluster.attach(name)
        except Exception:  # unreadable leftovers of a killed start: no live QEMU recorded
            shutil.rmtree(rundir, ignore_errors=True)
            return
        if any(n.alive() for n in old.nodes):
            raise ClusterError(
                f"cluster {name!r} is already running ({rundir}); "
                f"`obmm-testbed down --name {name}` first, or pick another --name"
            )
        log.info("removing stale cluster state %s", rundir)
        old.stop()

    def _prepare_files(self) -> None:
        size = self.topology.memory_mib << 20
        # Pre-size every RAM file so each QEMU maps the same, complete files whatever the
        # start order (a window may be opened before its owner starts).
        for i in range(self.topology.nodes):
            with qemu.ram_file(self.rundir, i).open("wb") as f:
                f.truncate(size)
        with qemu.control_file(self.rundir).open("wb") as f:
            f.truncate(qemu.CONTROL_SIZE_MIB << 20)
        for i in range(self.topology.nodes):
            create_overlay(self.image, self.rundir / f"node{i}.qcow2")

    def _start_hub(self, *, detach: bool) -> None:
        """Start the inter-node network hub (:meth:`_wait_hub` waits for its socket).  The
        QEMUs start meanwhile: a node's dgram backend only sends to the hub's socket, and no
        guest sends a frame before it has booted or been resumed, after the wait."""
        import obmm

        sock = qemu.hub_socket(self.rundir)
        longest = max(
            str(sock), str(qemu.net_socket(self.rundir, self.topology.nodes - 1)), key=len
        )
        if len(longest) > qemu.MAX_UNIX_PATH:
            raise ClusterError(
                f"run directory path too long for a unix socket: {longest} "
                "(set OBMM_TESTBED_RUN_ROOT to a shorter directory)"
            )
        env = dict(os.environ)
        pkg_root = str(Path(obmm.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        log_path = self.logdir / "hub.log"
        with log_path.open("wb") as out:
            popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "obmm.testbed.vm.hub",
                    str(self.rundir),
                    str(self.topology.nodes),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=None if detach else _pdeathsig,
            )
        self.hub_popen = popen
        self.hub_pid = popen.pid
        self.hub_pid_start = _pid_start_time(popen.pid)

    def _wait_hub(self) -> None:
        """Until the hub's socket exists (ClusterError if the hub exits or takes too long)."""
        sock, popen = qemu.hub_socket(self.rundir), self.hub_popen
        assert popen is not None
        log_path = self.logdir / "hub.log"
        deadline = time.monotonic() + HUB_READY_TIMEOUT_S
        while not sock.exists():
            if popen.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(
                    f"the network hub did not start; see {log_path}:\n" + _read_tail(log_path)
                )
            time.sleep(0.01)

    def hub_alive(self) -> bool:
        if self.hub_pid is None:
            return False
        if self.hub_popen is not None:
            return self.hub_popen.poll() is None
        start = _pid_start_time(self.hub_pid)
        return start is not None and (self.hub_pid_start is None or start == self.hub_pid_start)

    def _stop_hub(self) -> None:
        if self.hub_pid is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self.hub_alive():
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.hub_pid, sig)
            deadline = time.monotonic() + TERM_TIMEOUT_S
            while self.hub_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.hub_popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.hub_popen.wait(timeout=1)

    def _launch_all(
        self,
        *,
        detach: bool,
        extra_args: Callable[[int], Sequence[str]] | None,
        incoming: bool = False,
    ) -> None:
        """Start every QEMU at once, then check each bound its port (retry those that lost it)."""
        # The NUMA tables are not part of a snapshot's files: a pure function of the shape.
        numa.write_tables(
            self.rundir,
            self.image.arch,
            self.topology,
            dump_argv=lambda out: qemu.dtb_dump_argv(
                self.topology, self._node_launch(0, 0, ()), out
            ),
        )
        avoid = _ports_in_use_by_clusters()
        ports = allocate_ports(self.topology.nodes, avoid=sorted(avoid))
        extras = [tuple(extra_args(i)) if extra_args else () for i in range(self.topology.nodes)]
        if incoming:
            # Restoring a snapshot: each QEMU waits for its state on QMP (snapshot.load_states).
            qtest = self._qtest_sockets()
            extras = [
                (*e, *(snapshot_mod.qtest_argv(qtest[i]) if qtest else ()), "-incoming", "defer")
                for i, e in enumerate(extras)
            ]
        pending = list(range(self.topology.nodes))
        started: dict[int, NodeProcess] = {}
        for attempt in range(PORT_RETRIES):
            for i in pending:
                started[i] = self._launch(i, ports[i], detach=detach, extra=extras[i])
            self.nodes = [started[i] for i in sorted(started)]
            lost = [i for i in pending if not self._bound(started[i])]
            for i in lost:
                log.warning(
                    "node%d: port %d taken (attempt %d); retrying", i, ports[i], attempt + 1
                )
                del started[i]
                ports[i] = allocate_ports(1, avoid=sorted(avoid | set(ports)))[0]
            self.nodes = [started[i] for i in sorted(started)]
            pending = lost
            if not pending:
                return
        i = pending[0]
        raise ClusterError(
            f"node{i}: QEMU failed to start; see {self.logdir / f'node{i}.qemu.log'}:\n"
            + _read_tail(self.logdir / f"node{i}.qemu.log")
        )

    def _launch(self, i: int, port: int, *, detach: bool, extra: tuple[str, ...]) -> NodeProcess:
        console = self.logdir / f"node{i}.console.log"
        qemu_log = self.logdir / f"node{i}.qemu.log"
        console.unlink(missing_ok=True)
        launch = self._node_launch(i, port, extra)
        argv = qemu.build_argv(self.topology, launch)
        log.debug("node%d: %s", i, " ".join(argv))
        with qemu_log.open("wb") as out:
            out.write(("$ " + " ".join(argv) + "\n").encode())
            out.flush()
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Own session: a terminal's Ctrl-C goes to the harness, which then shuts the
                # nodes down in order (and reports an interrupt, not a "crashed" guest).
                start_new_session=True,
                preexec_fn=None if detach else _pdeathsig,
            )
        self.timeline.mark("qemu", i)
        return NodeProcess(
            index=i,
            ssh_port=port,
            pid=popen.pid,
            pid_start=_pid_start_time(popen.pid),
            console_log=console,
            qemu_log=qemu_log,
            qmp_socket=launch.qmp_socket,
            overlay=launch.overlay,
            argv=argv,
            popen=popen,
        )

    def _node_launch(self, i: int, port: int, extra: tuple[str, ...]) -> qemu.NodeLaunch:
        return qemu.NodeLaunch(
            index=i,
            ssh_port=port,
            rundir=self.rundir,
            overlay=self.rundir / f"node{i}.qcow2",
            console_log=self.logdir / f"node{i}.console.log",
            qmp_socket=self.rundir / f"node{i}.qmp",
            pidfile=self.rundir / f"node{i}.pid",
            kernel=self._boot_kernel(),
            initrd=self._initrd(),
            accel=self.accel,
            init=self.init,
            firmware=self._firmware(),
            qemu_binary=self.qemu_binary,
            extra_args=extra,
            fast_init_modules=self.image.fast_init_modules,
            extra_cmdline=self.image.extra_cmdline,
            tcg_cpu=self.image.tcg_cpu,
            arch=self.image.arch,
        )

    def _boot_kernel(self) -> Path:
        """The fast boot's kernel as an ELF started at its PVH entry (no decompression under
        TCG; obmm.testbed.vm.pvh), when it has one; else the image's bzImage."""
        if self._kernel is None:
            self._kernel = self.image.kernel
            if self.init == qemu.INIT_FAST and self.image.arch.pvh_entry:
                self._kernel = pvh.pvh_kernel(self.image.kernel, cache_dir() / "kernels") or (
                    self.image.kernel
                )
        return self._kernel

    def _firmware(self) -> str | None:
        """qboot for the fast boot when QEMU ships it, else QEMU's default (SeaBIOS)."""
        firmware = self.image.arch.fast_firmware
        if self.init == qemu.INIT_FAST and firmware and Path(firmware).is_file():
            return firmware
        return None

    def _initrd(self) -> Path:
        if self.init == qemu.INIT_SYSTEMD:
            return self.image.initrd
        fast = self.image.fast_initrd
        if fast is None:
            raise ClusterError(
                f"image {self.image.directory} has no fast-boot initramfs; "
                "use --init systemd (or OBMM_TESTBED_INIT=systemd) with this recipe"
            )
        return fast

    def _bound(self, node: NodeProcess, timeout: float = 10.0) -> bool:
        """Wait until QEMU is past device setup (its QMP socket exists and its SSH port
        listens), or has exited (a port another process took meanwhile: QEMU exits)."""
        deadline = time.monotonic() + timeout
        monitor: float | None = None
        while time.monotonic() < deadline:
            if not node.alive():
                return False
            if monitor is None and node.qmp_socket.exists():
                monitor = time.monotonic()
            # hostfwd is set up before the monitor, so QEMU's port listens by now: no wait.
            # A bind failure exits QEMU within BIND_GRACE_S (a stand-in that binds nothing
            # counts as bound then).
            if monitor is not None and (
                _listening(node.ssh_port) or time.monotonic() - monitor > BIND_GRACE_S
            ):
                self.timeline.mark("bound", node.index)
                return node.alive()
            time.sleep(0.01)
        return node.alive()

    # -- running ----------------------------------------------------------------------------

    def check_alive(self) -> None:
        """Raise NodeDied for the first node whose QEMU has exited."""
        for node in self.nodes:
            if not node.alive():
                raise NodeDied(node.index, node.returncode(), node.console_tail())

    def all_alive(self) -> bool:
        return all(n.alive() for n in self.nodes)

    def target(self, index: int) -> Target:
        node = self.nodes[index]
        return Target(
            host="127.0.0.1",
            port=node.ssh_port,
            key_file=self.image.ssh_key,
            host_key=self.image.host_key,
        )

    def connect(
        self, index: int, timeout: float | None = None, *, node_only: bool = False
    ) -> Connection:
        """An SSH connection to node `index`, within `timeout` seconds (default CONNECT_S,
        times the timeout scale and the machine's busy_factor).  It fails once any node died,
        or with `node_only` once this node died (so survivors of a killed node stay usable)."""
        if timeout is None:
            timeout = scaled(CONNECT_S, scale=self.timeout_scale)
        alive = self.nodes[index].alive if node_only else self._alive_fn(index)
        conn = Connection(self.target(index), alive=alive, name=f"node{index}")
        try:
            conn.connect(time.monotonic() + timeout)
        except GuestGone:
            if not node_only:
                self.check_alive()
            raise
        return conn

    def fabric_ip(self, index: int) -> str:
        """Node `index`'s address on the inter-node network."""
        return qemu.fabric_ip(index)

    def _alive_fn(self, index: int) -> Callable[[], bool]:
        # A cluster is one fabric: any node dying ends the run, not just the one in use.
        return self.all_alive

    def wait_ssh(self, timeout: float, progress: Progress | None = None) -> None:
        """Wait for every node's sshd at once (nodes boot in parallel; so do the waits)."""
        deadline = time.monotonic() + timeout

        def wait_one(node: NodeProcess) -> None:
            self._wait_node(node, deadline)
            if progress is not None:
                progress.line(f"{node.name}: ssh ready on 127.0.0.1:{node.ssh_port}")

        on_each(self.nodes, wait_one)

    def _wait_node(self, node: NodeProcess, deadline: float) -> None:
        first_attempt: float | None = None
        watch = ConsoleWatch(node.console_log, self.timeline, node.index)
        if self.restored_from is not None:
            first_attempt = READY_LOGIN_TIMEOUT_S  # saved with sshd listening
        elif self.init == qemu.INIT_FAST and self._wait_console(node, watch, deadline):
            # The fast init says when sshd listens: one login then, no timed-out probing.
            log.debug("%s: the console says sshd listens", node.name)
            first_attempt = READY_LOGIN_TIMEOUT_S
        conn = Connection(self.target(node.index), alive=node.alive, name=node.name)
        try:
            conn.connect(deadline, first_attempt=first_attempt)
            self.timeline.mark("login", node.index)
            if self.restored_from is None:
                watch.poll(live=self.init == qemu.INIT_FAST)  # the systemd boot's, after the fact
        except GuestGone:
            conn.close()
            self.check_alive()
            raise
        except Exception as exc:
            conn.close()
            raise ClusterError(
                f"{node.name}: {exc}\nlast console lines ({node.console_log}):\n"
                + node.console_tail()
            ) from exc
        try:
            if self.restored_from is not None:
                # The guest resumes with the snapshot's clock and pool: give it the host's.
                cmd = snapshot_mod.guest_fixup_command(time.time(), os.urandom(SEED_BYTES))
                result = conn.run(cmd, timeout=60)
                if not result.ok:
                    raise ClusterError(f"{node.name}: after restore: {result.err.strip()}")
                self.timeline.mark("configured", node.index)
            # The fast init brings the inter-node NIC up from the kernel command line.
            elif self.topology.nodes > 1 and self.init == qemu.INIT_SYSTEMD:
                self._configure_fabric_net(conn, node)
                self.timeline.mark("configured", node.index)
        except BaseException:
            conn.close()
            raise
        self.timeline.mark_cpu(node.name, cpu_seconds(node.pid))
        # Kept for the first user of the node (take_connection): a login costs most of a
        # restore's second under TCG.
        self._ready[node.index] = conn

    def disown(self) -> None:
        """Owned by nobody from now on: it runs until `obmm-testbed down` (its QEMUs were
        started detached); the reaper of dead owners leaves it alone."""
        self.owner = None
        (self.rundir / OWNER_FILE).write_text("null\n")
        self.save()

    def take_connection(self, index: int) -> Connection | None:
        """The connection the boot's readiness check left open to node `index`, once."""
        return self._ready.pop(index, None)

    def _wait_console(self, node: NodeProcess, watch: ConsoleWatch, deadline: float) -> bool:
        """Until the fast init's READY_LINE appears on the node's console (True), or the
        deadline (False), marking the console's steps on the way; a QEMU that exits meanwhile
        raises NodeDied, a console silent for `boot_stall` seconds BootStalled."""
        stall = self.boot_stall
        since = time.monotonic()
        while time.monotonic() < deadline:
            watch.poll()
            if watch.seen("sshd"):
                return True
            if not node.alive():
                self.check_alive()
            silent = time.monotonic() - (watch.grew_at or since)
            if stall is not None and silent > stall:
                raise BootStalled(
                    f"{node.name}: no console output for {silent:.0f} s while booting; last "
                    f"console lines ({node.console_log}):\n{node.console_tail(10)}"
                )
            time.sleep(CONSOLE_POLL_S)
        return False

    def _configure_fabric_net(self, conn: Connection, node: NodeProcess) -> None:
        """Give the node its link-local address on the inter-node NIC."""
        result = conn.run(qemu.fabric_net_command(node.index), timeout=60)
        if not result.ok:
            raise ClusterError(
                f"{node.name}: cannot configure the inter-node network: {result.err.strip()}"
            )
        log.info(
            "%s: %s is %s on %s",
            node.name,
            result.out.strip(),
            qemu.fabric_ip(node.index),
            "the inter-node network",
        )

    # -- stop -------------------------------------------------------------------------------

    def close_connections(self) -> None:
        """Close what the readiness check left open (the nodes run on)."""
        for conn in self._ready.values():
            conn.close()
        self._ready.clear()

    def stop(self) -> None:
        """Kill every QEMU (QMP quit, then SIGTERM, then SIGKILL) and remove the run dir.

        Once begun it finishes: SIGINT and SIGTERM meanwhile wait for it (one line says so),
        then take effect.  One line says it begins (on the start's progress, else stderr): the
        few seconds until the command ends are the teardown, not a hang."""
        with interrupts.signals_deferred(f"stopping cluster {self.name}"):
            if self.owner is None:
                self._claim()
            with contextlib.suppress(OSError, ValueError):  # a closed stderr stops nothing
                progress = self.progress or Progress(f"cluster {self.name}")
                progress.line(f"stopping cluster {self.name}")
            self._stop()

    def _claim(self) -> None:
        """A cluster owned by nobody (`up`) is this process's while it stops it: if this
        process dies meanwhile (a SIGKILLed `down`), the next testbed command removes what is
        left (the hub and the run directory would otherwise stay until another `down`)."""
        self.owner = ownership.Owner.me()
        with contextlib.suppress(OSError):
            (self.rundir / OWNER_FILE).write_text(json.dumps(self.owner.to_dict()) + "\n")
            self.save()

    def _stop(self) -> None:
        self.close_connections()
        if self.image.manifest.get("debug_kernel") and self.nodes:
            # The debug kernel's leak check needs the nodes alive (obmm.testbed.vm.kmemleak).
            kmemleak.scan_nodes(
                self.name,
                [n.index for n in self.nodes],
                lambda i: self.connect(i, node_only=True),
                lambda i: self.nodes[i].alive(),
            )
        asked = [node for node in self.nodes if node.alive() and self._qmp_quit(node)]
        deadline = time.monotonic() + QMP_QUIT_TIMEOUT_S
        for node in asked:
            self._wait_gone(node, deadline)
        for node in self.nodes:
            if node.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGTERM)
                    os.kill(node.pid, signal.SIGCONT)  # a stopped QEMU acts on SIGTERM only then
        deadline = time.monotonic() + TERM_TIMEOUT_S
        for node in self.nodes:
            self._wait_gone(node, deadline)
            if node.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGKILL)
                self._wait_gone(node, time.monotonic() + TERM_TIMEOUT_S)
            if node.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.popen.wait(timeout=1)
        self._stop_hub()
        shutil.rmtree(self.rundir, ignore_errors=True)

    @staticmethod
    def _wait_gone(node: NodeProcess, deadline: float) -> None:
        while node.alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    @staticmethod
    def _qmp_quit(node: NodeProcess) -> bool:
        """Ask QEMU to quit; False if its monitor does not answer (signals follow at once).

        Bounded in time: a stopped or wedged QEMU accepts the socket but never greets, and
        the legacy synchronous QMP client would wait for that forever.
        """
        if not node.qmp_socket.exists():
            return False
        # qemu.qmp logs the expected end-of-file of a quitting QEMU at INFO.
        logging.getLogger("qemu.qmp").setLevel(logging.WARNING)
        try:
            return asyncio.run(asyncio.wait_for(_qmp_quit_async(node), QMP_QUIT_TIMEOUT_S))
        except Exception as exc:
            log.debug("%s: QMP quit: %s", node.name, exc)
            return False

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _qmp_quit_async(node: NodeProcess) -> bool:
    from qemu.qmp import QMPClient

    qmp = QMPClient(node.name)
    await qmp.connect(str(node.qmp_socket))
    try:
        await qmp.execute("quit")
    except Exception as exc:  # QEMU may close the socket before answering: it is quitting
        log.debug("%s: QMP quit answered with %s", node.name, exc)
    finally:
        with contextlib.suppress(Exception):
            await qmp.disconnect()
    return True


#: The command's steps before the cluster's own (kept when a refused snapshot boots cold).
_BEFORE = ("bring_up", "image", "kmod")
_TCP_LISTEN = "0A"


def _listening(port: int) -> bool:
    """Whether something listens on 127.0.0.1:`port` (/proc/net/tcp: no connection made, so
    nothing reaches the guest)."""
    want = f"0100007F:{port:04X}"
    try:
        with open("/proc/net/tcp") as f:
            next(f, None)
            for line in f:
                fields = line.split()
                if len(fields) > 3 and fields[1] == want and fields[3] == _TCP_LISTEN:
                    return True
    except OSError:
        return True  # no /proc: QMP's socket alone says it (hostfwd comes first)
    return False


def _read_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
