"""Handle exchange over TCP: a server that publishes named handles and a client that fetches them.

This replaces the seed's one-shot exchange (server.c sent one raw struct to whoever connected) with
a request/response protocol, so one server can publish several regions and every message is
checked.

Protocol, version 1. Every message, both directions, is one frame::

    u32 little-endian payload length (at most MAX_FRAME = 65536) | payload

A connection carries exactly one request and one response; the server then closes it.

Request payload::

    offset 0  4 bytes  magic b"OBMX"
    offset 4  u8       protocol version, 1
    offset 5  u8       op: 1 = GET, 2 = LIST
    offset 6  ...      GET: the handle name (ASCII, see validate_name); LIST: empty

Response payload::

    offset 0  4 bytes  magic b"OBMX"
    offset 4  u8       protocol version, 1
    offset 5  u8       status: 0 = OK, 1 = NOT_FOUND, 2 = BAD_REQUEST, 3 = BUSY
    offset 6  ...      OK + GET: one encoded handle (obmm.handle, HANDLE_SIZE bytes)
                       OK + LIST: the published names, sorted, joined by b"\\n" (empty if none)
                       otherwise: an ASCII error text

Names are 1 to MAX_NAME_LEN characters from 0x21-0x7e (printable ASCII without space), so they
are safe in shells, logs and the LIST separator.

Robustness: each connection gets its own thread and must deliver its whole request within the
server's ``read_timeout`` (an overall deadline, so a peer trickling one byte at a time cannot hold a
thread forever). A frame length over MAX_FRAME is answered with BAD_REQUEST and the connection
closed without reading the body. At most ``max_connections`` connections are served at once;
extra ones get BUSY. Bad clients are logged on the ``obmm.exchange`` logger.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from obmm.handle import Handle, HandleError

__all__ = [
    "DEFAULT_PORT",
    "MAX_FRAME",
    "MAX_HANDLES",
    "MAX_NAME_LEN",
    "ExchangeBusyError",
    "ExchangeConnectionError",
    "ExchangeError",
    "ExchangeProtocolError",
    "ExchangeTimeoutError",
    "HandleNotFoundError",
    "HandleServer",
    "fetch",
    "list_names",
    "run_server",
    "validate_name",
]

log = logging.getLogger(__name__)

# The seed's exchange port (scheme7 server.c), kept so the two are easy to tell apart in notes.
DEFAULT_PORT = 13857
MAX_FRAME = 64 * 1024
MAX_NAME_LEN = 255
# Keeps a LIST response within MAX_FRAME: 200 * (255 + 1) + header < 65536.
MAX_HANDLES = 200

PROTO_MAGIC = b"OBMX"
PROTO_VERSION = 1

OP_GET = 1
OP_LIST = 2

STATUS_OK = 0
STATUS_NOT_FOUND = 1
STATUS_BAD_REQUEST = 2
STATUS_BUSY = 3

_LEN = struct.Struct("<I")
_HEAD = struct.Struct("<4sBB")  # magic, version, op (request) or status (response)

_DEFAULT_CONNECT_TIMEOUT = 5.0
_DEFAULT_READ_TIMEOUT = 10.0
_DEFAULT_SERVER_READ_TIMEOUT = 5.0
_DEFAULT_MAX_CONNECTIONS = 64
# How often the accept loop checks for stop(); bounds how long stop() takes.
_POLL_INTERVAL = 0.05
# A BUSY reply goes to a fresh socket whose send buffer is empty; never wait long on it.
_BUSY_SEND_TIMEOUT = 0.1

assert MAX_HANDLES * (MAX_NAME_LEN + 1) + _HEAD.size <= MAX_FRAME


# -- errors ---------------------------------------------------------------------------------------


class ExchangeError(Exception):
    """A handle exchange with ``peer`` ("host:port") failed."""

    def __init__(self, message: str, *, peer: str) -> None:
        super().__init__(message)
        self.peer = peer


class ExchangeConnectionError(ExchangeError):
    """Could not connect to the peer, or the connection broke."""


class ExchangeTimeoutError(ExchangeError):
    """The peer did not accept the connection or answer within the timeout."""


class ExchangeProtocolError(ExchangeError):
    """The peer sent something that is not a valid response, or rejected our request."""


class HandleNotFoundError(ExchangeError):
    """The peer publishes no handle under the requested name."""

    def __init__(self, message: str, *, peer: str, name: str) -> None:
        super().__init__(message, peer=peer)
        self.name = name


class ExchangeBusyError(ExchangeError):
    """The peer is at its connection limit; retry later."""


# -- shared helpers -------------------------------------------------------------------------------


def validate_name(name: str) -> None:
    """Raise ValueError unless ``name`` is a valid handle name."""
    if not isinstance(name, str):
        raise TypeError(f"handle name must be a str, got {type(name).__name__}")
    if not name:
        raise ValueError("handle name must not be empty")
    if len(name) > MAX_NAME_LEN:
        raise ValueError(f"handle name is {len(name)} characters long, the limit is {MAX_NAME_LEN}")
    for i, ch in enumerate(name):
        if not "\x21" <= ch <= "\x7e":
            raise ValueError(
                f"handle name {name!r} has invalid character {ch!r} at index {i} "
                f"(allowed: printable ASCII 0x21-0x7e, no spaces)"
            )


def _fmt_addr(addr: Any) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class _PeerClosed(Exception):
    """EOF before a whole frame arrived. ``got`` counts frame bytes, prefix included."""

    def __init__(self, got: int, want: int | None) -> None:
        super().__init__(got, want)
        self.got = got
        self.want = want  # None while the length prefix itself is incomplete


class _FrameTooLarge(Exception):
    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length


def _recv_exact(sock: socket.socket, n: int, deadline: float, got_before: int) -> bytes:
    """Read exactly n bytes by ``deadline`` (monotonic); socket.timeout when it passes."""
    chunks: list[bytes] = []
    have = 0
    while have < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("deadline passed")
        sock.settimeout(remaining)
        chunk = sock.recv(n - have)
        if not chunk:
            raise _PeerClosed(got_before + have, None)
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


def _recv_frame(sock: socket.socket, deadline: float) -> bytes:
    (length,) = _LEN.unpack(_recv_exact(sock, _LEN.size, deadline, 0))
    if length > MAX_FRAME:
        raise _FrameTooLarge(length)
    try:
        return _recv_exact(sock, length, deadline, _LEN.size)
    except _PeerClosed as exc:
        raise _PeerClosed(exc.got, _LEN.size + length) from None


def _frame(payload: bytes) -> bytes:
    return _LEN.pack(len(payload)) + payload


# -- server ---------------------------------------------------------------------------------------


class _Handler(socketserver.BaseRequestHandler):
    server: _TCPServer
    request: socket.socket

    def handle(self) -> None:
        srv = self.server
        sock = self.request
        peer = _fmt_addr(self.client_address)
        deadline = time.monotonic() + srv.read_timeout
        try:
            payload = _recv_frame(sock, deadline)
        except _FrameTooLarge as exc:
            msg = f"frame length {exc.length} exceeds the {MAX_FRAME}-byte limit"
            log.warning("bad client %s: %s; closing", peer, msg)
            self._reply(STATUS_BAD_REQUEST, msg.encode())
            return
        except socket.timeout:
            log.warning(
                "bad client %s: no complete request within %.3g s; closing", peer, srv.read_timeout
            )
            return
        except _PeerClosed as exc:
            if srv.stopping:
                return
            if exc.got == 0:
                # Port probes and health checks do this; not worth a warning.
                log.info("client %s closed the connection without sending a request", peer)
            else:
                want = "?" if exc.want is None else str(exc.want)
                log.warning(
                    "bad client %s: disconnected mid-message (got %d of %s bytes)",
                    peer,
                    exc.got,
                    want,
                )
            return
        except OSError as exc:
            if not srv.stopping:
                log.warning("client %s: connection error while reading: %s", peer, exc)
            return
        status, body = srv.answer(payload, peer)
        self._reply(status, body)

    def _reply(self, status: int, body: bytes) -> None:
        sock = self.request
        try:
            # A peer that never reads must not hold the thread either.
            sock.settimeout(self.server.read_timeout)
            sock.sendall(_frame(_HEAD.pack(PROTO_MAGIC, PROTO_VERSION, status) + body))
        except OSError as exc:
            log.warning(
                "client %s: could not send response: %s", _fmt_addr(self.client_address), exc
            )


class _TCPServer(socketserver.TCPServer):
    """Thread per connection with a connection cap; tracks live connections so stop() can end
    them instead of leaving threads behind."""

    allow_reuse_address = True
    request_queue_size = 16

    def __init__(
        self,
        address: tuple[str, int],
        *,
        read_timeout: float,
        max_connections: int,
        answer: Callable[[bytes, str], tuple[int, bytes]],
    ) -> None:
        self.address_family = _family(address[0])
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.answer = answer
        self.stopping = False
        self._lock = threading.Lock()
        self._active: dict[socket.socket, threading.Thread] = {}
        super().__init__(address, _Handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._lock:
            open_now = len(self._active)
        if open_now >= self.max_connections:
            peer = _fmt_addr(client_address)
            log.warning("client %s refused: %d connections already open", peer, open_now)
            text = f"server busy: {self.max_connections} connections open".encode()
            try:
                request.settimeout(_BUSY_SEND_TIMEOUT)
                request.sendall(_frame(_HEAD.pack(PROTO_MAGIC, PROTO_VERSION, STATUS_BUSY) + text))
            except OSError:
                pass
            return False
        return True

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_one,
            args=(request, client_address),
            name=f"obmm-exchange {_fmt_addr(client_address)}",
            daemon=True,
        )
        with self._lock:
            self._active[request] = thread
        try:
            thread.start()
        except BaseException:
            # The caller (socketserver) logs and closes the request; just forget it.
            with self._lock:
                self._active.pop(request, None)
            raise

    def _serve_one(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._lock:
                self._active.pop(request, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The default prints to stderr; route it to logging with the traceback.
        log.exception("internal error serving %s", _fmt_addr(client_address))

    def close_connections(self) -> None:
        """End every live connection and wait for its thread (called after the accept loop)."""
        self.stopping = True
        with self._lock:
            active = list(self._active.items())
        for sock, _ in active:
            with contextlib.suppress(OSError):  # already closed by its handler
                sock.shutdown(socket.SHUT_RDWR)
        for _, thread in active:
            thread.join(self.read_timeout + 1.0)


class HandleServer:
    """Publishes named handles over TCP (see the module docstring for the protocol).

    Use as a context manager, or call start()/stop(). ``port=0`` picks a free port; read it back
    from ``.address``. Binds only to ``host``.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        read_timeout: float = _DEFAULT_SERVER_READ_TIMEOUT,
        max_connections: int = _DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        if read_timeout <= 0:
            raise ValueError(f"read_timeout must be positive, got {read_timeout}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self._host = host
        self._port = port
        self._read_timeout = read_timeout
        self._max_connections = max_connections
        self._handles: dict[str, Handle] = {}
        self._lock = threading.Lock()
        self._server: _TCPServer | None = None
        self._thread: threading.Thread | None = None

    # -- publishing --

    def publish(self, name: str, handle: Handle) -> None:
        """Publish ``handle`` under ``name``, replacing any handle already published there."""
        validate_name(name)
        if not isinstance(handle, Handle):
            raise TypeError(f"handle must be an obmm.handle.Handle, got {type(handle).__name__}")
        with self._lock:
            if name not in self._handles and len(self._handles) >= MAX_HANDLES:
                raise ValueError(f"cannot publish {name!r}: already {MAX_HANDLES} handles (limit)")
            self._handles[name] = handle

    def withdraw(self, name: str) -> None:
        """Stop publishing ``name``; KeyError if it is not published."""
        with self._lock:
            if name not in self._handles:
                raise KeyError(f"no handle named {name!r} is published")
            del self._handles[name]

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._handles)

    # -- lifecycle --

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) actually bound; RuntimeError before start()."""
        if self._server is None:
            raise RuntimeError("HandleServer is not started")
        addr = self._server.server_address
        return (str(addr[0]), int(addr[1]))

    def _bind(self) -> _TCPServer:
        if self._server is not None:
            raise RuntimeError("HandleServer is already started")
        self._server = _TCPServer(
            (self._host, self._port),
            read_timeout=self._read_timeout,
            max_connections=self._max_connections,
            answer=self._answer,
        )
        log.info("handle server listening on %s", _fmt_addr(self._server.server_address))
        return self._server

    def start(self) -> HandleServer:
        """Bind and serve in a background thread."""
        server = self._bind()
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL},
            name=f"obmm-exchange-server {_fmt_addr(server.server_address)}",
            daemon=True,
        )
        self._thread.start()
        return self

    def serve_forever(self, on_ready: Callable[[tuple[str, int]], None] | None = None) -> None:
        """Bind and serve in the calling thread until stop() is called from another thread or
        the call is interrupted (KeyboardInterrupt propagates after cleanup)."""
        server = self._bind()
        try:
            if on_ready is not None:
                on_ready(self.address)
            server.serve_forever(poll_interval=_POLL_INTERVAL)
        finally:
            self._close(server)

    def stop(self) -> None:
        """Stop accepting, end open connections, release the port. Idempotent."""
        server, thread = self._server, self._thread
        if server is None:
            return
        if thread is not None:
            server.shutdown()  # waits for the accept loop to exit
            thread.join()
            self._close(server)
        else:
            # serve_forever() runs in another thread; it cleans up when its loop exits.
            server.shutdown()

    def _close(self, server: _TCPServer) -> None:
        server.server_close()
        server.close_connections()
        self._server = None
        self._thread = None
        log.info("handle server stopped")

    def __enter__(self) -> HandleServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- protocol --

    def _answer(self, payload: bytes, peer: str) -> tuple[int, bytes]:
        """Map one request payload to (status, body); runs in a connection thread."""

        def bad(msg: str) -> tuple[int, bytes]:
            log.warning("bad client %s: %s", peer, msg)
            return STATUS_BAD_REQUEST, msg.encode()

        if len(payload) < _HEAD.size:
            return bad(f"request too short ({len(payload)} bytes, need at least {_HEAD.size})")
        magic, version, op = _HEAD.unpack_from(payload)
        if magic != PROTO_MAGIC:
            return bad(f"bad request magic {magic!r} (expected {PROTO_MAGIC!r})")
        if version != PROTO_VERSION:
            return bad(
                f"protocol version {version} not supported (server supports {PROTO_VERSION})"
            )
        arg = payload[_HEAD.size :]
        if op == OP_LIST:
            if arg:
                return bad(f"LIST request carries {len(arg)} unexpected bytes")
            return STATUS_OK, "\n".join(self.names()).encode()
        if op != OP_GET:
            return bad(f"unknown op {op}")
        try:
            name = arg.decode("ascii")
            validate_name(name)
        except (UnicodeDecodeError, ValueError) as exc:
            return bad(f"invalid name {arg[:64]!r}: {exc}")
        with self._lock:
            handle = self._handles.get(name)
        if handle is None:
            log.info("client %s asked for unknown handle %r", peer, name)
            return STATUS_NOT_FOUND, f"no handle named {name!r}".encode()
        log.debug("client %s fetched %r", peer, name)
        return STATUS_OK, handle.encode()


def run_server(
    host: str,
    port: int,
    handles: Mapping[str, Handle],
    *,
    read_timeout: float = _DEFAULT_SERVER_READ_TIMEOUT,
    on_ready: Callable[[tuple[str, int]], None] | None = None,
) -> None:
    """Publish ``handles`` and serve in the calling thread until Ctrl-C (for the CLI).

    ``on_ready`` gets the bound (host, port) once the socket listens, e.g. to print a port
    chosen with ``port=0``.
    """
    server = HandleServer(host, port, read_timeout=read_timeout)
    for name, handle in handles.items():
        server.publish(name, handle)
    try:
        server.serve_forever(on_ready=on_ready)
    except KeyboardInterrupt:
        log.info("interrupted; handle server stopped")


# -- client ---------------------------------------------------------------------------------------


def _request(
    host: str,
    port: int,
    op: int,
    arg: bytes,
    what: str,
    connect_timeout: float,
    read_timeout: float,
) -> tuple[int, bytes, str]:
    """Send one request; return (status, body, peer) or raise ExchangeError."""
    if not 0 < port <= 0xFFFF:
        raise ValueError(f"port must be 1-65535, got {port}")
    peer = _fmt_addr((host, port))
    try:
        sock = socket.create_connection((host, port), timeout=connect_timeout)
    except socket.timeout:
        raise ExchangeTimeoutError(
            f"{what}: cannot connect to {peer}: timed out after {connect_timeout:g} s", peer=peer
        ) from None
    except ConnectionRefusedError:
        raise ExchangeConnectionError(
            f"{what}: cannot connect to {peer}: connection refused (is the server running?)",
            peer=peer,
        ) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ExchangeConnectionError(
            f"{what}: cannot connect to {peer}: {reason}", peer=peer
        ) from exc
    with sock:
        deadline = time.monotonic() + read_timeout
        try:
            sock.settimeout(read_timeout)
            sock.sendall(_frame(_HEAD.pack(PROTO_MAGIC, PROTO_VERSION, op) + arg))
            payload = _recv_frame(sock, deadline)
        except socket.timeout:
            raise ExchangeTimeoutError(
                f"{what}: no response from {peer} within {read_timeout:g} s", peer=peer
            ) from None
        except _PeerClosed as exc:
            if exc.got == 0:
                detail = "closed the connection without a response"
            else:
                want = "?" if exc.want is None else str(exc.want)
                detail = f"closed the connection mid-response (got {exc.got} of {want} bytes)"
            raise ExchangeProtocolError(f"{what}: {peer} {detail}", peer=peer) from None
        except _FrameTooLarge as exc:
            raise ExchangeProtocolError(
                f"{what}: {peer} sent a frame of {exc.length} bytes "
                f"(limit {MAX_FRAME}); not an obmm exchange server?",
                peer=peer,
            ) from None
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ExchangeConnectionError(
                f"{what}: connection to {peer} failed: {reason}", peer=peer
            ) from exc
    if len(payload) < _HEAD.size:
        raise ExchangeProtocolError(
            f"{what}: {peer} sent a {len(payload)}-byte response (need at least {_HEAD.size})",
            peer=peer,
        )
    magic, version, status = _HEAD.unpack_from(payload)
    if magic != PROTO_MAGIC:
        raise ExchangeProtocolError(
            f"{what}: {peer} sent bad response magic {magic!r} (expected {PROTO_MAGIC!r}); "
            f"not an obmm exchange server?",
            peer=peer,
        )
    if version != PROTO_VERSION:
        raise ExchangeProtocolError(
            f"{what}: {peer} speaks protocol version {version}, this obmm speaks {PROTO_VERSION}",
            peer=peer,
        )
    body = payload[_HEAD.size :]
    if status == STATUS_BAD_REQUEST:
        text = body.decode("ascii", "replace")
        raise ExchangeProtocolError(f"{what}: {peer} rejected the request: {text}", peer=peer)
    if status == STATUS_BUSY:
        text = body.decode("ascii", "replace")
        raise ExchangeBusyError(f"{what}: {peer} is busy ({text}); retry later", peer=peer)
    if status not in (STATUS_OK, STATUS_NOT_FOUND):
        raise ExchangeProtocolError(
            f"{what}: {peer} sent unknown response status {status}", peer=peer
        )
    return status, body, peer


def fetch(
    host: str,
    port: int,
    name: str,
    *,
    connect_timeout: float = _DEFAULT_CONNECT_TIMEOUT,
    read_timeout: float = _DEFAULT_READ_TIMEOUT,
) -> Handle:
    """Fetch the handle published as ``name`` by the server at host:port.

    Raises ValueError for an invalid name, otherwise only ExchangeError subclasses.
    ``read_timeout`` bounds the whole wait for the response.
    """
    validate_name(name)
    what = f"fetch {name!r}"
    status, body, peer = _request(
        host, port, OP_GET, name.encode("ascii"), what, connect_timeout, read_timeout
    )
    if status == STATUS_NOT_FOUND:
        raise HandleNotFoundError(
            f"{what}: {peer} has no handle named {name!r}", peer=peer, name=name
        )
    try:
        return Handle.decode(body)
    except HandleError as exc:
        raise ExchangeProtocolError(f"{what}: {peer} sent a bad handle: {exc}", peer=peer) from exc


def list_names(
    host: str,
    port: int,
    *,
    connect_timeout: float = _DEFAULT_CONNECT_TIMEOUT,
    read_timeout: float = _DEFAULT_READ_TIMEOUT,
) -> list[str]:
    """Return the names the server at host:port publishes, sorted."""
    status, body, peer = _request(host, port, OP_LIST, b"", "list", connect_timeout, read_timeout)
    if status != STATUS_OK:
        raise ExchangeProtocolError(f"list: {peer} answered LIST with status {status}", peer=peer)
    if not body:
        return []
    try:
        names = body.decode("ascii").split("\n")
        for name in names:
            validate_name(name)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ExchangeProtocolError(f"list: {peer} sent a bad name list: {exc}", peer=peer) from exc
    return names
