"""The `strict` coherence model (docs/coherence.md) on one node: the emulator reloaded with
coherence=strict for this file, and as it was afterwards.

A cacheable view of an export and an `O_SYNC` view of a loopback import of it (one region
has either kind of mapping, not both at once): the `O_SYNC` one loads and stores memory, the
cacheable one the node's cache of the export, so what that cache holds back shows.
Covers the PMD granule (a 2 MiB entry's maintenance) and an UPDATE_RANGE that fails with
EOVERFLOW after some of its VMAs were counted (it must maintain nothing).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from obmm_fixtures import (
    MODULE,
    MODULE_KO,
    MODULE_PARAMS,
    SZ_2M,
    SZ_4K,
    Fabric,
    exported,
    imported,
    module_loaded,
    module_reload_args,
)

import obmm
from obmm import abi

pytest_plugins = ["obmm_fixtures"]

if TYPE_CHECKING:
    from conftest import KernelLog  # the guest suite's conftest, beside this file

pytestmark = pytest.mark.emulator_only  # the emulator's coherence model: FIDELITY.md

NORMAL = abi.OBMM_SHM_MEM_NORMAL
READ = NORMAL | abi.OBMM_SHM_MEM_READONLY
WRITE = NORMAL | abi.OBMM_SHM_MEM_READWRITE
NONE = NORMAL | abi.OBMM_SHM_MEM_NO_ACCESS
INFER = abi.OBMM_SHM_CACHE_INFER
INVAL = abi.OBMM_SHM_CACHE_INVAL
REPORTS = Path("/sys/kernel/debug/obmm_coherence/reports")
U16_MAX = 0xFFFF
MAP_SHARED = 1
MAP_FAILED = (1 << 64) - 1
MADV_RANDOM = 1
#: The stale-line scan runs every coherence_scan_ms (20); a loaded TCG guest may lag.
SCAN_WAIT_S = 10.0


def _coherence_params() -> list[str]:
    return [
        f"{p.name}={p.read_text().strip()}"
        for p in sorted(MODULE_PARAMS.glob("coherence*"))
        if p.name != "coherence_seed"
    ]


@pytest.fixture(scope="module")
def strict() -> Iterator[None]:
    """The emulator loaded with coherence=strict (no eviction); reloaded as before at the end."""
    if (
        not MODULE_KO.is_file()
        or not module_loaded()
        or not (MODULE_PARAMS / "coherence").is_file()
    ):
        pytest.skip(f"{MODULE_KO} (the emulator) not loaded from the testbed's payload")
    args, before = module_reload_args(), _coherence_params()
    subprocess.run(["rmmod", MODULE], check=True)
    subprocess.run(
        ["insmod", str(MODULE_KO), *args, "coherence=strict", "coherence_evict=0"], check=True
    )
    try:
        yield
    finally:
        if module_loaded():
            subprocess.run(["rmmod", MODULE], check=True)
        subprocess.run(["insmod", str(MODULE_KO), *args, *before], check=True)


def _read_until_reported(m: obmm.Mapping, offset: int, want: bytes) -> str:
    """Read `want` at `offset` of a cacheable mapping until a touch after the scan found the
    line stale has reported it; the report file then."""
    deadline = time.monotonic() + SCAN_WAIT_S
    while True:
        assert m.read(offset, len(want)) == want
        text = REPORTS.read_text()
        if text or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def test_pmd_granule_cacheable_view_is_stale_until_invalidated(
    strict: None, dev: obmm.Obmm, fabric: Fabric, kernel_log: KernelLog
) -> None:
    """A 2 MiB PMD cacheable mapping keeps what it cached while NC stores change memory (a
    stale-read report names the line); UPDATE_RANGE with cache_ops INVAL over the 2 MiB entry
    makes them visible.  A cacheable store through it reaches an `O_SYNC` reader only at the
    write-back of UPDATE_RANGE off READWRITE (INFER: WB_ONLY)."""
    old, new, mine = b"generation 1".ljust(16), b"generation 2".ljust(16), b"cached store".ljust(16)
    far = SZ_2M - SZ_4K  # the last page of the entry: the PMD's maintenance covers it too
    with contextlib.ExitStack() as stack:
        exp = stack.enter_context(exported(dev, SZ_2M))
        shm = stack.enter_context(obmm.ShmDev(exp.mem_id))
        imp = stack.enter_context(imported(dev, fabric, exp))
        nc = stack.enter_context(obmm.ShmDev(imp.mem_id, sync=True)).mmap(SZ_2M)
        stack.enter_context(nc)
        nc.write(0, old)
        nc.write(far, old)
        with shm.mmap(SZ_2M, pmd=True) as m:
            assert (m.read(0, 16), m.read(far, 16)) == (old, old)  # cached now
            nc.write(0, new)
            nc.write(far, new)
            report = _read_until_reported(m, 0, old)
            assert f"mem_id={exp.mem_id} offset=0x0 kind=stale read" in report, report
            assert (m.read(0, 16), m.read(far, 16)) == (old, old)
            log = kernel_log.take()
            assert "stale read: node " in log and f"mem_id {exp.mem_id} offset 0x" in log
            shm.update_range(m.addr, m.addr + SZ_2M, WRITE, INVAL)
            assert (m.read(0, 16), m.read(far, 16)) == (new, new)

            m.write(far, mine)
            assert nc.read(far, 16) == new
            shm.update_range(m.addr, m.addr + SZ_2M, READ, INFER)
            assert nc.read(far, 16) == mine
    assert "coherence" not in kernel_log.take()


def test_an_update_range_that_overflows_maintains_nothing(
    strict: None, dev: obmm.Obmm, fabric: Fabric, many_maps: None, kernel_log: KernelLog
) -> None:
    """UPDATE_RANGE to READ over two VMAs: the first holds page 0 READWRITE and dirty (its
    counts infer WB_ONLY), the second page 1 with U16_MAX readers elsewhere, one more is
    EOVERFLOW.  The call fails and changes nothing: page 0 stays unwritten in memory until
    the mapping goes.  (The emulator wrote it back, then rolled the counts back.)"""
    libc, ffi = abi.libc(), abi.ffi
    mark = b"dirty, not written back".ljust(32)
    addrs: list[int] = []

    def read_map() -> None:
        ptr = libc.mmap(ffi.NULL, SZ_4K, obmm.PROT_READ, MAP_SHARED, shm.fd, SZ_4K)
        addr = int(ffi.cast("uintptr_t", ptr))
        assert addr != MAP_FAILED, f"mmap {len(addrs)} failed: errno {ffi.errno}"
        addrs.append(addr)

    def memory() -> bytes:
        with obmm.ShmDev(imp.mem_id, sync=True) as nc_dev, nc_dev.mmap(SZ_4K) as nc:
            return nc.read(0, len(mark))

    with exported(dev) as exp, imported(dev, fabric, exp) as imp, obmm.ShmDev(exp.mem_id) as shm:
        try:
            for _ in range(U16_MAX - 1):
                read_map()
            with shm.mmap(2 * SZ_4K) as m:
                madvise = ctypes.CDLL(None, use_errno=True).madvise
                madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                assert madvise(m.addr + SZ_4K, SZ_4K, MADV_RANDOM) == 0  # two VMAs
                shm.update_range(m.addr + SZ_4K, m.addr + 2 * SZ_4K, NONE, INFER)
                read_map()  # page 1: U16_MAX readers
                m.write(0, mark)
                kernel_log.take()
                with pytest.raises(OSError) as err:
                    shm.update_range(m.addr, m.addr + 2 * SZ_4K, READ, INFER)
                assert err.value.errno == errno.EOVERFLOW
                assert "reader count overflow" in kernel_log.take()
                assert memory() != mark  # no write-back: the call changed nothing
                assert m.read(0, len(mark)) == mark
        finally:
            for addr in addrs:
                libc.munmap(ffi.cast("void *", addr), SZ_4K)
        assert memory() == mark  # the unmap wrote it back
    assert "coherence" not in kernel_log.take()
