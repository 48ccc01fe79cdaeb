"""The two protocols of our UBSE: text lines to the C client, framed JSON between nodes.

Client <-> its node's service (a Unix stream socket, one request per connection):

* request: one line of space-separated tokens, ``OP ARG...``; lists are comma separated and
  ``-`` is an absent value (names carry no space: the client refuses them before sending);
* response: ``status CODE`` then records, one a line, until the service closes the socket:
  ``node F*12``, ``link SLOT SOCKET PORT PEER_SLOT PEER_SOCKET PEER_PORT``,
  ``numa SLOT SOCKET NUMA RATIO TOTAL FREE BORROW LEND``,
  ``shm NAME MEM_SIZE UNIT_SIZE STAGE USR_INFO_HEX F*12`` (the export node) followed by its
  ``imp STAGE MEMID,MEMID... F*12`` lines (the importing node);
  ``F*12`` is a node: slot, hostname, its two socket ids, then 2 x 4 NUMA ids
  (ubs_topo_node_t's fields; 4294967295 where there is none).

Service <-> service (TCP on the inter-node network, one request per connection): a frame is a
u32 little-endian length and that many bytes of a JSON object; a request has ``op``, a response
``code`` (a UBSE code), ``message`` and ``data``.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Any

from obmm.ubse.registry import Node

MAX_FRAME = 16 << 20
NONE32 = 0xFFFFFFFF
SOCKETS = 2
NUMAS = 4
_LEN = struct.Struct("<I")


class WireError(Exception):
    """A peer that cannot be reached or that answered something malformed."""


# -- client side: text ------------------------------------------------------------------------


def node_fields(node: Node) -> list[str]:
    numa = [*node.numa[:NUMAS], *[NONE32] * NUMAS][:NUMAS]
    return [
        str(node.slot),
        node.hostname or "-",
        "0",
        str(NONE32),
        *(str(n) for n in numa),
        *([str(NONE32)] * NUMAS),
    ]


def csv(values: Iterable[int]) -> str:
    text = ",".join(str(v) for v in values)
    return text or "-"


def parse_csv(token: str) -> list[int] | None:
    """The list a token holds; None for ``-`` (absent)."""
    if token == "-":
        return None
    return [int(v, 0) for v in token.split(",")]


def shm_lines(desc: dict[str, Any], node_of: Any) -> list[str]:
    """The ``shm`` line of a descriptor and its ``imp`` lines (`node_of(slot) -> Node`)."""
    lines = [
        " ".join(
            [
                "shm",
                desc["name"],
                str(desc["mem_size"]),
                str(desc["unit_size"]),
                str(desc["stage"]),
                desc["usr_info"] or "-",
                *node_fields(node_of(desc["export_slot"])),
            ]
        )
    ]
    for imp in desc["imports"]:
        lines.append(
            " ".join(
                ["imp", str(imp["stage"]), csv(imp["mem_ids"]), *node_fields(node_of(imp["slot"]))]
            )
        )
    return lines


def response(code: int, lines: Sequence[str] = ()) -> bytes:
    return "".join(f"{line}\n" for line in [f"status {code}", *lines]).encode()


# -- between services: framed JSON ------------------------------------------------------------


def send_frame(sock: socket.socket, doc: dict[str, Any]) -> None:
    payload = json.dumps(doc).encode()
    sock.sendall(_LEN.pack(len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 16))
        if not chunk:
            raise WireError("peer closed the connection mid-frame")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> dict[str, Any]:
    (length,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if length > MAX_FRAME:
        raise WireError(f"frame of {length} bytes is over {MAX_FRAME}")
    try:
        doc = json.loads(_recv_exact(sock, length))
    except ValueError as exc:
        raise WireError(f"frame is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise WireError("frame is not a JSON object")
    return doc


def call(addr: str, port: int, request: dict[str, Any], *, timeout: float = 60.0) -> dict[str, Any]:
    """One request to the service at addr:port, its response."""
    try:
        with socket.create_connection((addr, port), timeout=timeout) as sock:
            send_frame(sock, request)
            return recv_frame(sock)
    except OSError as exc:
        raise WireError(f"{addr} port {port}: {exc}") from exc


def call_retrying(
    addr: str, port: int, request: dict[str, Any], *, within: float, timeout: float = 60.0
) -> dict[str, Any]:
    """call(), again every half second until `within` seconds have passed (a peer starting)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return call(addr, port, request, timeout=timeout)
        except WireError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
