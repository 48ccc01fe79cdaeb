"""A cluster for other projects' tests: nodes with `run`, background processes, files, handles.

What the pytest plugin (:mod:`obmm.testbed.pytest_cluster`) hands a test, usable without pytest
too.  :func:`boot` builds the modules, boots (or restores from a snapshot) a cluster with the
emulator loaded on every node (:func:`obmm.testbed.provision.prepare_node`) and returns a
:class:`UserCluster`:

* ``cluster.nodes[i].run(command, timeout=...)``: exit status and both streams
  (:class:`obmm.testbed.ssh.Result`); at the deadline the command's process group is killed and
  :class:`~obmm.testbed.ssh.CommandTimeout` raised;
* ``node.start(command, ready_line=..., ready_port=...)``: a :class:`Process` in the background
  with ``wait``/``stop`` and its output;
* ``node.put``/``node.get`` and ``cluster.put`` (a directory to every node as one archive);
* ``node.fetch_handle(server, name, port)``: a handle another node serves with ``obmm.exchange``
  (or the C exchange helpers), fetched on this node over the inter-node network;
  ``node.serve_handles({name: handle})`` publishes handles made on the host;
* :meth:`UserCluster.check_start` / :meth:`UserCluster.check_end`: the kernel-log guard
  (:mod:`obmm.testbed.kguard`), the leak check (regions, shmdev nodes, pool ``used``) and the
  clean state between tests (processes stopped, leaked regions removed).

Every command gets the environment `obmm-testbed run` gives its commands
(:func:`obmm.testbed.run.node_env`: node id, CNA, EID, fabric addresses, ``OBMM_CFLAGS``).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from obmm.exchange import DEFAULT_PORT
from obmm.handle import Handle, HandleError
from obmm.testbed import qemu
from obmm.testbed.cluster import Cluster
from obmm.testbed.errors import TestbedError
from obmm.testbed.kguard import KernelLogGuard
from obmm.testbed.parallel import on_each
from obmm.testbed.provision import GUEST_ROOT
from obmm.testbed.run import (
    ENV_NODE_ADDR,
    ENV_NODE_CNA,
    ENV_NODE_EID,
    STOP_GRACE_S,
    Conn,
    copy_to_nodes,
    dir_archive,
    node_env,
    read_identity,
    stop_command,
    wait_port_command,
    wrap_command,
)
from obmm.testbed.ssh import CommandFailed, CommandTimeout, Connection, Result, SshError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
#: Where commands run unless given a cwd.
WORKDIR = PurePosixPath("/root")
READY_TIMEOUT_S = 60.0
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
FETCH_SCRIPT = """\
import sys
from obmm import exchange
if sys.argv[1] == "list":
    print("\\n".join(exchange.list_names(sys.argv[2], int(sys.argv[3]))))
else:
    print(exchange.fetch(sys.argv[2], int(sys.argv[3]), sys.argv[1]).encode().hex())
"""
SERVE_SCRIPT = """\
import sys
from obmm import exchange
from obmm.handle import Handle
handles = {a.split("=")[0]: Handle.decode(bytes.fromhex(a.split("=")[1])) for a in sys.argv[3:]}
exchange.run_server(sys.argv[1], int(sys.argv[2]), handles,
                    on_ready=lambda addr: print(f"serving on {addr[0]}:{addr[1]}", flush=True))
"""


class UserClusterError(TestbedError, RuntimeError):
    """A cluster step for a user's test failed (a process that never got ready, a bad handle)."""


class ProcessTimeout(UserClusterError):
    """A background process did not end (or get ready) in time."""


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


# -- processes ----------------------------------------------------------------------------------


class Process:
    """A command running in the background on a node, in its own process group."""

    def __init__(
        self,
        node: UserNode,
        command: str,
        *,
        name: str,
        cwd: PurePosixPath,
        env: Mapping[str, str],
        timeout: float,
        ready_line: str | None,
    ) -> None:
        self.node = node
        self.command = command
        self.name = name
        self.pidfile = f"/tmp/obmm-proc-{uuid.uuid4().hex[:10]}.pid"
        self._ready_line = ready_line
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self._lock = threading.Lock()
        self.ready = threading.Event()
        self.done = threading.Event()
        self.status: int | None = None
        self.timed_out = False
        self.error = ""
        self.stopped = False
        wrapped = wrap_command(command, env, cwd, self.pidfile)
        self._thread = threading.Thread(
            target=self._body, args=(wrapped, timeout), name=f"proc-{name}", daemon=True
        )
        self._thread.start()

    def _feed(self, into: list[bytes]) -> Callable[[bytes], None]:
        def feed(data: bytes) -> None:
            with self._lock:
                into.append(data)
                if self._ready_line is not None and self._ready_line in self.stdout + self.stderr:
                    self.ready.set()

        return feed

    def _body(self, command: str, timeout: float) -> None:
        try:
            res = self.node.conn.run(
                command, timeout=timeout, on_stdout=self._feed(self._out),
                on_stderr=self._feed(self._err),
            )  # fmt: skip
            self.status = res.exit_status
        except CommandTimeout:
            self.timed_out = True
        except SshError as exc:
            self.error = exc.summary
        finally:
            self.done.set()

    @property
    def stdout(self) -> str:
        return b"".join(self._out).decode(errors="replace")

    @property
    def stderr(self) -> str:
        return b"".join(self._err).decode(errors="replace")

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    def _describe(self) -> str:
        return (
            f"{self.node.name}: {self.name} ({self.command})\n"
            f"--- stdout ---\n{self.stdout[-2000:]}--- stderr ---\n{self.stderr[-2000:]}"
        )

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until the ready line was printed (or the port listens); else ProcessTimeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready.wait(0.1):
                return
            if self.done.is_set() and not self.ready.is_set():
                raise ProcessTimeout(
                    f"{self.name} ended (exit {self.status}) before it was ready\n"
                    + self._describe()
                )
        self.stop()
        raise ProcessTimeout(f"{self.name} was not ready in {timeout:.0f} s\n" + self._describe())

    def wait(self, timeout: float = DEFAULT_TIMEOUT_S) -> int:
        """Its exit status once it ended; ProcessTimeout (and it is stopped) if it does not."""
        if not self.done.wait(timeout):
            self.stop()
            raise ProcessTimeout(f"{self.name} did not end in {timeout:.0f} s\n" + self._describe())
        if self.timed_out:
            self.stop()
            raise ProcessTimeout(f"{self.name} ran past its deadline\n" + self._describe())
        if self.error:
            raise UserClusterError(f"{self.name}: {self.error}\n" + self._describe())
        assert self.status is not None
        return self.status

    def _signal(self, sig: str) -> None:
        with contextlib.suppress(SshError):
            self.node.conn.run(stop_command(self.pidfile, sig), timeout=30)

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM to its process group, SIGKILL after `grace` s; its exit status (None if the
        node did not say)."""
        if not self.done.is_set() or self.timed_out:
            self.stopped = True
            self._signal("TERM")
            if not self.done.wait(grace) or self.timed_out:
                self._signal("KILL")
                self.done.wait(grace)
        with contextlib.suppress(SshError):
            self.node.conn.run(f"rm -f {shlex.quote(self.pidfile)}", timeout=30)
        return self.status


# -- nodes --------------------------------------------------------------------------------------


@dataclass
class UserNode:
    """One node of the cluster: commands, processes, files and handles."""

    index: int
    conn: Conn
    env: dict[str, str]
    workdir: PurePosixPath = WORKDIR
    processes: list[Process] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def addr(self) -> str:
        """This node's address on the inter-node network (where it serves handles)."""
        return self.env.get(ENV_NODE_ADDR, "")

    @property
    def cna(self) -> str:
        return self.env.get(ENV_NODE_CNA, "")

    @property
    def eid(self) -> str:
        return self.env.get(ENV_NODE_EID, "")

    def _command(self, command: str, cwd: str | PurePosixPath | None,
                 env: Mapping[str, str] | None, pidfile: str) -> str:  # fmt: skip
        return wrap_command(
            command, {**self.env, **(env or {})}, PurePosixPath(cwd or self.workdir), pidfile
        )

    def run(
        self,
        command: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        check: bool = False,
        cwd: str | PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> Result:
        """Run `command` (sh) on the node; its exit status, stdout and stderr.

        At the `timeout` deadline its process group is killed and CommandTimeout raised (with
        the output so far); with `check` a non-zero status raises CommandFailed."""
        pidfile = f"/tmp/obmm-run-{uuid.uuid4().hex[:10]}.pid"
        wrapped = self._command(command, cwd, env, pidfile)
        try:
            res = self.conn.run(wrapped, timeout=timeout, stdin=stdin)
        except CommandTimeout as exc:
            with contextlib.suppress(SshError):
                self.conn.run(stop_command(pidfile, "KILL") + f"; rm -f {pidfile}", timeout=30)
            raise CommandTimeout(
                f"{self.name}: `{command}` was stopped at its {timeout:g} s deadline",
                exc.stdout,
                exc.stderr,
            ) from None
        result = Result(command, res.exit_status, res.stdout, res.stderr, res.duration)
        if check and not result.ok:
            raise CommandFailed(result)
        return result

    def start(
        self,
        command: str,
        *,
        name: str | None = None,
        ready_line: str | None = None,
        ready_port: int | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
        timeout: float = 3600.0,
        cwd: str | PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        """Start `command` in the background; with `ready_line` (text in its output) or
        `ready_port` (a TCP port listening) it returns once the process is ready.  Processes
        still running when the test ends are stopped (SIGTERM, then SIGKILL)."""
        proc = Process(
            self,
            command,
            name=name or command.split()[0],
            cwd=PurePosixPath(cwd or self.workdir),
            env={**self.env, **(env or {})},
            timeout=timeout,
            ready_line=ready_line,
        )
        self.processes.append(proc)
        if ready_port is not None:

            def probe() -> None:
                with contextlib.suppress(SshError):
                    res = self.conn.run(
                        wait_port_command(ready_port, proc.pidfile), timeout=ready_timeout
                    )
                    if res.ok:
                        proc.ready.set()

            threading.Thread(target=probe, name=f"ready-{proc.name}", daemon=True).start()
        if ready_line is not None or ready_port is not None:
            proc.wait_ready(ready_timeout)
        return proc

    def stop_all(self) -> list[str]:
        """Stop this node's processes that still run; one line for each."""
        stopped = []
        for proc in self.processes:
            if proc.running:
                proc.stop()
                stopped.append(f"{self.name}: stopped {proc.name} (still running)")
        self.processes.clear()
        return stopped

    def put(self, local: Path, remote: str | PurePosixPath, *, timeout: float = 300.0) -> None:
        """Copy a file or directory (as one tar archive) to `remote` on the node."""
        local = Path(local)
        if local.is_dir():
            data, _ = dir_archive(local, ())
            copy_to_nodes({self.index: self.conn}, data, PurePosixPath(remote))
            return
        dest = shlex.quote(str(remote))
        self.run(
            f'mkdir -p "$(dirname {dest})" && cat > {dest}',
            timeout=timeout, check=True, stdin=local.read_bytes(),
        )  # fmt: skip

    def get(self, remote: str | PurePosixPath, local: Path, *, timeout: float = 300.0) -> None:
        """Copy the file `remote` from the node to `local`."""
        res = self.run(f"cat {shlex.quote(str(remote))}", timeout=timeout, check=True)
        Path(local).write_bytes(res.stdout)

    def read_text(self, remote: str | PurePosixPath) -> str:
        return self.run(f"cat {shlex.quote(str(remote))}", check=True).out

    def _python(self, script: str, *args: str, timeout: float) -> Result:
        argv = " ".join(shlex.quote(a) for a in args)
        return self.run(f"python3 - {argv}", timeout=timeout, stdin=script.encode(), cwd=GUEST_ROOT)

    def fetch_handle(
        self, server: UserNode | str, name: str = "region", *, port: int = DEFAULT_PORT,
        timeout: float = 60.0,
    ) -> Handle:  # fmt: skip
        """The handle `server` (a node or an address) publishes as `name`, fetched from this
        node with obmm.exchange over the inter-node network."""
        host = server.addr if isinstance(server, UserNode) else server
        res = self._python(FETCH_SCRIPT, name, host, str(port), timeout=timeout)
        try:
            if not res.ok:
                raise HandleError(res.err.strip().splitlines()[-1] if res.err.strip() else "")
            return Handle.decode(bytes.fromhex(res.out.strip()))
        except (HandleError, ValueError) as exc:
            raise UserClusterError(
                f"{self.name}: fetching {name!r} from {host}:{port} failed: {exc}"
            ) from exc

    def list_handles(self, server: UserNode | str, *, port: int = DEFAULT_PORT) -> list[str]:
        """The names `server` publishes."""
        host = server.addr if isinstance(server, UserNode) else server
        res = self._python(FETCH_SCRIPT, "list", host, str(port), timeout=60.0)
        if not res.ok:
            raise UserClusterError(f"{self.name}: listing {host}:{port} failed: {res.err.strip()}")
        return [n for n in res.out.split() if n]

    def serve_handles(self, handles: Mapping[str, Handle], *, port: int = DEFAULT_PORT) -> Process:
        """Publish `handles` (made anywhere, e.g. on the host) from this node with
        obmm.exchange until the process is stopped (at the latest when the test ends)."""
        self.put_bytes(SERVE_SCRIPT.encode(), "/tmp/obmm-serve-handles.py")
        args = " ".join(shlex.quote(f"{n}={h.encode().hex()}") for n, h in handles.items())
        return self.start(
            f"exec python3 /tmp/obmm-serve-handles.py {self.addr} {port} {args}",
            name="serve-handles", ready_line="serving on", cwd=GUEST_ROOT,
        )  # fmt: skip

    def put_bytes(self, data: bytes, remote: str) -> None:
        self.run(f"cat > {shlex.quote(remote)}", check=True, stdin=data)

    def state(self) -> ObmmState:
        return ObmmState.parse(self.conn.run(STATE_COMMAND, timeout=CHECK_TIMEOUT_S).out)

    def remove_regions(self, regions: Mapping[int, str]) -> str:
        """Unexport / unimport `regions` (id -> type); what could not be removed."""
        if not regions:
            return ""
        args = [f"{'import' if kind == 'import' else 'export'}:{i}" for i, kind in regions.items()]
        res = self._python(REMOVE_SCRIPT, *args, timeout=CHECK_TIMEOUT_S)
        return (res.out + res.err).strip()


# -- the cluster --------------------------------------------------------------------------------


@dataclass
class UserCluster:
    """The booted cluster a user's tests run on."""

    cluster: Cluster
    topology: qemu.Topology
    nodes: list[UserNode]
    connections: list[Connection] = field(default_factory=list)
    guard: KernelLogGuard | None = None
    before: dict[int, ObmmState] = field(default_factory=dict)

    def __getitem__(self, index: int) -> UserNode:
        return self.nodes[index]

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def name(self) -> str:
        return self.cluster.name

    def put(self, local: Path, remote: str | PurePosixPath) -> None:
        """A file or directory to `remote` on every node (a directory as one archive, to all
        nodes at once)."""
        local = Path(local)
        if local.is_dir():
            data, _ = dir_archive(local, ())
            copy_to_nodes({n.index: n.conn for n in self.nodes}, data, PurePosixPath(remote))
        else:
            for node in self.nodes:
                node.put(local, remote)

    def run_all(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                check: bool = False) -> list[Result]:  # fmt: skip
        """`command` on every node at once; the results in node order."""
        return on_each(self.nodes, lambda n: n.run(command, timeout=timeout, check=check))

    def _alive(self, index: int) -> bool:
        return self.cluster.nodes[index].alive()

    # -- between tests ----------------------------------------------------------------------

    def check_start(self, name: str, *, kernel_guard: bool, leak_check: bool) -> None:
        """Before a test: mark the kernel logs, note the emulator state."""
        self.guard = None
        if kernel_guard:
            self.guard = KernelLogGuard(
                len(self.nodes),
                lambda i, cmd, timeout=60: self.nodes[i].conn.run(cmd, timeout=timeout),
                self._alive,
                lambda i: self.cluster.nodes[i].console_tail(),
            )
            self.guard.start(name)
        self.before = {n.index: n.state() for n in self.nodes} if leak_check else {}

    def check_end(self) -> list[str]:
        """After a test: stop its processes, scan the kernel logs, compare the emulator state
        (removing what leaked, so the next test starts clean); one failure text per finding."""
        for node in self.nodes:
            if self._alive(node.index):
                for line in node.stop_all():
                    log.info("%s", line)
        failures = []
        if self.guard is not None:
            reports = self.guard.failures()
            if reports:
                failures.append("kernel report during the test:\n" + "\n\n".join(reports))
        for index, before in self.before.items():
            node = self.nodes[index]
            if not self._alive(index):
                continue
            after = node.state()
            leaks = after.leaks_since(before)
            if leaks:
                new = {i: k for i, k in after.regions.items() if i not in before.regions}
                problem = node.remove_regions(new)
                note = f" (cleanup: {problem})" if problem else " (removed)"
                failures.append(f"leak check: {node.name}: the test left {leaks}{note}")
        self.guard = None
        self.before = {}
        return failures

    def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(SshError, OSError):
                if self._alive(node.index):
                    node.stop_all()
        for conn in self.connections:
            conn.close()
        self.cluster.stop()


def boot(
    *,
    nodes: int,
    memory_mib: int | None = None,
    pool_mib: int | None = None,
    name: str,
    accel: str | None = None,
    cold: bool = False,
    logdir: Path | None = None,
    driver: str | None = None,
) -> UserCluster:
    """Build the modules, boot (or restore) `nodes` nodes, load the driver on each (``driver``:
    emu or real; None: the setting, obmm.testbed.provision.driver_setting())."""
    from obmm.testbed import accel as accel_mod
    from obmm.testbed.cluster import default_logdir, load_topology
    from obmm.testbed.image import DEFAULT_RECIPE, ensure_image, find_recipe
    from obmm.testbed.paths import cache_dir, repo_root, results_dir
    from obmm.testbed.progress import Progress
    from obmm.testbed.provision import (
        build_guest_modules,
        module_load_order,
        payload_tar,
        prepare_node,
    )

    progress = Progress(f"pytest cluster {name}")
    base = load_topology("pair" if nodes > 1 else "single")
    topology = qemu.Topology(
        nodes=nodes,
        memory_mib=memory_mib if memory_mib is not None else base.memory_mib,
        pool_mib=pool_mib if pool_mib is not None else base.pool_mib,
        cpus=base.cpus,
        description=f"pytest cluster, {nodes} node(s)",
    )
    image = ensure_image(find_recipe(DEFAULT_RECIPE), progress=progress)
    kos = module_load_order(build_guest_modules(image, results_dir() / "kmod", driver))
    cluster = Cluster.start(
        image,
        topology,
        name=name,
        accel=accel_mod.choose(accel, image.kernel, cache_dir()),
        logdir=logdir or default_logdir(name),
        progress=progress,
        snapshot="off" if cold else None,
    )
    conns: list[Connection] = []
    try:
        conns = [cluster.connect(i) for i in range(nodes)]
        payload = payload_tar(repo_root(), kos)
        on_each(
            range(nodes),
            lambda i: prepare_node(conns[i], i, topology, repo_root(), kos, payload=payload),
        )
        addrs = [cluster.fabric_ip(i) for i in range(nodes)]
        user_nodes = [
            UserNode(i, conns[i], node_env(i, nodes, addrs, read_identity(conns[i])))
            for i in range(nodes)
        ]
        progress.line(f"{nodes} node(s) ready, modules loaded: {', '.join(k.name for k in kos)}")
        return UserCluster(cluster, topology, user_nodes, conns)
    except BaseException:
        for conn in conns:
            conn.close()
        cluster.stop()
        raise


__all__: Sequence[str] = (
    "ObmmState",
    "Process",
    "ProcessTimeout",
    "UserCluster",
    "UserClusterError",
    "UserNode",
    "boot",
)
