"""The ACPI SRAT and SLIT each node boots with: its spare, remote NUMA nodes.

Borrowing (NUMA_REMOTE imports) hot-adds a window range as memory of a CPU-less, memory-less
NUMA node.  Linux can only hot-add memory to a node that was *possible* at boot (its pgdat is
allocated in `free_area_init()` for every possible node), and on x86 the possible nodes are the
proximity domains the SRAT names.  QEMU 7.2 names at most one node without memory (its single
hotpluggable entry for `maxmem` goes to the last `-numa` node), so the testbed writes its own
tables and passes them with `-acpitable`, with no `-numa` option (QEMU then emits neither):

* SRAT: every CPU (APIC id = CPU index, as QEMU numbers a `-smp N` guest) and all of the
  node's RAM in proximity domain 0; one enabled, hotpluggable, zero-length memory entry per
  remote domain 1..R.  Linux marks a domain possible for any enabled memory entry and ignores
  the zero length, so the remote nodes exist but nothing of the physical map changes (a real
  hotplug range above 4 GiB would also turn on SWIOTLB's 64 MiB bounce buffer).
* SLIT: 10 on the diagonal, 100 between a local and a remote node and 255 between two
  remote nodes: the boot distances of openEuler's `numa_remote=` (drivers/base/numa_remote.c,
  REMOTE_TO_LOCAL_DISTANCE / REMOTE_TO_REMOTE_DISTANCE).

This is what the real kernel's `numa_remote=` does on a UB host: reserve node ids that have
neither CPUs nor memory until OBMM hot-adds borrowed memory.  Pure: bytes in, bytes out.
"""

from __future__ import annotations

import struct
from pathlib import Path

# Remote (spare) NUMA nodes per guest: one per node of the cluster (the own node included,
# for loopback borrowing), at least this many so a single node can hold several borrows.
MIN_REMOTE_NODES = 4
LOCAL_DISTANCE = 10
REMOTE_TO_LOCAL_DISTANCE = 100
REMOTE_TO_REMOTE_DISTANCE = 255

_HEADER = struct.Struct("<4sIBB6s8sI4sI")
_OEM_ID = b"OBMMTB"
_OEM_TABLE_ID = b"OBMMNUMA"
_CREATOR = b"OBMM"
SRAT_REVISION = 3
SLIT_REVISION = 1
_SRAT_CPU = struct.Struct("<BBBBIB3sI")  # Processor Local APIC/SAPIC Affinity, 16 bytes
_SRAT_MEM = struct.Struct("<BBIHIIIIIIQ")  # Memory Affinity, 40 bytes
_SRAT_CPU_ENABLED = 1
_SRAT_MEM_ENABLED = 1
_SRAT_MEM_HOTPLUGGABLE = 2
# Bumped when the tables change: the file name carries it, and so the snapshot key.
TABLES_VERSION = 1


def remote_nodes(cluster_nodes: int) -> int:
    """How many spare remote NUMA nodes a guest of a `cluster_nodes`-node cluster boots with."""
    return max(MIN_REMOTE_NODES, cluster_nodes)


def _table(signature: bytes, revision: int, body: bytes) -> bytes:
    length = _HEADER.size + len(body)
    head = _HEADER.pack(signature, length, revision, 0, _OEM_ID, _OEM_TABLE_ID, 1, _CREATOR, 1)
    raw = bytearray(head + body)
    raw[9] = (-sum(raw)) & 0xFF  # checksum: all bytes sum to 0 mod 256
    return bytes(raw)


def srat(*, cpus: int, memory_bytes: int, remote: int) -> bytes:
    """SRAT: `cpus` CPUs and RAM [0, memory_bytes) in domain 0, empty domains 1..remote."""
    body = bytearray(struct.pack("<IQ", 1, 0))  # reserved (1 for compatibility), reserved
    for apic_id in range(cpus):
        body += _SRAT_CPU.pack(0, _SRAT_CPU.size, 0, apic_id, _SRAT_CPU_ENABLED, 0, b"\0\0\0", 0)

    def mem(domain: int, base: int, length: int, flags: int) -> bytes:
        return _SRAT_MEM.pack(
            1,
            _SRAT_MEM.size,
            domain,
            0,
            base & 0xFFFFFFFF,
            base >> 32,
            length & 0xFFFFFFFF,
            length >> 32,
            0,
            flags,
            0,
        )

    body += mem(0, 0, memory_bytes, _SRAT_MEM_ENABLED)
    for domain in range(1, remote + 1):
        body += mem(domain, 0, 0, _SRAT_MEM_ENABLED | _SRAT_MEM_HOTPLUGGABLE)
    return _table(b"SRAT", SRAT_REVISION, bytes(body))


def slit(*, remote: int) -> bytes:
    """SLIT over domain 0 and the remote domains 1..remote."""
    n = remote + 1
    matrix = bytearray()
    for i in range(n):
        for j in range(n):
            if i == j:
                d = LOCAL_DISTANCE
            elif i == 0 or j == 0:
                d = REMOTE_TO_LOCAL_DISTANCE
            else:
                d = REMOTE_TO_REMOTE_DISTANCE
            matrix.append(d)
    return _table(b"SLIT", SLIT_REVISION, struct.pack("<Q", n) + bytes(matrix))


def table_paths(rundir: Path) -> tuple[Path, Path]:
    """Where a cluster's SRAT and SLIT files live (QEMU reads them at start)."""
    return (
        rundir / f"acpi-srat-v{TABLES_VERSION}.bin",
        rundir / f"acpi-slit-v{TABLES_VERSION}.bin",
    )


def write_tables(rundir: Path, *, cpus: int, memory_bytes: int, cluster_nodes: int) -> None:
    """Write the SRAT and SLIT of a node of this shape into `rundir` (idempotent)."""
    remote = remote_nodes(cluster_nodes)
    srat_path, slit_path = table_paths(rundir)
    srat_path.write_bytes(srat(cpus=cpus, memory_bytes=memory_bytes, remote=remote))
    slit_path.write_bytes(slit(remote=remote))
