#!/usr/bin/env python3
"""Exporter service: export memory, fill a float pattern, serve the handle over TCP.

    python3 exporter.py [--bind ADDR] [--port PORT] [--size MIB] [--name NAME]

The seed's cross-node flow (scheme 7 server.c) with the obmm package: OBMM_CMD_EXPORT, float
element i = i * 0.001 through /dev/obmm_shmdev<mem_id>, then the handle (obmm.handle, 88 bytes)
is published with obmm.exchange until Ctrl-C / SIGTERM, and the memory is unexported.
The C client (examples/c/client.c) and this package's client read the same handle.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from array import array
from types import FrameType

import obmm
from obmm import exchange
from obmm.handle import Handle
from obmm.identity import NodeIdentity

MIB = 1 << 20
GRANULE = 2 * MIB
CHUNK = 1 << 16  # floats generated per step, to keep memory flat


def fill_floats(buf: memoryview, size: int) -> None:
    """float element i = i * 0.001 (computed in double, stored as float32, like the C side)."""
    n = size // 4
    for start in range(0, n, CHUNK):
        stop = min(n, start + CHUNK)
        chunk = array("f", [i * 0.001 for i in range(start, stop)])
        buf[start * 4 : stop * 4] = chunk.tobytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default="0.0.0.0", help="address to serve on (default all)")
    parser.add_argument("--port", type=int, default=exchange.DEFAULT_PORT)
    parser.add_argument("--size", type=int, default=4, help="MiB to export (default 4)")
    parser.add_argument("--name", default="region", help="handle name (default region)")
    # This node's identity comes from obmm.identity (as libobmm reads it); these override it.
    parser.add_argument("--node-id", type=int, default=None)
    parser.add_argument("--cna", type=lambda s: int(s, 0), default=None)
    parser.add_argument("--eid", type=lambda s: int(s, 0), default=None)
    args = parser.parse_args()
    me = NodeIdentity.local()
    me = NodeIdentity(
        node_id=me.node_id if args.node_id is None else args.node_id,
        cna=me.cna if args.cna is None else args.cna,
        # The EID as libobmm builds it: the first 32 bits, native byte order.
        eid=me.eid if args.eid is None else args.eid.to_bytes(4, sys.byteorder).ljust(16, b"\0"),
    )
    size = -(-args.size * MIB // GRANULE) * GRANULE

    with obmm.Obmm() as dev:
        exp = dev.export(size)
        print(f"exported mem_id={exp.mem_id} tokenid={exp.tokenid:#x} uba={exp.uba:#x} "
              f"size={size}", flush=True)  # fmt: skip
        try:
            start = time.monotonic()
            # Unmapped before the handle is published: on UB the unmap writes the cacheable
            # stores back (docs/coherence.md, read-mostly table).
            with obmm.ShmDev(exp.mem_id) as shm, shm.mmap(size) as m:
                fill_floats(m.buf, size)
            print(f"filled {size // 4} floats in {time.monotonic() - start:.1f} s", flush=True)
            handle = Handle.from_export(exp, me)
            server = exchange.HandleServer(args.bind, args.port)
            server.publish(args.name, handle)

            def on_term(signum: int, frame: FrameType | None) -> None:
                raise KeyboardInterrupt

            signal.signal(signal.SIGTERM, on_term)

            def ready(addr: tuple[str, int]) -> None:
                print(f"serving handle '{args.name}' on {addr[0]}:{addr[1]} (node "
                      f"{me.node_id}, element i = i * 0.001)", flush=True)  # fmt: skip

            try:
                server.serve_forever(on_ready=ready)
            except KeyboardInterrupt:
                print("stopping", flush=True)
        finally:
            dev.unexport(exp.mem_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
