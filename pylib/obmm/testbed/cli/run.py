"""`obmm-testbed run`: your code on an N-node cluster in one line, like `vng -- make check`.

    obmm-testbed run --nodes 2 -- make check
    obmm-testbed run --nodes 2 --node 0='./exporter' --node 1='./client' \\
        --service 0 --ready-line 'serving handle'

Steps: bring the nodes up (:func:`obmm.testbed.session.bring_up`: image, modules, boot or
restore, package and modules loaded with any ``--param``), copy the directory (default: the
current one, to the same path in the guests) as one tar archive to all nodes at once, mark every
kernel log (the session's :class:`obmm.testbed.vm.kguard.KernelLogGuard`), run the commands with
their output streamed line by line with a ``[nodeN] `` prefix, scan the kernel logs, tear
everything down.

The command after ``--``: one word is a shell command (``run -- 'make && ./t'``); several
words are an argument vector, quoted word by word (``run -- sh -c 'test -c /dev/obmm'`` runs
``sh`` with the two arguments ``-c`` and ``test -c /dev/obmm``).  ``--node N=CMD`` is a shell
command.

* A node's command can be a *service* (``--service N`` with ``--ready-port P`` or
  ``--ready-line TEXT``): it starts first, the other commands start once it is ready, and it is
  stopped (SIGTERM to its process group, then SIGKILL) when they have all ended.  Stopped that
  way its status does not count; ending on its own, early, it does.
* Every command runs in its own process group under ``setsid`` in the copied directory, with
  the node environment (:func:`obmm.testbed.remote.node_env`; :mod:`obmm.envvars` group
  ``node``: node id and count, CNA, EID, every node's fabric address, ``OBMM_CFLAGS``) and
  ``PYTHONPATH`` (the ``obmm`` package).
* The exit status is the worst of the commands' (largest non-zero; :data:`EXIT_TIMEOUT` for a
  command stopped at the deadline, :data:`EXIT_GUEST_GONE` for a node that died); a kernel report
  on any node makes an otherwise green run exit :data:`EXIT_KERNEL_REPORT`, with the excerpt.

Why an archive and not a shared 9p/virtiofs directory: one tar stream per node costs one SSH
round trip and unpacks at guest memory speed, while under TCG every 9p/virtiofs file operation is
a virtio round trip through the emulated guest (a build touches thousands); virtiofs also needs
a virtiofsd per node, and both kinds of device block the QEMU migration that cluster snapshots
restore from (docs/your-code.md, "`obmm-testbed run`").
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from obmm.fuzz import faults
from obmm.testbed import settings as settings_mod
from obmm.testbed.errors import EXIT_INTERRUPTED, TestbedError
from obmm.testbed.node import Node
from obmm.testbed.remote import (
    STOP_GRACE_S,
    command_line,
    dir_archive,
    stop_command,
    unpack_on,
    wait_port_command,
    wrap_command,
)
from obmm.testbed.settings import Settings
from obmm.testbed.ssh import EXIT_GUEST_GONE, CommandTimeout, GuestGone, SshError
from obmm.tools import interrupts, logscan

if TYPE_CHECKING:
    from obmm.testbed.session import Session

log = logging.getLogger(__name__)

EXIT_KERNEL_REPORT = 1
EXIT_TIMEOUT = 124  # like timeout(1)
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_NODES = 2
#: --kernel-allow's names: kernel reports a run's commands may cause on purpose.
KERNEL_ALLOW: dict[str, tuple[logscan.AllowRule, ...]] = {"fault-injection": faults.ALLOW}
DEFAULT_EXCLUDES = (".git", ".venv", "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache")
PREFIX = "obmm-testbed"


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
    #: Kernel reports the commands may cause on purpose (--kernel-allow): not failures.
    kernel_allow: tuple[logscan.AllowRule, ...] = ()

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


def settings_from(args: argparse.Namespace) -> Settings:
    """The cluster's settings: flags over the environment; 2 nodes and run-<pid> by default."""
    settings = settings_mod.from_args(args)
    return settings.with_defaults(nodes=DEFAULT_NODES, name=f"run-{os.getpid()}")


def make_plan(args: argparse.Namespace, nodes: int) -> Plan:
    """Check the options against each other; a Plan or a RunError naming the bad one."""
    default = command_line(args.command) if args.command else ""
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
        kernel_allow=tuple(r for name in args.kernel_allow or () for r in KERNEL_ALLOW[name]),
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
        nodes: Mapping[int, Node],
        *,
        stdout: BinaryIO,
        stderr: BinaryIO,
        token: str | None = None,
    ) -> None:
        self.plan = plan
        self.nodes = nodes
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
            self.plan.commands[node], self.nodes[node].env, self.plan.workdir, self.pidfile(node)
        )
        out = LinePrefixer(f"[node{node}] ", self.stdout, self.lock, self._on_line(node))
        err = LinePrefixer(f"[node{node}] ", self.stderr, self.lock, self._on_line(node))

        def body() -> None:
            try:
                result = self.nodes[node].run(
                    command,
                    timeout=max(0.1, self.deadline - time.monotonic()),
                    on_stdout=out.feed,
                    on_stderr=err.feed,
                    bare=True,
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
                res = self.nodes[node].run(
                    wait_port_command(port, self.pidfile(node)),
                    timeout=max(0.1, self.deadline - time.monotonic()),
                    bare=True,
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
            self.nodes[node].run(stop_command(self.pidfile(node), sig), timeout=30, bare=True)

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
            self.nodes[node].run(f"rm -f {shlex.quote(self.pidfile(node))}", timeout=30, bare=True)

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


# -- the command ----------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--node",
        action="append",
        metavar="N=CMD",
        help="node N runs the shell command CMD instead of the command after -- (repeatable)",
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
    p.add_argument(
        "--kernel-allow",
        action="append",
        choices=sorted(KERNEL_ALLOW),
        help="kernel reports the commands cause on purpose, not a failure of the run "
        "(fault-injection: the kernel's own WARN on an injected allocation failure; "
        "repeatable)",
    )
    p.add_argument(
        "--cold", action="store_true", help="boot even if a snapshot fits (--snapshot off)"
    )
    settings_mod.add_arguments(
        p,
        [k.field for k in settings_mod.KNOBS if k.field != "topology"],
        defaults_text={"nodes": str(DEFAULT_NODES), "name": "run-<pid>"},
    )
    p.add_argument(
        "command",
        nargs="*",
        help="what every node runs (after --): one word is a shell command, several an "
        "argument vector",
    )


def command(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if args.cold:
        settings = settings.replace(snapshot="off")
    assert settings.nodes is not None
    plan = make_plan(args, settings.nodes)
    try:
        with interrupts.sigterm_unwinds():
            return _run(plan, settings)
    except KeyboardInterrupt as exc:
        why = exc or "Ctrl-C"
        print(f"obmm-testbed run: interrupted ({why}); the cluster is stopped", file=sys.stderr)
        interrupts.exiting()
        return EXIT_INTERRUPTED


def _run(plan: Plan, settings: Settings) -> int:
    from obmm.testbed.progress import Progress
    from obmm.testbed.session import bring_up
    from obmm.testbed.vm.cluster import default_logdir

    assert settings.name is not None
    t0 = time.monotonic()
    progress = Progress(f"run {settings.name}")
    archive: tuple[bytes, int] | None = None
    if plan.src is not None:
        archive = dir_archive(plan.src, plan.excludes)
    logdir = default_logdir(settings.name)
    session = bring_up(
        settings,
        purpose="run",
        default_topology="single" if plan.nodes == 1 else "pair",
        detach=plan.keep,
        logdir=logdir,
        progress=progress,
    )
    status = EXIT_GUEST_GONE
    try:
        if plan.src is not None and plan.dest is not None and archive is not None:
            data, files = archive
            c0 = time.monotonic()
            unpack_on(session.nodes, data, plan.dest)
            progress.line(
                f"copied {plan.src} ({files} files, {len(data) >> 10} KiB tar) to {plan.dest} "
                f"on {plan.nodes} node(s) in {time.monotonic() - c0:.2f} s"
            )
        guard = session.guard
        assert guard is not None
        guard.allow = plan.kernel_allow
        guard.start(f"obmm-testbed run {settings.name}")
        progress.line(f"running on {len(plan.commands)} node(s) (deadline {plan.timeout:.0f} s)")
        execution = Execution(
            plan,
            {n.index: n for n in session.nodes},
            stdout=sys.stdout.buffer,
            stderr=sys.stderr.buffer,
        )
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
        _teardown(plan, session, logdir, status)
    return status


def _teardown(plan: Plan, session: Session, logdir: Path, status: int) -> None:
    """Stop the cluster (or say how to reach a kept one)."""
    name = session.name
    if plan.keep:
        session.close_connections()
        session.cluster.disown()
        print(
            f"cluster {name} kept: obmm-testbed ssh --name {name} 0 "
            f"[-- CMD]; obmm-testbed status --name {name}; "
            f"obmm-testbed down --name {name}"
        )
        return
    session.stop()
    if status == 0:
        shutil.rmtree(logdir, ignore_errors=True)
    else:
        print(f"consoles kept in {logdir}", file=sys.stderr)
