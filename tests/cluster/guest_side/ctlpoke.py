"""A hostile (or buggy) node, for the control-region trust tests: writes into the shared region.

The control region is ivshmem BAR 2 at 00:0f.0; root maps it read-write through sysfs
``resource2`` like any peer's kernel does (layout: kmod/obmm_emu/obmm_emu_ctl.h).  Used from
snippets (``import ctlpoke``) or as ``python3 -m ctlpoke hostile KIND NODE SECONDS DONE`` for a
corruption that must persist while the owner keeps writing (it creates DONE when it stops).
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time

RESOURCE = "/sys/bus/pci/devices/0000:00:0f.0/resource2"
SIZE = 2 << 20
NODE_TABLE, NODE_STRIDE = 0x1000, 0x100
RECORDS, RECORD_SIZE, PER_NODE = 0x10000, 0x80, 1024
# offsets in a node entry
N_SEQ, N_STATE, N_NODE_ID, N_BOOT_ID, N_HB_MS = 0, 4, 8, 40, 72
# offsets in an export record
R_SEQ, R_STATE, R_GEN, R_BOOT, R_MEM_ID, R_UBA, R_PA, R_SIZE, R_TOKEN, R_FLAGS = (
    0, 4, 8, 16, 24, 32, 40, 48, 56, 60,
)  # fmt: skip


class Ctl:
    def __init__(self) -> None:
        fd = os.open(RESOURCE, os.O_RDWR | os.O_SYNC)
        try:
            self.buf = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)

    @staticmethod
    def node(n: int) -> int:
        return NODE_TABLE + n * NODE_STRIDE

    @staticmethod
    def record(n: int, slot: int) -> int:
        return RECORDS + (n * PER_NODE + slot) * RECORD_SIZE

    def u32(self, off: int) -> int:
        return int(struct.unpack_from("<I", self.buf, off)[0])

    def u64(self, off: int) -> int:
        return int(struct.unpack_from("<Q", self.buf, off)[0])

    def set32(self, off: int, value: int) -> None:
        struct.pack_into("<I", self.buf, off, value & 0xFFFFFFFF)

    def set64(self, off: int, value: int) -> None:
        struct.pack_into("<Q", self.buf, off, value & ((1 << 64) - 1))

    def save(self, off: int, size: int) -> bytes:
        return bytes(self.buf[off : off + size])

    def restore(self, off: int, data: bytes) -> None:
        self.buf[off : off + len(data)] = data

    def live_slot(self, n: int, mem_id: int) -> int:
        """The record slot of node n's live export mem_id."""
        for slot in range(PER_NODE):
            off = self.record(n, slot)
            if self.u32(off + R_STATE) == 1 and self.u64(off + R_MEM_ID) == mem_id:
                return slot
        raise LookupError(f"node {n} has no live record of export {mem_id}")


def hostile(kind: str, n: int, seconds: float, done: str) -> int:
    """Keep node n's entry corrupted for `seconds` while its kernel rewrites it every beat."""
    ctl = Ctl()
    off = ctl.node(n)
    end = time.monotonic() + seconds
    print("corrupting", flush=True)
    while time.monotonic() < end:
        if kind == "odd":
            ctl.set32(off + N_SEQ, ctl.u32(off + N_SEQ) | 1)
        elif kind == "state":
            ctl.set32(off + N_STATE, 7)
        elif kind == "node_id":
            ctl.set32(off + N_NODE_ID, n + 3)
        elif kind == "boot0":
            ctl.set64(off + N_BOOT_ID, 0)
        else:
            raise SystemExit(f"unknown corruption {kind}")
        # no sleep: the owner's rewrite (every beat) must be overwritten before a peer reads
    with open(done, "w") as fh:
        fh.write("done\n")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "hostile":
        return hostile(argv[1], int(argv[2]), float(argv[3]), argv[4])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
