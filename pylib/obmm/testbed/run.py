"""`obmm-testbed run`: your code on an N-node cluster in one line, like `vng -- make check`.

    obmm-testbed run --nodes 2 -- make check
    obmm-testbed run --nodes 2 --node 0='./exporter' --node 1='./client' \\
        --service 0 --ready-line 'serving handle'

Steps: build the modules and boot the cluster (:class:`obmm.testbed.cluster.Cluster`, fast init),
prepare every node at once (:func:`obmm.testbed.provision.prepare_node`: package, uapi, the
handle helpers, modules loaded), copy the directory (default: the current one, to the same path
in the guests) as one tar archive to all nodes at once, mark every kernel log
(:class:`obmm.testbed.kguard.KernelLogGuard`), run the commands with their output streamed line
by line with a ``[nodeN] `` prefix, scan the kernel logs, tear everything down.

* A node's command can be a *service* (``--service N`` with ``--ready-port P`` or
  ``--ready-line TEXT``): it starts first, the other commands start once it is ready, and it is
  stopped (SIGTERM to its process group, then SIGKILL) when they have all ended.  Stopped that
  way its status does not count; ending on its own, early, it does.
* Every command runs in its own process group under ``setsid`` in the copied directory, with
  :data:`ENV_NODE_ID`, :data:`ENV_NODES`, :data:`ENV_NODE_CNA`, :data:`ENV_NODE_EID`,
  :data:`ENV_NODE_ADDRS` (every node's fabric address, space separated, in node order),
  :data:`ENV_NODE_ADDR`, :data:`ENV_CFLAGS` (``-I`` for ``ub/obmm.h`` and the handle helpers) and
  ``PYTHONPATH`` (the ``obmm`` package) in its environment.
* The exit status is the worst of the commands' (largest non-zero; :data:`EXIT_TIMEOUT` for a
  command stopped at the deadline, :data:`EXIT_GUEST_GONE` for a node that died); a kernel report
  on any node makes an otherwise green run exit :data:`EXIT_KERNEL_REPORT`, with the excerpt.

Why an archive and not a shared 9p/virtiofs directory: one tar stream per node costs one SSH
round trip and unpacks at guest memory speed, while under TCG every 9p/virtiofs file operation is
a virtio round trip through the emulated guest (a build touches thousands); virtiofs also needs
a virtiofsd per node, and both kinds of device block the QEMU migration that cluster snapshots
restore from.  README.md ("Your code on the testbed") has the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shlex
import shutil
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO, Protocol

from obmm.identity import ENV_NODE_ID
from obmm.testbed import kbuild, qemu
from obmm.testbed.errors import EXIT_INTERRUPTED, TestbedError
from obmm.testbed.kguard import KernelLogGuard
from obmm.testbed.parallel import on_each
from obmm.testbed.provision import GUEST_ROOT
from obmm.testbed.runner import ENV_NODES
from obmm.testbed.ssh import CommandTimeout, Connection, GuestGone, Result, SshError
from obmm.tools import interrupts

if TYPE_CHECKING:
    from obmm.testbed.cluster import Cluster

log = logging.getLogger(__name__)

ENV_NODE_CNA = "OBMM_NODE_CNA"
ENV_NODE_EID = "OBMM_NODE_EID"
ENV_NODE_ADDRS = "OBMM_NODE_ADDRS"
ENV_NODE_ADDR = "OBMM_NODE_ADDR"
ENV_CFLAGS = "OBMM_CFLAGS"

EXIT_KERNEL_REPORT = 1
EXIT_TIMEOUT = 124  # like timeout(1)
EXIT_GUEST_GONE = 255  # like ssh(1)
DEFAULT_TIMEOUT_S = 600.0
STOP_GRACE_S = 10.0
READY_POLL_S = 0.2
COPY_TIMEOUT_S = 300.0
DEFAULT_EXCLUDES = (".git", ".venv", "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache")
PREFIX = "obmm-testbed"
#: The identity a node's controller publishes, read the way obmm.identity reads it.
IDENTITY_COMMAND = (
    "for d in /sys/devices/ub_bus_controller*/*/ubc; do "
    '[ -e "$d/primary_cna" ] && cat "$d/primary_cna" "$d/eid" && break; done; true'
)


class RunError(TestbedError, ValueError):
    """`run` was asked for something it cannot do (a bad option, a missing directory)."""


# -- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What to run where, from the command line."""

    nodes: int
    commands: Mapping[int, str]
    service: int | None = None
    ready_port: int | None = None
    ready_line: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    ready_timeout: float | None = None
    src: Path | None = None
    dest: PurePosixPath | None = None
    excludes: tuple[str, ...] = DEFAULT_EXCLUDES
    keep: bool = False
    name: str = ""

    @property
    def workdir(self) -> PurePosixPath:
        return self.dest if self.dest is not None else PurePosixPath("/tmp")


def parse_node_command(text: str) -> tuple[int, str]:
    """``0=./exporter`` (or ``node0=...``) -> (0, "./exporter")."""
    node, sep, command = text.partition("=")
    node = node.strip().removeprefix("node")
    if not sep or not node.isdigit() or not command.strip():
        raise RunError(f"--node {text!r}: expected N=COMMAND, e.g. --node 0='./exporter'")
    return int(node), command


def make_plan(args: argparse.Namespace) -> Plan:
    """Check the options against each other; a Plan or a RunError naming the bad one."""
    nodes = int(args.nodes)
    if not 1 <= nodes <= qemu.MAX_NODES:
        raise RunError(f"--nodes {nodes}: must be 1..{qemu.MAX_NODES}")
    default = " ".join(args.command).strip()
    commands: dict[int, str] = {}
    for spec in args.node or []:
        i, cmd = parse_node_command(spec)
        if i >= nodes:
            raise RunError(f"--node {spec!r}: the cluster has nodes 0..{nodes - 1}")
        if i in commands:
            raise RunError(f"--node {i} given twice")
        commands[i] = cmd
    if default:
        for i in range(nodes):
            commands.setdefault(i, default)
    if not commands:
        raise RunError("nothing to run: give a command after `--` or --node N=COMMAND")
    service = args.service
    if service is not None:
        if service not in commands:
            raise RunError(f"--service {service}: node{service} has no command")
        if args.ready_port is None and args.ready_line is None:
            raise RunError("--service needs --ready-port PORT or --ready-line TEXT")
        if len(commands) < 2:
            raise RunError("--service: no other command to wait for it")
    elif args.ready_port is not None or args.ready_line is not None:
        raise RunError("--ready-port/--ready-line need --service N")
    if args.ready_port is not None and not 0 < args.ready_port < 65536:
        raise RunError(f"--ready-port {args.ready_port}: not a TCP port")
    if args.timeout <= 0:
        raise RunError(f"--timeout {args.timeout}: must be positive")
    src: Path | None = None
    dest: PurePosixPath | None = None
    if args.dir != "none":
        src = Path(args.dir or os.getcwd()).resolve()
        if not src.is_dir():
            raise RunError(f"--dir {src}: not a directory")
        dest = PurePosixPath(args.dest) if args.dest else PurePosixPath(src.as_posix())
        if not dest.is_absolute() or dest == PurePosixPath("/"):
            raise RunError(f"--dest {dest}: must be an absolute path below /")
    return Plan(
        nodes=nodes,
        commands=commands,
        service=service,
        ready_port=args.ready_port,
        ready_line=args.ready_line,
        timeout=float(args.timeout),
        ready_timeout=args.ready_timeout,
        src=src,
        dest=dest,
        excludes=tuple(args.exclude) if args.exclude is not None else DEFAULT_EXCLUDES,
        keep=bool(args.keep),
        name=args.name or f"run-{os.getpid()}",
    )


# -- output -----------------------------------------------------------------------------------


class LinePrefixer:
    """Writes a byte stream to `out` a whole line at a time, each line prefixed with `prefix`.

    Lines of different nodes never interleave mid-line (one lock per output); `on_line` sees
    each complete line (without its newline), for ready-line detection."""

    def __init__(
        self,
        prefix: str,
        out: BinaryIO,
        lock: threading.Lock,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        self.prefix = prefix.encode()
        self.out = out
        self.lock = lock
        self.on_line = on_line
        self._buf = b""

    def feed(self, data: bytes) -> None:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        self._emit(lines)

    def flush(self) -> None:
        if self._buf:
            line, self._buf = self._buf, b""
            self._emit([line])

    def _emit(self, lines: Sequence[bytes]) -> None:
        if not lines:
            return
        with self.lock:
            for line in lines:
                self.out.write(self.prefix + line.rstrip(b"\r") + b"\n")
            self.out.flush()
        if self.on_line is not None:
            for line in lines:
                self.on_line(line.decode(errors="replace"))


def worst_status(statuses: Sequence[int]) -> int:
    """The run's exit status: 0 if every command succeeded, else the largest failure."""
    failures = [s if s >= 0 else EXIT_GUEST_GONE for s in statuses if s != 0]
    return max(failures, default=0)


# -- commands on a node -----------------------------------------------------------------------


def node_env(
    index: int, nodes: int, addrs: Sequence[str], identity: tuple[str, str]
) -> dict[str, str]:
    """The environment every command of node `index` gets."""
    cna, eid = identity
    return {
        ENV_NODE_ID: str(index),
        ENV_NODES: str(nodes),
        ENV_NODE_CNA: cna,
        ENV_NODE_EID: eid,
        ENV_NODE_ADDRS: " ".join(addrs),
        ENV_NODE_ADDR: addrs[index],
        ENV_CFLAGS: f"-I{GUEST_ROOT / 'uapi'} -I{GUEST_ROOT / 'examples' / 'c'}",
        "PYTHONPATH": str(GUEST_ROOT / "pylib"),
        "PYTHONUNBUFFERED": "1",
    }


def wrap_command(command: str, env: Mapping[str, str], cwd: PurePosixPath, pidfile: str) -> str:
    """`command` in its own process group (its leader's pid in `pidfile`), in `cwd`, with `env`;
    the pidfile is removed when it ends and the command's status kept."""
    env_s = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    inner = f'echo $$ > {shlex.quote(pidfile)} && exec sh -c "$1"'
    return (
        f"cd {shlex.quote(str(cwd))} && env {env_s} setsid -w sh -c {shlex.quote(inner)} "
        f"obmm-run {shlex.quote(command)}; st=$?; rm -f {shlex.quote(pidfile)}; exit $st"
    )


def stop_command(pidfile: str, sig: str = "TERM") -> str:
    """Signal the process group whose leader's pid is in `pidfile` (if it still runs)."""
    p = shlex.quote(pidfile)
    return f"[ -e {p} ] && kill -{sig} -$(cat {p}) 2>/dev/null; true"


def wait_port_command(port: int, pidfile: str) -> str:
    """Exit 0 once something listens on TCP `port` (any address), 1 if the service ended."""
    p = shlex.quote(pidfile)
    listening = (
        'awk \'NR>1 && $4=="0A" {split($2,a,":"); print a[2]}\' /proc/net/tcp /proc/net/tcp6 '
        f"2>/dev/null | grep -qx {port:04X}"
    )
    # The pidfile appears when the service starts and goes when it ends.
    return (
        f"seen=0; until {listening}; do "
        f"if [ -e {p} ]; then seen=1; elif [ $seen = 1 ]; then exit 1; fi; "
        f"sleep {READY_POLL_S}; done"
    )


class Conn(Protocol):
    """What `run` needs of a node connection (obmm.testbed.ssh.Connection)."""

    def run(
        self,
        command: str,
        *,
        timeout: float,
        check: bool = ...,
        stdin: bytes | None = ...,
        on_stdout: Callable[[bytes], None] | None = ...,
        on_stderr: Callable[[bytes], None] | None = ...,
    ) -> Result: ...


@dataclass
class Outcome:
    """How one node's command ended."""

    node: int
    status: int | None = None  # None: still running / never started
    timed_out: bool = False
    error: str = ""
    stopped: bool = False  # a service we stopped after the others ended
    started: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class Execution:
    """Runs a plan's commands on connected nodes: the service first, then the rest."""

    def __init__(
        self,
        plan: Plan,
        conns: Mapping[int, Conn],
        envs: Mapping[int, Mapping[str, str]],
        *,
        stdout: BinaryIO,
        stderr: BinaryIO,
        token: str | None = None,
    ) -> None:
        self.plan = plan
        self.conns = conns
        self.envs = envs
        self.stdout = stdout
        self.stderr = stderr
        self.token = token or uuid.uuid4().hex[:10]
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.outcomes = {i: Outcome(i) for i in plan.commands}
        self.deadline = 0.0
        self._threads: list[threading.Thread] = []

    def pidfile(self, node: int) -> str:
        return f"/tmp/obmm-run-{self.token}-node{node}.pid"

    def say(self, text: str) -> None:
        with self.lock:
            for line in text.rstrip("\n").splitlines():
                self.stderr.write(f"[{PREFIX}] {line}\n".encode())
            self.stderr.flush()

    def _on_line(self, node: int) -> Callable[[str], None] | None:
        if node != self.plan.service or self.plan.ready_line is None:
            return None
        wanted = self.plan.ready_line

        def check(line: str) -> None:
            if wanted in line:
                self.ready.set()

        return check

    def _start(self, node: int) -> None:
        outcome = self.outcomes[node]
        outcome.started = True
        command = wrap_command(
            self.plan.commands[node], self.envs[node], self.plan.workdir, self.pidfile(node)
        )
        out = LinePrefixer(f"[node{node}] ", self.stdout, self.lock, self._on_line(node))
        err = LinePrefixer(f"[node{node}] ", self.stderr, self.lock, self._on_line(node))

        def body() -> None:
            try:
                result = self.conns[node].run(
                    command,
                    timeout=max(0.1, self.deadline - time.monotonic()),
                    on_stdout=out.feed,
                    on_stderr=err.feed,
                )
                outcome.status = result.exit_status if result.exit_status >= 0 else EXIT_GUEST_GONE
            except CommandTimeout:
                outcome.timed_out = True
                outcome.status = EXIT_TIMEOUT
            except GuestGone as exc:
                outcome.status = EXIT_GUEST_GONE
                outcome.error = str(exc).splitlines()[0]
            except SshError as exc:
                outcome.status = EXIT_GUEST_GONE
                outcome.error = exc.summary
            finally:
                out.flush()
                err.flush()
                outcome.done.set()

        t = threading.Thread(target=body, name=f"run-node{node}", daemon=True)
        self._threads.append(t)
        t.start()

    def _wait_port(self, node: int, port: int) -> None:
        def body() -> None:
            try:
                res = self.conns[node].run(
                    wait_port_command(port, self.pidfile(node)),
                    timeout=max(0.1, self.deadline - time.monotonic()),
                )
            except SshError:
                return
            if res.ok:
                self.ready.set()

        threading.Thread(target=body, name=f"ready-port-node{node}", daemon=True).start()

    def _wait_ready(self, service: int) -> bool:
        outcome = self.outcomes[service]
        limit = self.deadline
        if self.plan.ready_timeout is not None:
            limit = min(limit, time.monotonic() + self.plan.ready_timeout)
        while time.monotonic() < limit:
            if self.ready.wait(0.1):
                return True
            if outcome.done.is_set():
                return self.ready.is_set()
        return self.ready.is_set()

    def _signal(self, node: int, sig: str) -> None:
        with contextlib.suppress(SshError):
            self.conns[node].run(stop_command(self.pidfile(node), sig), timeout=30)

    def _stop(self, node: int) -> None:
        """SIGTERM to a command's process group, SIGKILL after the grace period."""
        outcome = self.outcomes[node]
        if outcome.done.is_set() and not outcome.timed_out:
            return
        self._signal(node, "TERM")
        if not outcome.done.wait(STOP_GRACE_S) or outcome.timed_out:
            self._signal(node, "KILL")
            outcome.done.wait(STOP_GRACE_S)
        # A command whose channel was closed at its deadline never removed its pidfile.
        with contextlib.suppress(SshError):
            self.conns[node].run(f"rm -f {shlex.quote(self.pidfile(node))}", timeout=30)

    def run(self) -> int:
        """Run everything; the worst exit status."""
        self.deadline = time.monotonic() + self.plan.timeout
        service = self.plan.service
        others = [i for i in sorted(self.plan.commands) if i != service]
        if service is not None:
            self._start(service)
            if self.plan.ready_port is not None:
                self._wait_port(service, self.plan.ready_port)
            if not self._wait_ready(service):
                svc = self.outcomes[service]
                ended = svc.done.is_set() and not svc.timed_out
                self._stop(service)
                if ended:
                    why = f"ended (exit {svc.status}) before it was ready"
                else:
                    why = "was not ready in time"
                    svc.timed_out = True
                    svc.status = EXIT_TIMEOUT
                self.say(f"node{service}: the service {why}; the other commands were not started")
                return self._finish()
            self.say(f"node{service}: service ready")
        for i in others:
            self._start(i)
        for i in others:
            self.outcomes[i].done.wait(max(0.0, self.deadline - time.monotonic()) + STOP_GRACE_S)
        for i in others:  # a timed-out command's processes still run in the guest
            if self.outcomes[i].timed_out or not self.outcomes[i].done.is_set():
                self._stop(i)
        if service is not None:
            svc = self.outcomes[service]
            if not svc.done.is_set():
                svc.stopped = True
                self._stop(service)
            elif svc.timed_out:
                self._stop(service)
        return self._finish()

    def _finish(self) -> int:
        statuses = []
        for i, o in sorted(self.outcomes.items()):
            if not o.started:
                continue
            if o.timed_out:
                self.say(f"node{i}: stopped at the {self.plan.timeout:.0f} s deadline")
            elif o.error:
                self.say(f"node{i}: {o.error}")
            if o.stopped and not o.timed_out:
                continue  # the service we stopped: its status says only that it was stopped
            statuses.append(o.status if o.status is not None else EXIT_GUEST_GONE)
        return worst_status(statuses)


# -- the directory ----------------------------------------------------------------------------


def dir_archive(src: Path, excludes: Sequence[str]) -> tuple[bytes, int]:
    """`src` as an uncompressed tar (the guests unpack it at memory speed); and its file count."""
    buf = io.BytesIO()
    files = 0

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        nonlocal files
        name = info.name.rsplit("/", 1)[-1]
        if info.name != "." and any(fnmatch(name, pat) for pat in excludes):
            return None
        if info.isfile():
            files += 1
        return info

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(src, arcname=".", filter=keep)
    return buf.getvalue(), files


def copy_to_nodes(conns: Mapping[int, Conn], data: bytes, dest: PurePosixPath) -> None:
    """Unpack the archive at `dest` on every node at once (one thread per node)."""
    command = f"mkdir -p {shlex.quote(str(dest))} && tar -xf - -C {shlex.quote(str(dest))}"

    def one(i: int) -> None:
        try:
            conns[i].run(command, timeout=COPY_TIMEOUT_S, check=True, stdin=data)
        except Exception as exc:
            raise RunError(f"node{i}: copying the directory failed: {exc}") from exc

    on_each(sorted(conns), one)


def read_identity(conn: Conn) -> tuple[str, str]:
    """(CNA, EID) as the node's UB controller publishes them; empty without a controller."""
    words = conn.run(IDENTITY_COMMAND, timeout=60).out.split()
    return (words[0], words[1]) if len(words) >= 2 else ("", "")


# -- the command ------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=2, help="number of nodes (default %(default)s)")
    p.add_argument(
        "--node",
        action="append",
        metavar="N=CMD",
        help="node N runs CMD instead of the command after -- (repeatable)",
    )
    p.add_argument("--service", type=int, metavar="N", help="node N's command is a service")
    ready = p.add_mutually_exclusive_group()
    ready.add_argument("--ready-port", type=int, metavar="PORT", help="ready when PORT listens")
    ready.add_argument("--ready-line", metavar="TEXT", help="ready when a line contains TEXT")
    p.add_argument("--ready-timeout", type=float, metavar="S", help="seconds to become ready")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="deadline of the commands in seconds (default %(default).0f)",
    )
    p.add_argument(
        "--dir", help="directory copied to every node (default: the current one; 'none': none)"
    )
    p.add_argument("--dest", help="where it goes in the guests (default: the same path)")
    p.add_argument(
        "--exclude",
        action="append",
        metavar="PATTERN",
        help=f"names not copied (repeatable; default {' '.join(DEFAULT_EXCLUDES)})",
    )
    p.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    p.add_argument("--name", help="cluster name (default run-<pid>)")
    p.add_argument("--memory", type=int, metavar="MIB", help="RAM per node")
    p.add_argument("--pool", type=int, metavar="MIB", help="export pool at the top of RAM")
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"), help="accelerator (default auto)")
    p.add_argument("--recipe", help="image recipe (default: the default recipe)")
    p.add_argument("--driver", choices=kbuild.DRIVERS, help=kbuild.DRIVER_HELP)
    p.add_argument("--init", choices=qemu.INIT_MODES, help="node userland (default fast)")
    p.add_argument(
        "--cold",
        action="store_true",
        help="boot even if a snapshot of this cluster shape exists (default: restore one)",
    )
    p.add_argument("--boot-timeout", type=float, metavar="S", help="seconds to wait for SSH")
    p.add_argument("command", nargs="*", help="the command every node runs (after --)")


def _topology(plan: Plan, args: argparse.Namespace) -> qemu.Topology:
    from obmm.testbed.cluster import load_topology

    base = load_topology("pair" if plan.nodes > 1 else "single")
    return qemu.Topology(
        nodes=plan.nodes,
        memory_mib=args.memory if args.memory is not None else base.memory_mib,
        pool_mib=args.pool if args.pool is not None else base.pool_mib,
        cpus=base.cpus,
        description=f"obmm-testbed run, {plan.nodes} node(s)",
    )


def command(args: argparse.Namespace) -> int:
    plan = make_plan(args)
    try:
        with interrupts.sigterm_unwinds():
            return _run(plan, args)
    except KeyboardInterrupt as exc:
        why = exc or "Ctrl-C"
        print(f"obmm-testbed run: interrupted ({why}); the cluster is stopped", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(plan: Plan, args: argparse.Namespace) -> int:
    from obmm.testbed import accel as accel_mod
    from obmm.testbed.cluster import Cluster, default_logdir
    from obmm.testbed.image import DEFAULT_RECIPE, ensure_image, find_recipe
    from obmm.testbed.paths import cache_dir, repo_root, results_dir
    from obmm.testbed.progress import Progress
    from obmm.testbed.provision import (
        build_guest_modules,
        module_load_order,
        payload_tar,
        prepare_node,
    )

    t0 = time.monotonic()
    progress = Progress(f"run {plan.name}")
    topology = _topology(plan, args)
    archive: tuple[bytes, int] | None = None
    if plan.src is not None:
        archive = dir_archive(plan.src, plan.excludes)
    image = ensure_image(find_recipe(args.recipe or DEFAULT_RECIPE), progress=progress)
    kos = module_load_order(build_guest_modules(image, results_dir() / "kmod", args.driver))
    accel = accel_mod.choose(args.accel, image.kernel, cache_dir())
    logdir = default_logdir(plan.name)
    cluster = Cluster.start(
        image,
        topology,
        name=plan.name,
        accel=accel,
        init=args.init,
        logdir=logdir,
        detach=plan.keep,
        timeout=args.boot_timeout,
        progress=progress,
        snapshot="off" if getattr(args, "cold", False) else None,
    )
    status = EXIT_GUEST_GONE
    conns: dict[int, Conn] = {}
    opened = []
    try:
        for i in range(plan.nodes):
            conn = cluster.connect(i)
            opened.append(conn)
            conns[i] = conn

        payload = payload_tar(repo_root(), kos)
        on_each(
            range(plan.nodes),
            lambda i: prepare_node(opened[i], i, topology, repo_root(), kos, payload=payload),
        )
        progress.line(f"modules loaded on {plan.nodes} node(s): {', '.join(k.name for k in kos)}")
        if plan.src is not None and plan.dest is not None and archive is not None:
            data, files = archive
            c0 = time.monotonic()
            copy_to_nodes(conns, data, plan.dest)
            progress.line(
                f"copied {plan.src} ({files} files, {len(data) >> 10} KiB tar) to {plan.dest} "
                f"on {plan.nodes} node(s) in {time.monotonic() - c0:.2f} s"
            )
        addrs = [cluster.fabric_ip(i) for i in range(plan.nodes)]
        envs = {
            i: node_env(i, plan.nodes, addrs, read_identity(conns[i])) for i in range(plan.nodes)
        }
        guard = KernelLogGuard(
            plan.nodes,
            lambda i, cmd, timeout=60: opened[i].run(cmd, timeout=timeout, check=True),
            lambda i: cluster.nodes[i].alive(),
            lambda i: cluster.nodes[i].console_tail(),
        )
        guard.start(f"obmm-testbed run {plan.name}")
        progress.line(f"running on {len(plan.commands)} node(s) (deadline {plan.timeout:.0f} s)")
        execution = Execution(plan, conns, envs, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer)
        r0 = time.monotonic()
        status = execution.run()
        failures = guard.failures()
        if failures:
            execution.say("kernel report during the run:\n" + "\n\n".join(failures))
            status = status or EXIT_KERNEL_REPORT
        progress.line(
            f"exit status {status}; commands {time.monotonic() - r0:.1f} s, "
            f"whole run {time.monotonic() - t0:.1f} s"
        )
    finally:
        # a second Ctrl-C or SIGTERM waits until the cluster is down
        with interrupts.signals_deferred():
            _teardown(plan, cluster, opened, logdir, status)
    return status


def _teardown(
    plan: Plan, cluster: Cluster, opened: Sequence[Connection], logdir: Path, status: int
) -> None:
    """Close the connections and stop the cluster (or say how to reach a kept one)."""
    for conn in opened:
        conn.close()
    if plan.keep:
        print(
            f"cluster {plan.name} kept: obmm-testbed ssh --name {plan.name} 0 "
            f"[-- CMD]; obmm-testbed status --name {plan.name}; "
            f"obmm-testbed down --name {plan.name}"
        )
    else:
        cluster.stop()
        if status == 0:
            shutil.rmtree(logdir, ignore_errors=True)
        else:
            print(f"consoles kept in {logdir}", file=sys.stderr)
