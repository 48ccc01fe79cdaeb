"""What the fuzzer believes the driver holds: regions, open files, mappings, data."""

from __future__ import annotations

from dataclasses import dataclass, field

SZ_4K = 4 << 10
SZ_2M = 2 << 20
U64 = (1 << 64) - 1
MAX_REGION_ID = (1 << 20) - 1


@dataclass
class Region:
    mem_id: int
    kind: str  # "export" (pool), "pid" (EXPORT_PID) or "import"
    size: int
    pa: int  # export: physical address; import: decoder-window address
    tokenid: int = 0
    allow_mmap: bool = True
    mappable: bool = True  # mem_cap != 0 (shmdev open allowed)
    numa: bool = False  # NUMA_REMOTE import (not mappable, no MEMID resource check)
    granu: int = 0  # 0 until the first mmap fixes it (4K or 2M)
    mode: str = ""  # "cc" / "nc" of the live mappings
    ownership: bool = False  # a cacheable mmap happened once (UPDATE_RANGE allowed)
    revoked: bool = False
    dep: int | None = None  # import: the loopback export it depends on
    zeroed: bool = False  # export whose unwritten bytes must read 0
    # EXPORT_PID: physical address of each 2 MiB memseg (not contiguous: "scattered")
    segments: tuple[int, ...] = ()

    @property
    def scattered(self) -> bool:
        segs = self.segments
        return any(b != a + SZ_2M for a, b in zip(segs, segs[1:]))

    def offset_of(self, pa: int) -> int | None:
        """Offset in the region of physical (or, for an import, window) address pa."""
        if self.segments:
            for i, base in enumerate(self.segments):
                if base <= pa < base + SZ_2M:
                    return i * SZ_2M + pa - base
            return None
        return pa - self.pa if self.pa <= pa < self.pa + self.size else None

    def pa_at(self, offset: int) -> int:
        if self.segments:
            return self.segments[offset // SZ_2M] + offset % SZ_2M
        return self.pa + offset

    @property
    def is_export(self) -> bool:
        return self.kind in ("export", "pid")


@dataclass
class File:
    fid: int
    fd: int  # -1 once closed (the file lives on while mapped)
    mem_id: int
    read: bool
    write: bool
    sync: bool


# The access bits of an OBMM mem_state (uapi OBMM_SHM_MEM_*).
ACCESS_MASK, READWRITE, NO_ACCESS = 0xC, 0x8, 0xC


@dataclass
class Map:
    addr: int
    length: int
    mem_id: int
    file: File
    offset: int  # region offset of addr
    writable: bool
    granu: int
    # access bits of each granule of the mapping (UPDATE_RANGE changes them)
    access: list[int] = field(default_factory=list)
    split: bool = False  # more than one VMA (a madvise cut it): mremap's move is EFAULT

    def can_read(self, off: int) -> bool:
        return not self.access or self.access[off // self.granu] != NO_ACCESS

    def can_write(self, off: int) -> bool:
        # a MAP_SHARED mapping of a read-only fd never writes, whatever UPDATE_RANGE gives it
        if not self.file.write:
            return False
        return self.writable if not self.access else self.access[off // self.granu] == READWRITE


@dataclass
class Model:
    regions: dict[int, Region] = field(default_factory=dict)
    files: list[File] = field(default_factory=list)
    maps: list[Map] = field(default_factory=list)
    # bytes written, by offset in this node's memory (8-byte words)
    data: dict[int, bytes] = field(default_factory=dict)
    preimports: set[tuple[int, int]] = field(default_factory=set)
    next_fid: int = 0

    def live_files(self) -> list[File]:
        """Files the kernel still holds: an open fd or a mapping of it."""
        mapped = {m.file.fid for m in self.maps}
        return [f for f in self.files if f.fd >= 0 or f.fid in mapped]

    def gc_files(self) -> None:
        live = {f.fid for f in self.live_files()}
        self.files = [f for f in self.files if f.fid in live]

    def busy(self, mem_id: int) -> bool:
        return any(f.mem_id == mem_id for f in self.live_files())

    def mapped(self, mem_id: int) -> bool:
        return any(m.mem_id == mem_id for m in self.maps)

    def idle(self) -> bool:
        return not self.regions and not self.live_files() and not self.preimports

    def ids(self, *kinds: str) -> list[int]:
        return sorted(i for i, r in self.regions.items() if not kinds or r.kind in kinds)

    def pool_used(self) -> int:
        return sum(r.size for r in self.regions.values() if r.kind == "export")

    def phys_of(self, m: Map, offset: int, own_base: int) -> int | None:
        """Offset in this node's memory of byte ``offset`` of mapping ``m`` (None: not ours)."""
        r = self.regions[m.mem_id]
        if r.is_export:
            return r.pa + m.offset + offset
        if r.dep is None:
            return None
        return r.pa - own_base + m.offset + offset

    def forget(self, start: int, size: int) -> None:
        """Drop what is known of [start, start + size) of this node's memory."""
        for key in [k for k in self.data if start <= k < start + size]:
            del self.data[key]
