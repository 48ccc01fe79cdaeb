#!/usr/bin/env python3
"""Borrower: import an export as memory of a remote NUMA node and run a program bound to it.

    python3 borrower.py HOST [--port PORT] [--name NAME] [--node NUMA_ID] [-- COMMAND ...]

The borrow model with the obmm package: obmm.exchange.fetch, obmm.decoder, then
OBMM_CMD_IMPORT with OBMM_IMPORT_FLAG_NUMA_REMOTE: the kernel hot-adds the range as memory of a
CPU-less NUMA node, whose id comes back.  COMMAND (default: a small Python program that fills
32 MiB and reports where its pages are) runs under `numactl --membind=<node>`, so the memory it
allocates is the exporter's.  Then OBMM_CMD_UNIMPORT removes the node's memory again.  The
export must be whole memory blocks (128 MiB on x86_64): run the exporter with --size 128.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import obmm
from obmm import decoder, exchange, identity

FILLER = """
import ctypes, mmap
size = 32 << 20
buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, size, 4096):
    buf[off:off + 8] = off.to_bytes(8, "little")
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
maps = [ln.split() for ln in open("/proc/self/numa_maps")]
pages = [f for m in maps if int(m[0], 16) == addr for f in m if f[0] == "N"]
print("filled 32 MiB, pages per node:", " ".join(pages))
"""


def node_mib(node: int) -> int:
    path = Path(f"/sys/devices/system/node/node{node}/meminfo")
    if not path.exists():
        return 0
    kb = next(int(ln.split()[-2]) for ln in path.read_text().splitlines() if "MemTotal:" in ln)
    return kb >> 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("--port", type=int, default=exchange.DEFAULT_PORT)
    parser.add_argument("--name", default="region")
    parser.add_argument("--node", type=int, default=-1, help="remote NUMA node (default: any)")
    parser.add_argument("command", nargs="*", help="program to run bound to the node")
    args = parser.parse_args()

    handle = exchange.fetch(args.host, args.port, args.name)
    print(f"handle '{args.name}': node {handle.node_id} mem_id {handle.mem_id} "
          f"length {handle.length}")  # fmt: skip
    addr = decoder.default_decoder().resolve(handle.node_id, handle.uba, handle.length)
    with obmm.Obmm() as dev:
        try:
            imp = dev.import_(
                addr,
                handle.length,
                flags=obmm.abi.OBMM_IMPORT_FLAG_NUMA_REMOTE,
                scna=identity.local_cna(),
                dcna=handle.scna,
                tokenid=handle.tokenid,
                seid=identity.local_eid(),
                deid=handle.seid,
                numa_id=args.node,
            )
        except obmm.ObmmError as exc:
            print(exc, file=sys.stderr)  # EPERM: not whole memory blocks, or no remote node
            return 1
        print(f"borrowed as mem_id {imp.mem_id} on NUMA node {imp.numa_id} "
              f"({node_mib(imp.numa_id)} MiB)")  # fmt: skip
        try:
            command = args.command or [sys.executable, "-c", FILLER]
            argv = ["numactl", f"--membind={imp.numa_id}", *command]
            print("$", shlex.join(argv), flush=True)
            rc = subprocess.run(argv).returncode
        finally:
            dev.unimport(imp.mem_id)  # EBUSY/EINTR while pages of the node cannot move yet
        print(f"unimported; node {imp.numa_id} has {node_mib(imp.numa_id)} MiB")
    return rc


if __name__ == "__main__":
    sys.exit(main())
