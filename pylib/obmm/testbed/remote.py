"""A node reached over SSH: the :class:`obmm.testbed.node.Node` interface on a Connection.

:class:`RemoteNode` holds one SSH connection (opened on first use; paramiko runs one channel
per command, so threads share it) and implements commands, background processes, files and
handle exchange on top of it.  QEMU guests (:class:`obmm.testbed.session.GuestNode`) and UB
hosts (:class:`obmm.testbed.hw.stage.HostNode`) subclass it with how to connect and whether
the node is alive.

Also here, because every front end needs them the same way: how a command is wrapped (own
process group, pidfile, working directory, environment), the environment a node's commands get
(:func:`node_env`), the node's identity as its UB controller shows it, and a directory as one
tar archive unpacked on every node at once.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shlex
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from obmm import envvars
from obmm.exchange import DEFAULT_PORT
from obmm.handle import Handle, HandleError
from obmm.testbed.errors import TestbedError
from obmm.testbed.node import DEFAULT_TIMEOUT_S, Node, OutputFn, SshNode
from obmm.testbed.parallel import on_each
from obmm.testbed.ssh import CommandFailed, CommandTimeout, Connection, Result, SshError

log = logging.getLogger(__name__)

#: Where the testbed puts the package, uapi, guest tests and modules on a node.
GUEST_ROOT = PurePosixPath("/opt/obmm-testbed")
#: Where commands run unless given a cwd.
WORKDIR = PurePosixPath("/root")
STOP_GRACE_S = 10.0
READY_POLL_S = 0.2
READY_TIMEOUT_S = 60.0
COPY_TIMEOUT_S = 300.0
#: The identity a node's controller publishes, read the way obmm.identity reads it.
IDENTITY_COMMAND = (
    "for f in /sys/devices/ub_bus_controller*/*/ubc; do d=${f%/ubc}; "
    '[ -e "$d/primary_cna" ] && cat "$d/primary_cna" "$d/eid" && break; done; true'
)
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


class NodeError(TestbedError, RuntimeError):
    """A step on a node failed (a process that never got ready, a handle that did not come)."""


class ProcessTimeout(NodeError):
    """A background process did not end (or get ready) in time."""


# -- commands -----------------------------------------------------------------------------------


def node_env(
    index: int, nodes: int, addrs: Sequence[str], identity: tuple[str, str], driver: str = "emu"
) -> dict[str, str]:
    """The environment every command of node `index` gets (see envvars, group ``node``)."""
    cna, eid = identity
    return {
        envvars.NODE_ID.name: str(index),
        envvars.NODE_COUNT.name: str(nodes),
        envvars.NODE_CNA.name: cna,
        envvars.NODE_EID.name: eid,
        envvars.NODE_ADDRS.name: " ".join(addrs),
        envvars.NODE_ADDR.name: addrs[index],
        envvars.NODE_DRIVER.name: driver,
        envvars.CFLAGS.name: f"-I{GUEST_ROOT / 'uapi'} -I{GUEST_ROOT / 'examples' / 'c'}",
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


def command_line(words: Sequence[str]) -> str:
    """The shell command for the words after ``--`` of `run`: one word is a shell command as
    it is; several are an argument vector, each word quoted."""
    if len(words) == 1:
        return words[0].strip()
    return shlex.join(words)


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


def new_pidfile(kind: str = "run") -> str:
    return f"/tmp/obmm-{kind}-{uuid.uuid4().hex[:10]}.pid"


# -- files --------------------------------------------------------------------------------------


def dir_archive(src: Path, excludes: Sequence[str] = ()) -> tuple[bytes, int]:
    """`src` as an uncompressed tar (the nodes unpack it at memory speed); and its file count."""
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


def unpack_on(nodes: Sequence[Node], data: bytes, dest: PurePosixPath) -> None:
    """Unpack the tar archive `data` at `dest` on every node at once."""
    command = f"mkdir -p {shlex.quote(str(dest))} && tar -xf - -C {shlex.quote(str(dest))}"

    def one(node: Node) -> None:
        try:
            node.run(command, timeout=COPY_TIMEOUT_S, check=True, stdin=data, bare=True)
        except Exception as exc:
            raise NodeError(f"{node.name}: copying the directory failed: {exc}") from exc

    on_each(nodes, one)


# -- background processes -----------------------------------------------------------------------


class RemoteProcess:
    """A command running in the background on a node, in its own process group."""

    def __init__(
        self,
        node: RemoteNode,
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
        self.pidfile = new_pidfile("proc")
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
            res = self.node.connection().run(
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
            raise NodeError(f"{self.name}: {self.error}\n" + self._describe())
        assert self.status is not None
        return self.status

    def _signal(self, sig: str) -> None:
        with contextlib.suppress(SshError):
            self.node.run(stop_command(self.pidfile, sig), timeout=30, bare=True)

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
            self.node.run(f"rm -f {shlex.quote(self.pidfile)}", timeout=30, bare=True)
        return self.status


# -- the node -----------------------------------------------------------------------------------


class RemoteNode:
    """A node over SSH.  Subclasses say how to connect and whether the node is alive."""

    def __init__(
        self, index: int, name: str, *, addr: str = "", env: Mapping[str, str] | None = None
    ) -> None:
        self._index = index
        self._name = name
        self._addr = addr
        self._env: dict[str, str] = dict(env or {})
        self.workdir = WORKDIR
        self.processes: list[RemoteProcess] = []
        self._conn: Connection | None = None
        self._conn_lock = threading.Lock()

    # -- what subclasses provide ---------------------------------------------------------------

    def connect(self, timeout: float | None = None, *, node_only: bool = True) -> Connection:
        """A new logged-in SSH connection of the caller's own (long-lived channels); with
        `node_only` (the default) it fails only once this node died, else once any did."""
        raise NotImplementedError

    def alive(self) -> bool:
        return True

    def console_tail(self) -> str:
        return ""

    def console_since(self, marker: str) -> str:
        return ""

    # -- identity ------------------------------------------------------------------------------

    @property
    def index(self) -> int:
        return self._index

    @property
    def name(self) -> str:
        return self._name

    @property
    def addr(self) -> str:
        return self._addr

    @property
    def env(self) -> Mapping[str, str]:
        return self._env

    def set_env(self, env: Mapping[str, str]) -> None:
        self._env = dict(env)

    @property
    def cna(self) -> str:
        return self._env.get(envvars.NODE_CNA.name, "")

    @property
    def eid(self) -> str:
        return self._env.get(envvars.NODE_EID.name, "")

    def read_identity(self) -> tuple[str, str]:
        """(CNA, EID) as the node's UB controller publishes them; empty without a controller."""
        words = self.run(IDENTITY_COMMAND, timeout=60, bare=True).out.split()
        return (words[0], words[1]) if len(words) >= 2 else ("", "")

    # -- commands ------------------------------------------------------------------------------

    def connection(self) -> Connection:
        """The node's shared connection (opened on first use)."""
        with self._conn_lock:
            if self._conn is None:
                self._conn = self.open_connection()
            return self._conn

    def open_connection(self) -> Connection:
        """How the shared connection is opened (a subclass may hand over one it has)."""
        return self.connect()

    def close(self) -> None:
        with self._conn_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def run(
        self,
        command: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        check: bool = False,
        stdin: bytes | None = None,
        on_stdout: OutputFn | None = None,
        on_stderr: OutputFn | None = None,
        cwd: str | PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
        bare: bool = False,
    ) -> Result:
        conn = self.connection()
        if bare:
            return conn.run(
                command, timeout=timeout, check=check, stdin=stdin, on_stdout=on_stdout,
                on_stderr=on_stderr,
            )  # fmt: skip
        pidfile = new_pidfile()
        wrapped = wrap_command(
            command, {**self._env, **(env or {})}, PurePosixPath(cwd or self.workdir), pidfile
        )
        try:
            res = conn.run(
                wrapped, timeout=timeout, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr
            )
        except CommandTimeout as exc:
            with contextlib.suppress(SshError):
                conn.run(stop_command(pidfile, "KILL") + f"; rm -f {pidfile}", timeout=30)
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
    ) -> RemoteProcess:
        """Start `command` in the background; with `ready_line` (text in its output) or
        `ready_port` (a TCP port listening) it returns once the process is ready."""
        proc = RemoteProcess(
            self,
            command,
            name=name or command.split()[0],
            cwd=PurePosixPath(cwd or self.workdir),
            env={**self._env, **(env or {})},
            timeout=timeout,
            ready_line=ready_line,
        )
        self.processes.append(proc)
        if ready_port is not None:

            def probe() -> None:
                with contextlib.suppress(SshError):
                    res = self.run(
                        wait_port_command(ready_port, proc.pidfile),
                        timeout=ready_timeout,
                        bare=True,
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

    # -- files ---------------------------------------------------------------------------------

    def put(
        self, local: Path, remote: str | PurePosixPath, *, timeout: float = COPY_TIMEOUT_S
    ) -> None:
        local = Path(local)
        if local.is_dir():
            data, _ = dir_archive(local)
            unpack_on([self], data, PurePosixPath(remote))
            return
        dest = shlex.quote(str(remote))
        self.run(
            f'mkdir -p "$(dirname {dest})" && cat > {dest}',
            timeout=timeout, check=True, stdin=local.read_bytes(), bare=True,
        )  # fmt: skip

    def put_bytes(self, data: bytes, remote: str | PurePosixPath) -> None:
        self.run(f"cat > {shlex.quote(str(remote))}", check=True, stdin=data, bare=True)

    def get(
        self, remote: str | PurePosixPath, local: Path, *, timeout: float = COPY_TIMEOUT_S
    ) -> None:
        res = self.run(f"cat {shlex.quote(str(remote))}", timeout=timeout, check=True, bare=True)
        Path(local).write_bytes(res.stdout)

    def read_text(self, remote: str | PurePosixPath) -> str:
        return self.run(f"cat {shlex.quote(str(remote))}", check=True, bare=True).out

    # -- handles -------------------------------------------------------------------------------

    def python(self, script: str, *args: str, timeout: float = 60.0) -> Result:
        """`script` run by the node's python3 with the obmm package importable."""
        argv = " ".join(shlex.quote(a) for a in args)
        return self.run(f"python3 - {argv}", timeout=timeout, stdin=script.encode(), cwd=GUEST_ROOT)

    def fetch_handle(
        self, server: Node | str, name: str = "region", *, port: int = DEFAULT_PORT,
        timeout: float = 60.0,
    ) -> Handle:  # fmt: skip
        host = server if isinstance(server, str) else server.addr
        res = self.python(FETCH_SCRIPT, name, host, str(port), timeout=timeout)
        try:
            if not res.ok:
                raise HandleError(res.err.strip().splitlines()[-1] if res.err.strip() else "")
            return Handle.decode(bytes.fromhex(res.out.strip()))
        except (HandleError, ValueError) as exc:
            raise NodeError(
                f"{self.name}: fetching {name!r} from {host}:{port} failed: {exc}"
            ) from exc

    def list_handles(self, server: Node | str, *, port: int = DEFAULT_PORT) -> list[str]:
        host = server if isinstance(server, str) else server.addr
        res = self.python(FETCH_SCRIPT, "list", host, str(port))
        if not res.ok:
            raise NodeError(f"{self.name}: listing {host}:{port} failed: {res.err.strip()}")
        return [n for n in res.out.split() if n]

    def serve_handles(
        self, handles: Mapping[str, Handle], *, port: int = DEFAULT_PORT
    ) -> RemoteProcess:
        self.put_bytes(SERVE_SCRIPT.encode(), "/tmp/obmm-serve-handles.py")
        args = " ".join(shlex.quote(f"{n}={h.encode().hex()}") for n, h in handles.items())
        return self.start(
            f"exec python3 /tmp/obmm-serve-handles.py {self.addr} {port} {args}",
            name="serve-handles", ready_line="serving on", cwd=GUEST_ROOT,
        )  # fmt: skip


if TYPE_CHECKING:

    def _conforms(n: RemoteNode) -> SshNode:  # mypy: RemoteNode keeps to the interface
        return n
