"""obmm.exchange: handle publish/fetch over TCP on 127.0.0.1, including hostile peers."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from obmm.exchange import (
    MAX_FRAME,
    MAX_HANDLES,
    ExchangeBusyError,
    ExchangeConnectionError,
    ExchangeError,
    ExchangeProtocolError,
    ExchangeTimeoutError,
    HandleNotFoundError,
    HandleServer,
    fetch,
    list_names,
    validate_name,
)
from obmm.handle import Handle

LOCALHOST = "127.0.0.1"
Addr = tuple[str, int]

H1 = Handle(
    mem_id=1,
    tokenid=0x4A9,
    length=4 << 20,
    uba=0xFFFF_FFC0_0000,
    seid=bytes(range(16)),
    deid=bytes(16),
    scna=0x10,
    dcna=0x20,
    pxm_numa=-1,
    base_dist=0,
    node_id=0,
)
H2 = dataclasses.replace(H1, mem_id=2, tokenid=0x1234, node_id=3)

OK, NOT_FOUND, BAD_REQUEST, BUSY = 0, 1, 2, 3


def _request(op: int, arg: bytes = b"", *, magic: bytes = b"OBMX", version: int = 1) -> bytes:
    payload = magic + bytes([version, op]) + arg
    return struct.pack("<I", len(payload)) + payload


def _response(status: int, body: bytes = b"", *, magic: bytes = b"OBMX", version: int = 1) -> bytes:
    payload = magic + bytes([version, status]) + body
    return struct.pack("<I", len(payload)) + payload


def _parse_response(buf: bytes) -> tuple[int, bytes]:
    (length,) = struct.unpack_from("<I", buf)
    assert length == len(buf) - 4, f"frame length {length}, got {len(buf) - 4} payload bytes"
    assert buf[4:10] == b"OBMX\x01" + buf[9:10]
    return buf[9], buf[10:]


def _read_to_eof(sock: socket.socket, timeout: float = 3.0) -> bytes:
    sock.settimeout(timeout)
    chunks: list[bytes] = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _raw(addr: Addr, data: bytes) -> bytes:
    """Send ``data``, half-close, return everything the server sends until it closes."""
    with socket.create_connection(addr, timeout=2.0) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        return _read_to_eof(sock)


def exact(message: str) -> str:
    """A pytest.raises(match=...) pattern matching exactly ``message``."""
    return "^" + re.escape(message) + "$"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "obmm.exchange" and r.levelno >= logging.WARNING
    ]


def _assert_still_serves(server: HandleServer) -> None:
    start = time.monotonic()
    assert fetch(*server.address, "h1", connect_timeout=1.0, read_timeout=1.0) == H1
    assert time.monotonic() - start < 0.5


@pytest.fixture
def make_server() -> Iterator[Callable[..., HandleServer]]:
    """Factory for started servers (H1 published as "h1"); all are stopped at teardown."""
    servers: list[HandleServer] = []

    def make(*, read_timeout: float = 0.3, max_connections: int = 64) -> HandleServer:
        server = HandleServer(
            LOCALHOST, 0, read_timeout=read_timeout, max_connections=max_connections
        )
        server.publish("h1", H1)
        servers.append(server.start())
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def server(make_server: Callable[..., HandleServer]) -> HandleServer:
    return make_server()


@pytest.fixture
def silent_listener() -> Iterator[Addr]:
    """A port that accepts connections (kernel backlog) but never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOCALHOST, 0))
    sock.listen(8)
    yield (LOCALHOST, sock.getsockname()[1])
    sock.close()


@pytest.fixture
def closed_port() -> Addr:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOCALHOST, 0))
    port = sock.getsockname()[1]
    sock.close()  # never listened: connecting is refused
    return (LOCALHOST, port)


@pytest.fixture
def fake_peer() -> Iterator[Callable[[bytes], Addr]]:
    """Factory: a one-shot server that reads the request, sends fixed bytes and closes."""
    listeners: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def make(reply: bytes) -> Addr:
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.bind((LOCALHOST, 0))
        lsock.listen(1)
        lsock.settimeout(3.0)
        listeners.append(lsock)

        def serve() -> None:
            conn, _ = lsock.accept()
            with conn:
                conn.settimeout(3.0)
                (length,) = struct.unpack("<I", conn.recv(4, socket.MSG_WAITALL))
                conn.recv(length, socket.MSG_WAITALL)
                conn.sendall(reply)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        return (LOCALHOST, lsock.getsockname()[1])

    yield make
    for thread in threads:
        thread.join(5.0)
    for lsock in listeners:
        lsock.close()


# -- normal operation -------------------------------------------------------------------------


def test_publish_fetch_round_trip(server: HandleServer) -> None:
    server.publish("h2", H2)
    host, port = server.address
    assert host == LOCALHOST
    assert port > 0
    assert fetch(host, port, "h1") == H1
    assert fetch(host, port, "h2") == H2


def test_publish_replaces_existing_name(server: HandleServer) -> None:
    server.publish("h1", H2)
    assert fetch(*server.address, "h1") == H2


def test_list_names_is_sorted(server: HandleServer) -> None:
    server.publish("zeta", H2)
    server.publish("alpha.0", H2)
    assert list_names(*server.address) == ["alpha.0", "h1", "zeta"]
    assert server.names() == ["alpha.0", "h1", "zeta"]


def test_list_names_of_empty_server(server: HandleServer) -> None:
    server.withdraw("h1")
    assert list_names(*server.address) == []


def test_fetch_unknown_name_is_not_found(server: HandleServer) -> None:
    host, port = server.address
    with pytest.raises(HandleNotFoundError) as exc:
        fetch(host, port, "nope")
    assert str(exc.value) == f"fetch 'nope': 127.0.0.1:{port} has no handle named 'nope'"
    assert exc.value.peer == f"127.0.0.1:{port}"
    assert exc.value.name == "nope"
    assert isinstance(exc.value, ExchangeError)


def test_withdraw(server: HandleServer) -> None:
    server.withdraw("h1")
    with pytest.raises(HandleNotFoundError):
        fetch(*server.address, "h1")
    with pytest.raises(KeyError) as exc:
        server.withdraw("h1")
    assert exc.value.args == ("no handle named 'h1' is published",)


def test_publish_checks_its_arguments(server: HandleServer) -> None:
    with pytest.raises(ValueError, match=exact("handle name must not be empty")):
        server.publish("", H1)
    with pytest.raises(TypeError, match=exact("handle must be an obmm.handle.Handle, got bytes")):
        server.publish("x", H1.encode())  # type: ignore[arg-type]


def test_publish_limit(server: HandleServer) -> None:
    server.withdraw("h1")
    longest = "n" * 252
    for i in range(MAX_HANDLES):
        server.publish(f"{longest}{i:03d}", H1)
    server.publish(f"{longest}000", H2)  # replacing is fine at the limit
    with pytest.raises(
        ValueError, match=exact(f"cannot publish 'x': already {MAX_HANDLES} handles (limit)")
    ):
        server.publish("x", H1)
    # The largest possible LIST answer still fits in one frame.
    assert len(list_names(*server.address)) == MAX_HANDLES


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "handle name must not be empty"),
        ("x" * 256, "handle name is 256 characters long, the limit is 255"),
        (
            "a b",
            "handle name 'a b' has invalid character ' ' at index 1 "
            "(allowed: printable ASCII 0x21-0x7e, no spaces)",
        ),
        (
            "kv\n",
            "handle name 'kv\\n' has invalid character '\\n' at index 2 "
            "(allowed: printable ASCII 0x21-0x7e, no spaces)",
        ),
        (
            "caf\u00e9",
            "handle name 'caf\u00e9' has invalid character '\u00e9' at index 3 "
            "(allowed: printable ASCII 0x21-0x7e, no spaces)",
        ),
    ],
)
def test_invalid_names_are_refused_before_connecting(
    closed_port: Addr, name: str, message: str
) -> None:
    with pytest.raises(ValueError) as exc:
        fetch(*closed_port, name)
    assert str(exc.value) == message


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_invalid_port_is_refused(port: int) -> None:
    with pytest.raises(ValueError, match=exact(f"port must be 1-65535, got {port}")):
        fetch(LOCALHOST, port, "h1")


def test_valid_name_edges() -> None:
    validate_name("!")
    validate_name("~" * 255)
    validate_name("node0/kv-cache.v1")


def test_server_lifecycle_errors() -> None:
    server = HandleServer()
    with pytest.raises(RuntimeError, match=exact("HandleServer is not started")):
        _ = server.address
    with server, pytest.raises(RuntimeError, match=exact("HandleServer is already started")):
        server.start()
    server.stop()  # idempotent
    with pytest.raises(ValueError, match=exact("read_timeout must be positive, got 0")):
        HandleServer(read_timeout=0)
    with pytest.raises(ValueError, match=exact("max_connections must be at least 1, got 0")):
        HandleServer(max_connections=0)


def test_stopped_server_releases_its_port(make_server: Callable[..., HandleServer]) -> None:
    server = make_server()
    host, port = server.address
    server.stop()
    with pytest.raises(ExchangeConnectionError):
        fetch(host, port, "h1", connect_timeout=1.0)


# -- hostile or broken clients: each must leave the server serving others ---------------------


@pytest.mark.parametrize(
    ("request_bytes", "message"),
    [
        (
            struct.pack("<I", 10) + b"GET / HTTP",
            "bad request magic b'GET ' (expected b'OBMX')",
        ),
        (struct.pack("<I", 3) + b"OBM", "request too short (3 bytes, need at least 6)"),
        (struct.pack("<I", 0), "request too short (0 bytes, need at least 6)"),
        (
            _request(1, b"h1", version=9),
            "protocol version 9 not supported (server supports 1)",
        ),
        (_request(7, b"h1"), "unknown op 7"),
        (_request(2, b"junk"), "LIST request carries 4 unexpected bytes"),
        (
            _request(1, b"a b"),
            "invalid name b'a b': handle name 'a b' has invalid character ' ' at index 1 "
            "(allowed: printable ASCII 0x21-0x7e, no spaces)",
        ),
        (
            _request(1, b"\xff"),
            "invalid name b'\\xff': 'ascii' codec can't decode byte 0xff in position 0: "
            "ordinal not in range(128)",
        ),
        (_request(1), "invalid name b'': handle name must not be empty"),
        (
            struct.pack("<I", 0xFFFF_FFFF),
            "frame length 4294967295 exceeds the 65536-byte limit",
        ),
        (
            struct.pack("<I", MAX_FRAME + 1),
            "frame length 65537 exceeds the 65536-byte limit",
        ),
        (
            struct.pack("<I", MAX_FRAME) + b"\x00" * MAX_FRAME,
            "bad request magic b'\\x00\\x00\\x00\\x00' (expected b'OBMX')",
        ),
    ],
    ids=[
        "bad-magic",
        "short",
        "empty",
        "newer-version",
        "unknown-op",
        "list-with-arg",
        "bad-name",
        "non-ascii-name",
        "empty-name",
        "oversized-u32max",
        "oversized-by-one",
        "max-frame-is-read",
    ],
)
def test_bad_request_gets_bad_request_reply_and_server_survives(
    server: HandleServer, caplog: pytest.LogCaptureFixture, request_bytes: bytes, message: str
) -> None:
    caplog.set_level(logging.INFO, logger="obmm.exchange")
    status, body = _parse_response(_raw(server.address, request_bytes))
    assert (status, body.decode()) == (BAD_REQUEST, message)
    assert any(w.startswith("bad client 127.0.0.1:") and message in w for w in _warnings(caplog))
    _assert_still_serves(server)


def test_garbage_stream_is_dropped_and_server_survives(
    server: HandleServer, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.create_connection(server.address, timeout=2.0) as sock:
        sock.sendall(b"hello, this is not an obmm request at all\r\n" * 20)
        # The server rejects the length prefix b"hell" and closes with input unread, which the
        # kernel may turn into a reset; either way the connection must end.
        with contextlib.suppress(ConnectionResetError):
            _read_to_eof(sock)
    assert any(
        w.endswith("frame length 1819043176 exceeds the 65536-byte limit; closing")
        for w in _warnings(caplog)
    )
    _assert_still_serves(server)


def test_slow_peer_does_not_stall_others_and_is_closed_after_read_timeout(
    make_server: Callable[..., HandleServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = make_server(read_timeout=0.6)
    with socket.create_connection(server.address, timeout=3.0) as slow:
        opened = time.monotonic()
        # Another client is served at once while the slow one holds its connection.
        start = time.monotonic()
        assert fetch(*server.address, "h1", read_timeout=1.0) == H1
        assert time.monotonic() - start < 0.3
        assert _read_to_eof(slow) == b""  # closed without an answer
        waited = time.monotonic() - opened
    assert 0.5 <= waited < 1.5
    assert any(
        w.startswith("bad client 127.0.0.1:")
        and w.endswith("no complete request within 0.6 s; closing")
        for w in _warnings(caplog)
    )
    _assert_still_serves(server)


def test_trickling_peer_is_cut_off_at_the_deadline(
    make_server: Callable[..., HandleServer],
) -> None:
    # The read timeout is a deadline for the whole request, not per recv(): a byte every
    # 0.3 s must not keep the connection alive past 0.4 s.
    server = make_server(read_timeout=0.4)
    with socket.create_connection(server.address, timeout=3.0) as sock:
        opened = time.monotonic()
        sock.sendall(b"\x10")
        time.sleep(0.3)
        sock.sendall(b"\x00")
        assert _read_to_eof(sock) == b""
        waited = time.monotonic() - opened
    assert 0.35 <= waited < 0.6
    _assert_still_serves(server)


@pytest.mark.parametrize(
    ("data", "logged"),
    [
        (
            struct.pack("<I", 100) + b"OBMX\x01\x01abcd",
            "disconnected mid-message (got 14 of 104 bytes)",
        ),
        (b"\x10\x00", "disconnected mid-message (got 2 of ? bytes)"),
    ],
    ids=["mid-payload", "mid-length-prefix"],
)
def test_disconnect_mid_message(
    server: HandleServer, caplog: pytest.LogCaptureFixture, data: bytes, logged: str
) -> None:
    assert _raw(server.address, data) == b""
    assert any(w.endswith(logged) for w in _warnings(caplog))
    _assert_still_serves(server)


def test_connect_and_close_is_not_a_warning(
    server: HandleServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="obmm.exchange")
    assert _raw(server.address, b"") == b""
    _assert_still_serves(server)
    assert _warnings(caplog) == []
    assert any(
        r.getMessage().endswith("closed the connection without sending a request")
        for r in caplog.records
    )


def test_connection_limit_answers_busy(make_server: Callable[..., HandleServer]) -> None:
    server = make_server(read_timeout=3.0, max_connections=1)
    host, port = server.address
    slow = socket.create_connection((host, port), timeout=3.0)
    try:
        with pytest.raises(ExchangeBusyError) as exc:
            fetch(host, port, "h1", read_timeout=1.0)
        assert str(exc.value) == (
            f"fetch 'h1': 127.0.0.1:{port} is busy (server busy: 1 connections open); retry later"
        )
    finally:
        slow.close()
    # Once the slow peer is gone its slot frees up.
    deadline = time.monotonic() + 2.0
    while True:
        try:
            assert fetch(host, port, "h1", read_timeout=1.0) == H1
            break
        except ExchangeBusyError:
            assert time.monotonic() < deadline, "slot never freed"
            time.sleep(0.02)


def test_stop_ends_open_connections_promptly() -> None:
    server = HandleServer(read_timeout=10.0).start()
    try:
        slow = socket.create_connection(server.address, timeout=3.0)
        time.sleep(0.1)  # let the server accept it
    finally:
        start = time.monotonic()
        server.stop()
        stopped_in = time.monotonic() - start
    with slow:
        assert _read_to_eof(slow) == b""
    assert stopped_in < 1.0


# -- client against bad servers ---------------------------------------------------------------


def test_client_read_timeout_against_silent_server(silent_listener: Addr) -> None:
    host, port = silent_listener
    start = time.monotonic()
    with pytest.raises(ExchangeTimeoutError) as exc:
        fetch(host, port, "h1", connect_timeout=1.0, read_timeout=0.3)
    elapsed = time.monotonic() - start
    assert str(exc.value) == f"fetch 'h1': no response from 127.0.0.1:{port} within 0.3 s"
    assert exc.value.peer == f"127.0.0.1:{port}"
    assert 0.25 <= elapsed < 1.0


def test_list_read_timeout_against_silent_server(silent_listener: Addr) -> None:
    host, port = silent_listener
    with pytest.raises(ExchangeTimeoutError) as exc:
        list_names(host, port, read_timeout=0.3)
    assert str(exc.value) == f"list: no response from 127.0.0.1:{port} within 0.3 s"


def test_connect_to_closed_port_fails_fast(closed_port: Addr) -> None:
    host, port = closed_port
    start = time.monotonic()
    with pytest.raises(ExchangeConnectionError) as exc:
        fetch(host, port, "h1", connect_timeout=2.0)
    assert time.monotonic() - start < 0.5
    assert str(exc.value) == (
        f"fetch 'h1': cannot connect to 127.0.0.1:{port}: connection refused "
        f"(is the server running?)"
    )
    assert exc.value.peer == f"127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"", "{peer} closed the connection without a response"),
        (
            _response(OK, H1.encode())[:20],
            "{peer} closed the connection mid-response (got 20 of 98 bytes)",
        ),
        (
            b"SSH-2.0-OpenSSH_9.2\r\n",
            "{peer} sent a frame of 759714643 bytes (limit 65536); not an obmm exchange server?",
        ),
        (
            _response(OK, H1.encode(), magic=b"XXXX"),
            "{peer} sent bad response magic b'XXXX' (expected b'OBMX'); "
            "not an obmm exchange server?",
        ),
        (
            _response(OK, H1.encode(), version=2),
            "{peer} speaks protocol version 2, this obmm speaks 1",
        ),
        (struct.pack("<I", 2) + b"OB", "{peer} sent a 2-byte response (need at least 6)"),
        (_response(9), "{peer} sent unknown response status 9"),
        (_response(BAD_REQUEST, b"no thanks"), "{peer} rejected the request: no thanks"),
        (
            _response(OK, H1.encode()[:-1]),
            "{peer} sent a bad handle: truncated handle: got 87 bytes, length field says 88",
        ),
        (
            _response(OK, H1.encode()[:4] + b"\x02\x00" + H1.encode()[6:]),
            "{peer} sent a bad handle: handle version 2 is newer than this obmm (supports 1); "
            "upgrade obmm-testbed",
        ),
    ],
    ids=[
        "eof",
        "mid-response",
        "not-obmm",
        "bad-magic",
        "newer-protocol",
        "short",
        "unknown-status",
        "rejected",
        "truncated-handle",
        "newer-handle",
    ],
)
def test_fetch_from_misbehaving_server(
    fake_peer: Callable[[bytes], Addr], reply: bytes, message: str
) -> None:
    host, port = fake_peer(reply)
    with pytest.raises(ExchangeProtocolError) as exc:
        fetch(host, port, "h1", connect_timeout=1.0, read_timeout=2.0)
    peer = f"127.0.0.1:{port}"
    assert str(exc.value) == "fetch 'h1': " + message.format(peer=peer)
    assert exc.value.peer == peer


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (
            _response(OK, b"a\nb c"),
            "list: {peer} sent a bad name list: handle name 'b c' has "
            "invalid character ' ' at index 1 (allowed: printable ASCII 0x21-0x7e, no spaces)",
        ),
        (_response(NOT_FOUND, b"?"), "list: {peer} answered LIST with status 1"),
    ],
    ids=["bad-name", "not-found"],
)
def test_list_from_misbehaving_server(
    fake_peer: Callable[[bytes], Addr], reply: bytes, message: str
) -> None:
    host, port = fake_peer(reply)
    with pytest.raises(ExchangeProtocolError) as exc:
        list_names(host, port, read_timeout=2.0)
    assert str(exc.value) == message.format(peer=f"127.0.0.1:{port}")


# -- run_server (the CLI entry point) ---------------------------------------------------------


# run_server is what the CLI runs in its main thread until Ctrl-C.  It runs in a child whose
# SIGINT is reset to the default, as in a terminal: a process that inherited SIGINT ignored (a
# background job of a non-interactive shell, e.g. `make test &`) gets no KeyboardInterrupt at
# all, and an in-process _thread.interrupt_main() then does nothing (the suite hung on that).
RUN_SERVER = """
import sys
from obmm.exchange import run_server
from obmm.handle import Handle
handles = {name: Handle.decode(bytes.fromhex(raw)) for name, raw in
           (arg.split("=") for arg in sys.argv[1:])}
run_server("127.0.0.1", 0, handles, read_timeout=0.5,
           on_ready=lambda addr: print(addr[1], flush=True))
print("stopped", flush=True)
"""


def test_run_server_serves_until_interrupted() -> None:
    repo = Path(__file__).resolve().parents[3]
    child = subprocess.Popen(
        [sys.executable, "-c", RUN_SERVER, f"h1={H1.encode().hex()}", f"h2={H2.encode().hex()}"],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(repo / "pylib")),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        assert fetch(LOCALHOST, port, "h2", read_timeout=2.0) == H2
        assert list_names(LOCALHOST, port, read_timeout=2.0) == ["h1", "h2"]
        child.send_signal(signal.SIGINT)  # what Ctrl-C does to the CLI
        assert child.wait(timeout=10) == 0
        assert child.stdout.read() == "stopped\n"  # run_server returned normally
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with pytest.raises(ExchangeConnectionError):  # the port was released on the way out
        fetch(LOCALHOST, port, "h1", connect_timeout=1.0)
