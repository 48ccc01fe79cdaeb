#!/usr/bin/env python3
"""Client: fetch a handle, resolve the decoder address, import, verify, time reads.

    python3 client.py HOST [--port PORT] [--name NAME] [--dim D] [--iters N]

The seed's cross-node flow (scheme 7 client.c) with the obmm package: obmm.exchange.fetch, then
obmm.decoder (the emulator's windows, or $OBMM_DECODER=cmd:.../file:... on hardware) turns the
handle's (node, UBA) into this node's decoder address, OBMM_CMD_IMPORT with the handle's tokenid,
mmap, check float element i == i * 0.001, and time random row reads.
"""

from __future__ import annotations

import argparse
import random
import struct
import sys
import time

import obmm
from obmm import decoder, exchange, identity

SAMPLE_STRIDE = 1021
CHECK_ROW = 42
WARMUP = 10


def expected(i: int) -> bytes:
    return struct.pack("<f", i * 0.001)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("--port", type=int, default=exchange.DEFAULT_PORT)
    parser.add_argument("--name", default="region")
    parser.add_argument("--dim", type=int, default=341, help="floats per row (341: 1364 B)")
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()

    handle = exchange.fetch(args.host, args.port, args.name)
    print(f"handle '{args.name}': node {handle.node_id} mem_id {handle.mem_id} "
          f"length {handle.length} uba {handle.uba:#x} tokenid {handle.tokenid:#x}")  # fmt: skip
    addr = decoder.default_decoder().resolve(handle.node_id, handle.uba, handle.length)
    print(f"decoder address {addr:#x}")
    with obmm.Obmm() as dev:
        imp = dev.import_(
            addr,
            handle.length,
            scna=identity.local_cna(),
            dcna=handle.scna,
            tokenid=handle.tokenid,
            deid=handle.seid,
        )
        print(f"imported as mem_id {imp.mem_id}")
        try:
            with obmm.ShmDev(imp.mem_id) as shm, shm.mmap(handle.length) as m:
                n = handle.length // 4
                rows = handle.length // (4 * args.dim)
                samples = [*range(0, n, SAMPLE_STRIDE), n - 1]
                if rows > CHECK_ROW:
                    samples += [CHECK_ROW * args.dim + k for k in range(4)]
                for i in samples:
                    got = m.read(4 * i, 4)
                    if got != expected(i):
                        (value,) = struct.unpack("<f", got)
                        print(f"element {i} is {value}, expected {i * 0.001}", file=sys.stderr)
                        return 1
                print(f"verified {len(samples)} sampled floats of {n}: OK")

                row_bytes = 4 * args.dim
                rng = random.Random(42)
                total = 0.0
                for k in range(WARMUP + args.iters):
                    off = rng.randrange(rows) * row_bytes
                    t0 = time.perf_counter_ns()
                    row = m.read(off, row_bytes)
                    if k >= WARMUP:
                        total += time.perf_counter_ns() - t0
                    assert len(row) == row_bytes
                row_ns = total / args.iters
                print(f"random row read ({row_bytes} B, {rows} rows): avg {row_ns:.0f} ns, "
                      f"{row_bytes / row_ns * 1e3:.1f} MB/s (Python, includes interpreter "
                      "overhead)")  # fmt: skip
        finally:
            dev.unimport(imp.mem_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
