"""High-level OBMM API: the `/dev/obmm` device and the `/dev/obmm_shmdev<id>` regions.

    with Obmm() as dev:
        exp = dev.export(4 << 20)
        with ShmDev(exp.mem_id) as shm, shm.mmap(4 << 20) as m:
            m.write(0, b"hello")
        dev.unexport(exp.mem_id)

Every failure raises `obmm.errors.ObmmError` naming the operation and errno.
"""

from __future__ import annotations

import mmap as mmap_mod
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from obmm import abi
from obmm.abi import ffi
from obmm.errors import ObmmError
from obmm.identity import EID_SIZE

DEFAULT_DEVICE = "/dev/obmm"
SHMDEV_DIR = "/dev"
SHMDEV_SYSFS = "/sys/devices/obmm"

_Self = TypeVar("_Self", bound="_Closable")

#: mmap(2)'s PROT_NONE (Python's mmap module has no name for it): a mapping that an
#: OBMM_SHMDEV_UPDATE_RANGE makes accessible later, as libobmm's obmm_set_ownership does.
PROT_NONE = 0
PROT_READ = mmap_mod.PROT_READ
PROT_WRITE = mmap_mod.PROT_WRITE
PROT_EXEC = mmap_mod.PROT_EXEC


@dataclass(frozen=True)
class Export:
    """A region this node exported: what an importer needs to know of it."""

    mem_id: int
    tokenid: int
    uba: int
    length: int  # bytes, as Handle.length and Import.length


@dataclass(frozen=True)
class Import:
    """A region this node imported from a decoder-window address."""

    mem_id: int
    numa_id: int
    addr: int
    length: int


def _eid(value: bytes, name: str) -> bytes:
    if len(value) > EID_SIZE:
        raise ValueError(f"{name} is {len(value)} bytes; an EID has at most {EID_SIZE}")
    return value.ljust(EID_SIZE, b"\0")


class _Closable:
    """Context-manager protocol for objects with an idempotent `close()`."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Blobs:
    """Keeps the priv / vendor_info buffers alive while an ioctl reads them."""

    def __init__(self) -> None:
        self._keep: list[Any] = []

    def pointer(self, data: bytes) -> Any:
        if not data:
            return ffi.NULL
        buf = ffi.new("unsigned char[]", data)
        self._keep.append(buf)
        return buf


class Obmm(_Closable):
    """`/dev/obmm`, opened read-write; use as a context manager."""

    def __init__(self, path: str = DEFAULT_DEVICE) -> None:
        self.path = path
        try:
            self.fd: int = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise ObmmError("OPEN", exc.errno or 0, path) from exc

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def ioctl(self, name: str, arg: abi.CData) -> int:
        """A raw ioctl of the header on this device (for crafted inputs)."""
        return abi.ioctl(self.fd, name, arg)

    # ---- export side ----

    def export(
        self,
        size: int | Sequence[int],
        *,
        flags: int = abi.OBMM_EXPORT_FLAG_ALLOW_MMAP,
        pxm_numa: int = 0,
        deid: bytes = b"",
        seid: bytes = b"",
        priv: bytes = b"",
        vendor_info: bytes = b"",
        length: int | None = None,
    ) -> Export:
        """Export pool memory: `size` bytes from node 0, or `size[i]` bytes from node i.

        `length` overrides the count of size[] entries sent (the driver reads it).
        """
        sizes = [size] if isinstance(size, int) else list(size)
        if len(sizes) > abi.OBMM_MAX_LOCAL_NUMA_NODES:
            raise ValueError(
                f"{len(sizes)} sizes given; the struct holds "
                f"{abi.OBMM_MAX_LOCAL_NUMA_NODES} NUMA nodes"
            )
        blobs = _Blobs()
        cmd = abi.new("struct obmm_cmd_export")
        for i, node_size in enumerate(sizes):
            cmd.size[i] = node_size
        cmd.length = len(sizes) if length is None else length
        cmd.flags = flags
        cmd.pxm_numa = pxm_numa
        cmd.deid = _eid(deid, "deid")
        cmd.seid = _eid(seid, "seid")
        cmd.priv_len = len(priv)
        cmd.priv = blobs.pointer(priv)
        cmd.vendor_len = len(vendor_info)
        cmd.vendor_info = blobs.pointer(vendor_info)
        self.ioctl("OBMM_CMD_EXPORT", cmd)
        return Export(
            mem_id=int(cmd.mem_id), tokenid=int(cmd.tokenid), uba=int(cmd.uba), length=sum(sizes)
        )

    def export_pid(
        self,
        va: int,
        length: int,
        *,
        pid: int = 0,
        flags: int = 0,
        pxm_numa: int = 0,
        deid: bytes = b"",
        seid: bytes = b"",
        priv: bytes = b"",
        vendor_info: bytes = b"",
    ) -> Export:
        """Pin and export `length` bytes at `va` of process `pid` (0: this process)."""
        blobs = _Blobs()
        cmd = abi.new("struct obmm_cmd_export_pid")
        cmd.va = ffi.cast("void *", va)
        cmd.length = length
        cmd.flags = flags
        cmd.pid = pid
        cmd.pxm_numa = pxm_numa
        cmd.deid = _eid(deid, "deid")
        cmd.seid = _eid(seid, "seid")
        cmd.priv_len = len(priv)
        cmd.priv = blobs.pointer(priv)
        cmd.vendor_len = len(vendor_info)
        cmd.vendor_info = blobs.pointer(vendor_info)
        self.ioctl("OBMM_CMD_EXPORT_PID", cmd)
        return Export(
            mem_id=int(cmd.mem_id), tokenid=int(cmd.tokenid), uba=int(cmd.uba), length=length
        )

    def unexport(self, mem_id: int, flags: int = 0) -> None:
        cmd = abi.new("struct obmm_cmd_unexport")
        cmd.mem_id = mem_id
        cmd.flags = flags
        self.ioctl("OBMM_CMD_UNEXPORT", cmd)

    # ---- import side ----

    def import_(
        self,
        addr: int,
        length: int,
        *,
        scna: int,
        flags: int = abi.OBMM_IMPORT_FLAG_ALLOW_MMAP,
        dcna: int = 0,
        tokenid: int = 0,
        numa_id: int = -1,
        base_dist: int = 0,
        seid: bytes = b"",
        deid: bytes = b"",
        priv: bytes = b"",
    ) -> Import:
        """Import `length` bytes at decoder-window address `addr` through controller `scna`."""
        blobs = _Blobs()
        cmd = abi.new("struct obmm_cmd_import")
        cmd.flags = flags
        cmd.addr = addr
        cmd.length = length
        cmd.tokenid = tokenid
        cmd.scna = scna
        cmd.dcna = dcna
        cmd.numa_id = numa_id
        cmd.base_dist = base_dist
        cmd.seid = _eid(seid, "seid")
        cmd.deid = _eid(deid, "deid")
        cmd.priv_len = len(priv)
        cmd.priv = blobs.pointer(priv)
        self.ioctl("OBMM_CMD_IMPORT", cmd)
        return Import(mem_id=int(cmd.mem_id), numa_id=int(cmd.numa_id), addr=addr, length=length)

    def unimport(self, mem_id: int, flags: int = 0) -> None:
        cmd = abi.new("struct obmm_cmd_unimport")
        cmd.mem_id = mem_id
        cmd.flags = flags
        self.ioctl("OBMM_CMD_UNIMPORT", cmd)

    # ---- address queries ----

    def query_memid_by_pa(self, pa: int) -> tuple[int, int]:
        """(mem_id, offset) of the region holding physical address `pa`."""
        cmd = abi.new("struct obmm_cmd_addr_query")
        cmd.key_type = abi.OBMM_QUERY_BY_PA
        cmd.pa = pa
        self.ioctl("OBMM_CMD_ADDR_QUERY", cmd)
        return int(cmd.mem_id), int(cmd.offset)

    def query_pa_by_memid(self, mem_id: int, offset: int = 0) -> int:
        """Physical address of byte `offset` of region `mem_id`."""
        cmd = abi.new("struct obmm_cmd_addr_query")
        cmd.key_type = abi.OBMM_QUERY_BY_ID_OFFSET
        cmd.mem_id = mem_id
        cmd.offset = offset
        self.ioctl("OBMM_CMD_ADDR_QUERY", cmd)
        return int(cmd.pa)

    # ---- preimport ----

    def _preimport_cmd(
        self,
        pa: int,
        length: int,
        *,
        flags: int,
        scna: int,
        dcna: int,
        numa_id: int,
        base_dist: int,
        seid: bytes,
        deid: bytes,
        priv: bytes,
        blobs: _Blobs,
    ) -> abi.CData:
        cmd = abi.new("struct obmm_cmd_preimport")
        cmd.pa = pa
        cmd.length = length
        cmd.flags = flags
        cmd.scna = scna
        cmd.dcna = dcna
        cmd.numa_id = numa_id
        cmd.base_dist = base_dist
        cmd.seid = _eid(seid, "seid")
        cmd.deid = _eid(deid, "deid")
        cmd.priv_len = len(priv)
        cmd.priv = blobs.pointer(priv)
        return cmd

    def declare_preimport(
        self,
        pa: int,
        length: int,
        *,
        scna: int,
        flags: int = 0,
        dcna: int = 0,
        numa_id: int = -1,
        base_dist: int = 0,
        seid: bytes = b"",
        deid: bytes = b"",
        priv: bytes = b"",
    ) -> int:
        """Declare a preimport range; returns the NUMA node assigned to it."""
        blobs = _Blobs()
        cmd = self._preimport_cmd(
            pa, length, flags=flags, scna=scna, dcna=dcna, numa_id=numa_id,
            base_dist=base_dist, seid=seid, deid=deid, priv=priv, blobs=blobs,
        )  # fmt: skip
        self.ioctl("OBMM_CMD_DECLARE_PREIMPORT", cmd)
        return int(cmd.numa_id)

    def undeclare_preimport(
        self,
        pa: int,
        length: int,
        *,
        flags: int = 0,
        scna: int = 0,
        dcna: int = 0,
        numa_id: int = -1,
        base_dist: int = 0,
        seid: bytes = b"",
        deid: bytes = b"",
    ) -> None:
        """Withdraw a preimport range (the driver matches on pa and length)."""
        blobs = _Blobs()
        cmd = self._preimport_cmd(
            pa, length, flags=flags, scna=scna, dcna=dcna, numa_id=numa_id,
            base_dist=base_dist, seid=seid, deid=deid, priv=b"", blobs=blobs,
        )  # fmt: skip
        self.ioctl("OBMM_CMD_UNDECLARE_PREIMPORT", cmd)


class Mapping(_Closable):
    """One mmap of a shmdev; `buf` is a writable memoryview of it until `close()`."""

    def __init__(self, addr: int, length: int) -> None:
        self.addr = addr
        self.length = length
        self._buf: memoryview | None = memoryview(
            ffi.buffer(ffi.cast("char *", addr), length)
        ).cast("B")

    @property
    def closed(self) -> bool:
        return self._buf is None

    @property
    def buf(self) -> memoryview:
        if self._buf is None:
            raise ValueError("mapping is closed")
        return self._buf

    def _check(self, offset: int, size: int) -> None:
        if offset < 0 or size < 0 or offset + size > self.length:
            raise IndexError(f"[{offset}, {offset + size}) is outside the {self.length}-byte map")

    def read(self, offset: int, size: int) -> bytes:
        self._check(offset, size)
        return bytes(self.buf[offset : offset + size])

    def write(self, offset: int, data: bytes) -> None:
        self._check(offset, len(data))
        self.buf[offset : offset + len(data)] = data

    def close(self) -> None:
        if self._buf is None:
            return
        self._buf.release()
        self._buf = None
        if abi.libc().munmap(ffi.cast("void *", self.addr), self.length) != 0:
            raise ObmmError("MUNMAP", ffi.errno)


def _as_off_t(offset: int) -> int:
    """The mmap offset as the signed 64-bit off_t C passes (bit 63 is the PMD flag)."""
    return offset - (1 << 64) if offset >= 1 << 63 else offset


class ShmDev(_Closable):
    """`/dev/obmm_shmdev<mem_id>`: cacheable, or write-combine with `sync=True` (O_SYNC)."""

    def __init__(
        self, mem_id: int, *, sync: bool = False, writable: bool = True, dev_dir: str = SHMDEV_DIR
    ) -> None:
        self.mem_id = mem_id
        self.path = str(Path(dev_dir) / f"obmm_shmdev{mem_id}")
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        if sync:
            flags |= os.O_SYNC
        try:
            self.fd: int = os.open(self.path, flags)
        except OSError as exc:
            raise ObmmError("OPEN", exc.errno or 0, self.path) from exc

    def size(self) -> int:
        """Region size from sysfs (`/sys/devices/obmm/obmm_shmdev<id>/size`, root only)."""
        text = (Path(SHMDEV_SYSFS) / f"obmm_shmdev{self.mem_id}" / "size").read_text()
        return int(text.strip(), 0)

    def mmap(
        self,
        length: int | None = None,
        offset: int = 0,
        *,
        pmd: bool = False,
        prot: int = PROT_READ | PROT_WRITE,
        shared: bool = True,
    ) -> Mapping:
        """Map `length` bytes (default: the whole region) at `offset`; `pmd` sets the PMD flag."""
        if length is None:
            length = self.size() - offset
        raw_offset = offset | abi.OBMM_MMAP_FLAG_HUGETLB_PMD if pmd else offset
        map_flags = mmap_mod.MAP_SHARED if shared else mmap_mod.MAP_PRIVATE
        ptr = abi.libc().mmap(ffi.NULL, length, prot, map_flags, self.fd, _as_off_t(raw_offset))
        addr = int(ffi.cast("uintptr_t", ptr))
        if addr == (1 << (8 * ffi.sizeof("void *"))) - 1:  # MAP_FAILED
            raise ObmmError("MMAP", ffi.errno, f"{self.path} length={length:#x} offset={offset:#x}")
        return Mapping(addr, length)

    def update_range(self, start: int, end: int, mem_state: int, cache_ops: int) -> None:
        """Ownership switch of the mapped VA range [start, end) (OBMM_SHMDEV_UPDATE_RANGE)."""
        cmd = abi.new("struct obmm_cmd_update_range")
        cmd.start = start
        cmd.end = end
        cmd.mem_state = mem_state
        cmd.cache_ops = cache_ops
        abi.ioctl(self.fd, "OBMM_SHMDEV_UPDATE_RANGE", cmd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
