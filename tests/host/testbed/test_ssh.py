"""The SSH wrapper against an in-process paramiko server on loopback (no VM)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
import pytest

from obmm.testbed.ssh import (
    CommandFailed,
    CommandTimeout,
    Connection,
    ConnectTimeout,
    GuestGone,
    Target,
)


class _Server(paramiko.ServerInterface):
    def __init__(self, authorized: paramiko.PKey) -> None:
        self.authorized = authorized
        self.command: bytes | None = None
        self.ready = threading.Event()

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = username == "root" and key.asbytes() == self.authorized.asbytes()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.command = command
        self.ready.set()
        return True


def _serve_command(chan: paramiko.Channel, command: str) -> None:
    """A tiny command language standing in for a shell."""
    verb, _, arg = command.partition(" ")
    if verb == "echo":
        chan.sendall(arg.encode() + b"\n")
        chan.sendall_stderr(b"to-stderr\n")
        chan.send_exit_status(0)
    elif verb == "exit":
        chan.sendall_stderr(b"failing\n")
        chan.send_exit_status(int(arg))
    elif verb == "flood":
        # Interleave both streams far past the 2 MiB window; a client that reads only one
        # stream (or waits for the exit status first) deadlocks here.
        chunk = 64 * 1024
        total = int(arg)
        for _ in range(total // chunk):
            chan.sendall(b"o" * chunk)
            chan.sendall_stderr(b"e" * chunk)
        chan.send_exit_status(3)
    elif verb == "hang":
        time.sleep(float(arg))
        return
    elif verb == "cat":
        data = b""
        while not chan.eof_received:
            got = chan.recv(65536)
            if not got:
                break
            data += got
        chan.sendall(data)
        chan.send_exit_status(0)
    chan.close()


@dataclass
class FakeSshd:
    port: int
    key_file: Path
    host_key: paramiko.PKey
    stop: threading.Event = field(default_factory=threading.Event)
    delay_banner_until: float = 0.0

    def target(self, host_key: str | None = None) -> Target:
        return Target("127.0.0.1", self.port, self.key_file, host_key=host_key)


def _host_key_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


@pytest.fixture(scope="module")
def keys() -> tuple[paramiko.PKey, paramiko.PKey]:
    # RSA generation is the slow part of these tests: once per module.
    return paramiko.RSAKey.generate(2048), paramiko.RSAKey.generate(2048)


@pytest.fixture
def sshd(tmp_path: Path, keys: tuple[paramiko.PKey, paramiko.PKey]) -> Iterator[FakeSshd]:
    client_key, host_key = keys
    key_file = tmp_path / "id_rsa"
    client_key.write_private_key_file(str(key_file))
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    server = FakeSshd(listener.getsockname()[1], key_file, host_key)
    transports: list[paramiko.Transport] = []

    def handle(sock: socket.socket) -> None:
        if time.monotonic() < server.delay_banner_until:
            # Like sshd not started yet: QEMU's forward accepts, then drops the connection.
            sock.close()
            return
        t = paramiko.Transport(sock)
        transports.append(t)
        t.add_server_key(host_key)
        iface = _Server(client_key)
        try:
            t.start_server(server=iface)
        except (paramiko.SSHException, OSError, EOFError):
            # The client hung up during key exchange (e.g. it refused our host key); paramiko
            # raises EOFError when that happens before the first packet.
            return
        while not server.stop.is_set() and t.is_active():
            chan = t.accept(timeout=0.2)
            if chan is None:
                continue
            iface.ready.wait(5)
            iface.ready.clear()
            cmd = (iface.command or b"").decode()
            threading.Thread(target=_serve_command, args=(chan, cmd), daemon=True).start()

    def accept_loop() -> None:
        while not server.stop.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                continue
            threading.Thread(target=handle, args=(sock,), daemon=True).start()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    yield server
    server.stop.set()
    thread.join(5)
    listener.close()
    for t in transports:
        t.close()


def _connected(sshd: FakeSshd, **kw: object) -> Connection:
    conn = Connection(sshd.target(_host_key_line(sshd.host_key)), **kw)  # type: ignore[arg-type]
    conn.connect(time.monotonic() + 30)
    return conn


def test_exit_status_and_both_streams_come_back(sshd: FakeSshd) -> None:
    with _connected(sshd) as conn:
        result = conn.run("echo hello", timeout=10)
        assert (result.exit_status, result.out, result.err) == (0, "hello\n", "to-stderr\n")
        failed = conn.run("exit 42", timeout=10)
        assert failed.exit_status == 42 and failed.err == "failing\n"


def test_check_raises_with_the_status_and_stderr(sshd: FakeSshd) -> None:
    with _connected(sshd) as conn, pytest.raises(CommandFailed) as err:
        conn.run("exit 5", timeout=10, check=True)
    assert err.value.result.exit_status == 5
    assert "exit status 5" in str(err.value) and "failing" in str(err.value)


def test_large_output_on_both_streams_does_not_deadlock(sshd: FakeSshd) -> None:
    with _connected(sshd) as conn:
        result = conn.run("flood 8388608", timeout=60)
    assert result.exit_status == 3
    assert len(result.stdout) == len(result.stderr) == 8 << 20


def test_streaming_callbacks_see_all_output(sshd: FakeSshd) -> None:
    seen: list[bytes] = []
    with _connected(sshd) as conn:
        result = conn.run("flood 1048576", timeout=60, on_stdout=seen.append)
    assert b"".join(seen) == result.stdout


def test_stdin_is_delivered(sshd: FakeSshd) -> None:
    with _connected(sshd) as conn:
        assert conn.run("cat", timeout=10, stdin=b"payload" * 1000).stdout == b"payload" * 1000


def test_deadline_is_enforced_and_connection_survives(sshd: FakeSshd) -> None:
    with _connected(sshd) as conn:
        start = time.monotonic()
        with pytest.raises(CommandTimeout):
            conn.run("hang 30", timeout=1.5)
        assert time.monotonic() - start < 5
        assert conn.run("echo again", timeout=10).out == "again\n"


def test_dead_guest_is_reported_as_gone_not_as_timeout(sshd: FakeSshd) -> None:
    alive = threading.Event()
    alive.set()
    with _connected(sshd, alive=alive.is_set) as conn:
        threading.Timer(0.5, alive.clear).start()
        start = time.monotonic()
        with pytest.raises(GuestGone, match="QEMU exited"):
            conn.run("hang 30", timeout=60)
        assert time.monotonic() - start < 5


def test_connect_retries_while_sshd_starts(sshd: FakeSshd) -> None:
    sshd.delay_banner_until = time.monotonic() + 3
    start = time.monotonic()
    with _connected(sshd) as conn:
        assert conn.run("echo up", timeout=10).out == "up\n"
    assert time.monotonic() - start >= 2.5


def test_connect_gives_up_at_the_deadline(sshd: FakeSshd) -> None:
    sshd.delay_banner_until = time.monotonic() + 60
    conn = Connection(sshd.target())
    start = time.monotonic()
    with pytest.raises(ConnectTimeout):
        conn.connect(time.monotonic() + 2)
    assert time.monotonic() - start < 8


def test_connect_stops_at_once_when_qemu_is_gone(sshd: FakeSshd) -> None:
    sshd.delay_banner_until = time.monotonic() + 60
    conn = Connection(sshd.target(), alive=lambda: False)
    with pytest.raises(GuestGone):
        conn.connect(time.monotonic() + 60)


def test_wrong_host_key_is_refused(sshd: FakeSshd) -> None:
    other = paramiko.RSAKey.generate(2048)
    conn = Connection(sshd.target(_host_key_line(other)))
    with pytest.raises(ConnectTimeout, match="host key mismatch"):
        conn.connect(time.monotonic() + 2)


def test_sftp_failure_is_a_wrapper_error(sshd: FakeSshd, tmp_path: Path) -> None:
    # The fake server has no SFTP subsystem (copies are tested against a real guest in
    # tests/qemu); a refused subsystem must surface as the wrapper's error, not paramiko's.
    src = tmp_path / "f.txt"
    src.write_text("x")
    with _connected(sshd) as conn, pytest.raises((GuestGone, CommandTimeout)):
        conn.put(src, "/tmp/f.txt", timeout=3)


def test_login_attempts_start_short_and_double_when_they_use_up_their_bound(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from obmm.testbed import ssh as ssh_mod

    bounds: list[float] = []

    def fake_connect(self: paramiko.SSHClient, *args: object, **kw: object) -> None:
        bounds.append(float(kw["banner_timeout"]))  # type: ignore[arg-type]
        if len(bounds) == 1:
            raise paramiko.SSHException("Connection reset by peer")  # refused: no doubling
        if len(bounds) <= 3:
            time.sleep(float(kw["banner_timeout"]))  # type: ignore[arg-type]
            raise paramiko.SSHException("Error reading SSH protocol banner")
        # logged in

    monkeypatch.setattr(paramiko.SSHClient, "connect", fake_connect)
    monkeypatch.setattr(ssh_mod, "RETRY_INTERVAL_S", 0.0)
    conn = ssh_mod.Connection(Target("127.0.0.1", 1, tmp_path / "k"), name="n")
    conn.connect(time.monotonic() + 30)
    # 1 s, 1 s again after a refusal, then doubled after each attempt that used up its bound.
    assert bounds == [1.0, 1.0, 2.0, 4.0]
    conn.close()
