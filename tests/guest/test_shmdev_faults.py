"""shmdev mmap, and splits of a mapping, when the kernel's allocations fail: every failure point
of the call, one after the other (``/proc/thread-self/fail-nth``), gives ENOMEM (or EINVAL,
EAGAIN) or what the call makes, never a kernel report, and leaves nothing behind.

Needs a kernel with fault injection (the debug kernel of ``make debug-test``); the production
Debian guest kernel has none, and there these tests skip saying so.
"""

from __future__ import annotations

import ctypes
import errno
import mmap

import pytest
from obmm_fixtures import SZ_2M, exported

import obmm
from obmm.fuzz import faults

pytest_plugins = ["obmm_fixtures"]

pytestmark = [
    pytest.mark.emulator_only,
    pytest.mark.kernel_log_allow(faults.VMALLOC_WARN.pattern, faults.VMALLOC_WARN.reason),
]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]  # fmt: skip
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value
MAP_FIXED = 0x10
# four page tables' worth: the remap has to allocate more than one, so one can fail halfway
LENGTH = 4 * SZ_2M
MAX_POINTS = 400


def fresh_range() -> int:
    """A 2 MiB-aligned address range never touched, so it has no page tables yet: an
    untouched anonymous reservation, over which the shmdev is then mapped MAP_FIXED."""
    raw = _libc.mmap(None, LENGTH + SZ_2M, 0,  # PROT_NONE
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # fmt: skip
    assert raw != MAP_FAILED
    start = (raw + SZ_2M - 1) & ~(SZ_2M - 1)
    if start > raw:
        _libc.munmap(raw, start - raw)
    _libc.munmap(start + LENGTH, raw + SZ_2M - start)
    return start


@pytest.mark.parametrize("pmd", [False, True], ids=["page", "pmd"])
def test_mmap_survives_every_allocation_failure(
    dev: obmm.Obmm, fault_injection: faults.FaultInjection, pmd: bool
) -> None:
    # the flag is bit 63: as a signed off_t
    offset = obmm.OBMM_MMAP_FLAG_HUGETLB_PMD - (1 << 64) if pmd else 0
    failed: list[int] = []
    with exported(dev, LENGTH) as exp, obmm.ShmDev(exp.mem_id) as shm:
        for n in range(1, MAX_POINTS + 1):
            start = fresh_range()
            with fault_injection.nth(n) as reached:
                addr = _libc.mmap(start, LENGTH, mmap.PROT_READ | mmap.PROT_WRITE,
                                  mmap.MAP_SHARED | MAP_FIXED, shm.fd, offset)  # fmt: skip
                err = ctypes.get_errno()
                injected = reached()
            if addr == MAP_FAILED:
                assert injected, f"mmap failed with errno {err} without an injected failure"
                # EINVAL: a failed PAT reservation of the region (the ioremap that holds it,
                # shmdev.c:obmm_memtype_get), as remap_pfn_range() reports it (mm/memory.c)
                assert err in (errno.ENOMEM, errno.EINVAL), (
                    f"failure point {n}: errno {errno.errorcode[err]}"
                )
                failed.append(n)
                continue
            assert addr == start
            # whatever failed inside, a mapping that exists is whole and reaches the region
            view = (ctypes.c_char * LENGTH).from_address(addr)
            for off in range(0, LENGTH, SZ_2M):
                view[off + 7] = bytes([n % 251])
                assert view[off + 7] == bytes([n % 251])
            _libc.munmap(addr, LENGTH)
            if not injected:
                break
        else:
            pytest.fail(f"mmap still reached an injected failure after {MAX_POINTS} points")
    assert failed, "no allocation of the mmap call failed: fail-nth reached nothing"


_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_RANDOM = 1


def poke(addr: int, value: int) -> bool:
    """Write a byte at addr and read it back."""
    ctypes.memmove(addr, bytes([value]), 1)
    return ctypes.string_at(addr, 1) == bytes([value])


@pytest.mark.parametrize("pmd", [False, True], ids=["page", "pmd"])
@pytest.mark.parametrize("split", ["madvise", "munmap"])
def test_a_failed_split_leaves_the_mapping_whole(
    dev: obmm.Obmm, fault_injection: faults.FaultInjection, pmd: bool, split: str
) -> None:
    """A split of the middle granule of a 3-granule mapping (madvise, or munmap of it) when an
    allocation of the split fails: the kernel closes the new VMA it had opened emptied
    (vm_start == vm_end, vm_pgoff 0: mm/mmap.c:__split_vma), and that close released an entry
    range of about 2^52 entries, writing far out of bounds (issue 36, finding 2).  Each failure
    point in turn: the call fails (madvise EAGAIN, munmap ENOMEM) or splits, no kernel report,
    the mapping still reads and writes, and a new writable mapping of the region works
    afterwards."""
    g = SZ_2M if pmd else mmap.PAGESIZE
    offset = obmm.OBMM_MMAP_FLAG_HUGETLB_PMD - (1 << 64) if pmd else 0
    failed: list[int] = []
    # An export is whole 2 MiB granules: the page case maps 3 pages of one.
    with exported(dev, max(3 * g, SZ_2M)) as exp, obmm.ShmDev(exp.mem_id) as shm:
        for n in range(1, MAX_POINTS + 1):
            addr = _libc.mmap(None, 3 * g, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED,
                              shm.fd, offset)  # fmt: skip
            assert addr != MAP_FAILED, f"mmap: errno {ctypes.get_errno()}"
            with fault_injection.nth(n) as reached:
                if split == "madvise":
                    ret = _libc.madvise(addr + g, g, MADV_RANDOM)
                else:
                    ret = _libc.munmap(addr + g, g)
                err = ctypes.get_errno()
                injected = reached()
            if ret:
                assert injected, f"{split} failed with errno {err} without an injected failure"
                assert err in (errno.EAGAIN, errno.ENOMEM), f"point {n}: {errno.errorcode[err]}"
                failed.append(n)
            left = (0, g, 2 * g) if ret or split == "madvise" else (0, 2 * g)
            for off in left:
                assert poke(addr + off + 7, n % 251), f"point {n}: granule at {off:#x}"
            _libc.munmap(addr, 3 * g)
            if not injected:
                break
        else:
            pytest.fail(f"{split} still reached an injected failure after {MAX_POINTS} points")
        with shm.mmap(3 * g, pmd=pmd) as m:
            m.write(0, b"after")
            assert m.read(0, 5) == b"after"
    assert failed, f"no allocation of the {split} call failed: fail-nth reached nothing"


_libc.mremap.restype = ctypes.c_void_p
_libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                         ctypes.c_void_p]  # fmt: skip
MREMAP_MAYMOVE_FIXED = 3


@pytest.mark.parametrize("pmd", [False, True], ids=["page", "pmd"])
def test_a_failed_move_leaves_the_mapping_its_entries(
    dev: obmm.Obmm, fault_injection: faults.FaultInjection, pmd: bool
) -> None:
    """mremap() of a touched mapping to a range without page tables, each allocation of it
    failing in turn.  The kernel copies the VMA (.open), and when copy_vma()'s link or
    move_page_tables() runs out of memory it unmaps the copy (.close) without asking .mremap:
    that close released the entries the original still maps, whose own close released them
    again, and the region's reader and writer counts wrapped (issue 36, finding 9).  Each
    point: the move fails (ENOMEM, or EOPNOTSUPP when only .mremap refused), the mapping reads
    and writes, and afterwards a new writable mapping of the region works."""
    g = SZ_2M if pmd else mmap.PAGESIZE
    offset = obmm.OBMM_MMAP_FLAG_HUGETLB_PMD - (1 << 64) if pmd else 0
    failed: list[int] = []
    with exported(dev, LENGTH) as exp, obmm.ShmDev(exp.mem_id) as shm:
        for n in range(1, MAX_POINTS + 1):
            addr = _libc.mmap(None, LENGTH, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED,
                              shm.fd, offset)  # fmt: skip
            assert addr != MAP_FAILED, f"mmap: errno {ctypes.get_errno()}"
            for off in range(0, LENGTH, g if pmd else SZ_2M):
                assert poke(addr + off, 1)  # page tables to move
            spare = fresh_range()
            with fault_injection.nth(n) as reached:
                ret = _libc.mremap(addr, LENGTH, LENGTH, MREMAP_MAYMOVE_FIXED, spare)
                err = ctypes.get_errno()
                injected = reached()
            _libc.munmap(spare, LENGTH)
            assert ret == MAP_FAILED, f"point {n}: the move was made"
            assert err in (errno.ENOMEM, errno.EOPNOTSUPP), f"point {n}: {errno.errorcode[err]}"
            if err == errno.ENOMEM:
                failed.append(n)
            for off in range(0, LENGTH, g if pmd else SZ_2M):
                assert poke(addr + off + 7, n % 251), f"point {n}: granule at {off:#x}"
            _libc.munmap(addr, LENGTH)
            if not injected:
                break
        else:
            pytest.fail(f"mremap still reached an injected failure after {MAX_POINTS} points")
        with shm.mmap(LENGTH, pmd=pmd) as m:
            m.write(0, b"after")
            assert m.read(0, 5) == b"after"
    assert failed, "no allocation of the move failed: fail-nth reached nothing"
