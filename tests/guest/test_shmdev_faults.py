"""shmdev mmap when the kernel's allocations fail: every failure point of the mmap call, one
after the other (``/proc/thread-self/fail-nth``), gives ENOMEM (or EINVAL) or a whole mapping,
never a kernel report, and leaves nothing behind.

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

pytestmark = pytest.mark.emulator_only

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
                # EINVAL: remap_pfn_range() reports a failed PAT reservation so (mm/memory.c),
                # as the real driver's mmap does; the PMD granule's reservation too
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
