"""This machine as a :class:`obmm.testbed.node.Node`: the bench's host-only mode.

Commands run through ``sh -c`` in their own process group; files are copied with the standard
library; handles are fetched and served with :mod:`obmm.exchange` in this process.  Nothing
here needs SSH or a VM.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING

from obmm import exchange
from obmm.exchange import DEFAULT_PORT
from obmm.testbed.node import DEFAULT_TIMEOUT_S, OutputFn
from obmm.testbed.ssh import CommandFailed, CommandTimeout, Result

if TYPE_CHECKING:
    from obmm.handle import Handle
    from obmm.testbed.node import Node, Process

    def _processes(p: LocalProcess, s: ServedHandles) -> tuple[Process, Process]:
        return p, s


STOP_GRACE_S = 10.0
LOOPBACK = "127.0.0.1"


class LocalProcess:
    """A background command of this machine (its own process group)."""

    def __init__(self, argv: list[str], cwd: str | None, env: Mapping[str, str]) -> None:
        self.popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self._readers = [
            threading.Thread(target=_pump, args=(self.popen.stdout, self._out, None), daemon=True),
            threading.Thread(target=_pump, args=(self.popen.stderr, self._err, None), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.ready = threading.Event()

    @property
    def stdout(self) -> str:
        return b"".join(self._out).decode(errors="replace")

    @property
    def stderr(self) -> str:
        return b"".join(self._err).decode(errors="replace")

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def wait_ready(self, timeout: float = 60.0) -> None:
        if not self.ready.wait(timeout):
            self.stop()
            raise TimeoutError(f"local process {self.popen.args!r} was not ready in {timeout} s")

    def wait(self, timeout: float = DEFAULT_TIMEOUT_S) -> int:
        return self.popen.wait(timeout)

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.popen.poll() is not None:
                break
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                continue
        for reader in self._readers:
            reader.join(timeout=grace)
        return self.popen.poll()


def _pump(stream: IO[bytes], into: list[bytes], callback: OutputFn | None) -> None:
    for chunk in iter(lambda: stream.read1(1 << 16), b""):  # type: ignore[attr-defined]
        into.append(chunk)
        if callback is not None:
            callback(chunk)


class ServedHandles:
    """Handles this machine publishes (a server thread of this process), process-shaped."""

    def __init__(self, server: exchange.HandleServer) -> None:
        self.server = server
        self._stopped: int | None = None

    @property
    def stdout(self) -> str:
        host, port = self.server.address
        return f"serving on {host}:{port}\n"

    @property
    def stderr(self) -> str:
        return ""

    @property
    def running(self) -> bool:
        return self._stopped is None

    def wait_ready(self, timeout: float = 60.0) -> None:
        return None  # listening once start() returned

    def wait(self, timeout: float = DEFAULT_TIMEOUT_S) -> int:
        raise TimeoutError("a handle server runs until stopped")

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        if self._stopped is None:
            self.server.stop()
            self._stopped = 0
        return self._stopped


class LocalNode:
    """This machine, as node `index` of a one-machine "cluster"."""

    def __init__(self, index: int = 0, env: Mapping[str, str] | None = None) -> None:
        self._index = index
        self._env = dict(env or {})

    @property
    def index(self) -> int:
        return self._index

    @property
    def name(self) -> str:
        return "local"

    @property
    def addr(self) -> str:
        return LOOPBACK

    @property
    def env(self) -> Mapping[str, str]:
        return self._env

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
        start = time.monotonic()
        extra = {} if bare else {**self._env, **(env or {})}
        proc = subprocess.Popen(
            ["sh", "-c", command],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(cwd) if cwd else None,
            env={**os.environ, **extra},
        )
        out: list[bytes] = []
        err: list[bytes] = []
        assert proc.stdout is not None and proc.stderr is not None
        pumps = [
            threading.Thread(target=_pump, args=(proc.stdout, out, on_stdout), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, err, on_stderr), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # like an SSH channel closed at the deadline: what it started lives on
            proc.wait()
            raise CommandTimeout(
                f"local: `{command}` was stopped at its {timeout:g} s deadline",
                b"".join(out),
                b"".join(err),
            ) from None
        for pump in pumps:
            pump.join(timeout=5)
        result = Result(
            command, proc.returncode, b"".join(out), b"".join(err), time.monotonic() - start
        )
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
        ready_timeout: float = 60.0,
        timeout: float = 3600.0,
        cwd: str | PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
    ) -> LocalProcess:
        proc = LocalProcess(
            ["sh", "-c", command], str(cwd) if cwd else None, {**self._env, **(env or {})}
        )
        if ready_line is None and ready_port is None:
            return proc
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and proc.running:
            if ready_line is not None and ready_line in proc.stdout + proc.stderr:
                proc.ready.set()
                break
            time.sleep(0.05)
        proc.wait_ready(max(0.0, deadline - time.monotonic()))
        return proc

    def put(self, local: Path, remote: str | PurePosixPath, *, timeout: float = 300.0) -> None:
        dest = Path(str(remote))
        if Path(local).is_dir():
            shutil.copytree(local, dest, dirs_exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, dest)

    def get(self, remote: str | PurePosixPath, local: Path, *, timeout: float = 300.0) -> None:
        shutil.copyfile(str(remote), local)

    def alive(self) -> bool:
        return True

    def console_tail(self) -> str:
        return "(this machine: no console)"

    def console_since(self, marker: str) -> str:
        return ""

    def fetch_handle(
        self, server: Node | str, name: str = "region", *, port: int = DEFAULT_PORT,
        timeout: float = 60.0,
    ) -> Handle:  # fmt: skip
        host = server if isinstance(server, str) else server.addr
        return exchange.fetch(host, port, name, connect_timeout=timeout, read_timeout=timeout)

    def serve_handles(
        self, handles: Mapping[str, Handle], *, port: int = DEFAULT_PORT
    ) -> ServedHandles:
        server = exchange.HandleServer(LOOPBACK, port)
        for name, handle in handles.items():
            server.publish(name, handle)
        return ServedHandles(server.start())


if TYPE_CHECKING:

    def _conforms(n: LocalNode) -> Node:  # mypy: this machine keeps to the Node interface
        return n
