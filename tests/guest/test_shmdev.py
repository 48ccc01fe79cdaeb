"""/dev/obmm_shmdev<id>: open modes, mmap rules, VMA behaviour, OBMM_SHMDEV_UPDATE_RANGE.

Reference: docs/obmm-driver.md sections 3.8, 3.9, 4.9, 4.10 and 4.11.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import platform
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from obmm_fixtures import SZ_2M, SZ_4K, ChildResult, Fabric, expect_errno, exported, imported

import obmm
from obmm import abi
from obmm.tools import logscan

pytest_plugins = ["obmm_fixtures"]

PMD_4K = pytest.mark.real_driver_differs(
    "ub_compat maps PMD-granule mmaps with 4 KiB entries: remap_pfn_range_try_pmd() is OLK's, and "
    "a stock kernel installs huge PFN entries only at fault time (kmod/ub_compat/README.md)"
)

if TYPE_CHECKING:
    from conftest import KernelLog  # the guest suite's conftest, beside this file

RW = obmm.PROT_READ | obmm.PROT_WRITE
NORMAL = abi.OBMM_SHM_MEM_NORMAL
NC = abi.OBMM_SHM_MEM_NORMAL_NC
DEVICE = abi.OBMM_SHM_MEM_DEVICE
RO = abi.OBMM_SHM_MEM_READONLY
RX = abi.OBMM_SHM_MEM_READEXEC
RWS = abi.OBMM_SHM_MEM_READWRITE
NOACC = abi.OBMM_SHM_MEM_NO_ACCESS
INFER = abi.OBMM_SHM_CACHE_INFER

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mremap.restype = ctypes.c_void_p
_libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                         ctypes.c_void_p]  # fmt: skip
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]  # fmt: skip
MAP_PRIVATE = mmap.MAP_PRIVATE
MAP_ANONYMOUS = mmap.MAP_ANONYMOUS
MREMAP_MAYMOVE = 1
MREMAP_FIXED = 2
MAP_FAILED = ctypes.c_void_p(-1).value


def libc_call(func: str, *args: object) -> None:
    ret = getattr(_libc, func)(*args)
    if ret == -1 or (func == "mremap" and ret == MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"{func}: {errno.errorcode.get(err)}")


@pytest.fixture
def region(dev: obmm.Obmm) -> Iterator[obmm.Export]:
    with exported(dev, 4 * SZ_2M) as exp:
        yield exp


# ---- open ----


@pytest.mark.parametrize("sync", [False, True], ids=["cacheable", "o_sync"])
def test_open_both_modes_on_pool_export(region: obmm.Export, sync: bool) -> None:
    with obmm.ShmDev(region.mem_id, sync=sync):
        pass


# ---- mmap ----


def test_map_private_is_einval(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm:
        expect_errno(errno.EINVAL, shm.mmap, SZ_2M, shared=False)


def test_map_without_allow_mmap_is_eperm(dev: obmm.Obmm) -> None:
    with exported(dev, flags=0) as exp, obmm.ShmDev(exp.mem_id) as shm:
        expect_errno(errno.EPERM, shm.mmap, SZ_2M)


def test_shared_checked_before_allow_mmap(dev: obmm.Obmm) -> None:
    with exported(dev, flags=0) as exp, obmm.ShmDev(exp.mem_id) as shm:
        expect_errno(errno.EINVAL, shm.mmap, SZ_2M, shared=False)


def test_read_only_fd_read_only_map(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id, writable=False) as shm:  # noqa: SIM117
        with shm.mmap(SZ_2M, prot=obmm.PROT_READ) as m:
            assert m.read(0, 8) == bytes(8)


def test_offset_equal_size_is_einval(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm:
        expect_errno(errno.EINVAL, shm.mmap, SZ_2M, 4 * SZ_2M)


def test_length_past_end_is_einval(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm:
        expect_errno(errno.EINVAL, shm.mmap, 2 * SZ_2M, 3 * SZ_2M)


def test_offset_inside_region_maps(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M, 3 * SZ_2M) as m:
        m.write(SZ_2M - 8, b"12345678")


def test_pmd_unaligned_offset_is_einval(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm:
        expect_errno(errno.EINVAL, shm.mmap, SZ_2M, SZ_4K, pmd=True)


def test_pmd_unaligned_length_is_einval(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm:
        expect_errno(errno.EINVAL, shm.mmap, SZ_2M + SZ_4K, 0, pmd=True)


def test_pmd_mapping_is_pmd_aligned(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(2 * SZ_2M, pmd=True) as m:
        assert m.addr % SZ_2M == 0
        m.write(SZ_2M, b"pmd")


def test_page_after_pmd_is_eperm(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm:
        with shm.mmap(SZ_2M, pmd=True):
            pass
        # the granule stays fixed after the mapping is gone
        expect_errno(errno.EPERM, shm.mmap, SZ_2M)


def test_pmd_after_page_is_eperm(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm:
        with shm.mmap(SZ_2M):
            pass
        expect_errno(errno.EPERM, shm.mmap, SZ_2M, pmd=True)


def test_granule_is_per_region_not_per_fd(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as a, a.mmap(SZ_2M, pmd=True), obmm.ShmDev(region.mem_id) as b:
        expect_errno(errno.EPERM, b.mmap, SZ_2M)


def test_nc_while_cacheable_mapped_is_eperm(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as cc, cc.mmap(SZ_2M):  # noqa: SIM117
        with obmm.ShmDev(region.mem_id, sync=True) as nc:
            expect_errno(errno.EPERM, nc.mmap, SZ_2M)


def test_cacheable_while_nc_mapped_is_eperm(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id, sync=True) as nc, nc.mmap(SZ_2M):  # noqa: SIM117
        with obmm.ShmDev(region.mem_id) as cc:
            expect_errno(errno.EPERM, cc.mmap, SZ_2M)


def test_mode_switch_after_unmap(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as cc, cc.mmap(SZ_2M):
        pass
    with obmm.ShmDev(region.mem_id, sync=True) as nc, nc.mmap(SZ_2M) as m:
        m.write(0, b"wc")


def test_two_cacheable_mappings_share_bytes(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M) as a, shm.mmap(SZ_2M) as b:
        a.write(100, b"same bytes")
        assert b.read(100, 10) == b"same bytes"


# ---- VMA behaviour ----


@pytest.mark.parametrize("pmd", [False, True], ids=["page", "pmd"])
def test_mprotect_is_eopnotsupp(region: obmm.Export, pmd: bool) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(2 * SZ_2M, pmd=pmd) as m:
        m.write(SZ_2M, b"before")
        expect_errno(errno.EOPNOTSUPP, libc_call, "mprotect", m.addr + SZ_2M, SZ_2M, obmm.PROT_READ)
        m.write(SZ_2M, b"after!")  # still writable: nothing was changed or split
        assert m.read(SZ_2M, 6) == b"after!"


def test_mremap_move_is_eopnotsupp(region: obmm.Export) -> None:
    spare = _libc.mmap(None, SZ_2M, 0, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    assert spare != MAP_FAILED
    try:
        with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M) as m:
            expect_errno(
                errno.EOPNOTSUPP,
                libc_call,
                "mremap",
                m.addr,
                SZ_2M,
                SZ_2M,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                spare,
            )
    finally:
        _libc.munmap(ctypes.c_void_p(spare), ctypes.c_size_t(SZ_2M))


def test_mremap_grow_is_refused(region: obmm.Export) -> None:
    """VM_DONTEXPAND: growing in place is refused by the core (EFAULT)."""
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M) as m:
        expect_errno(errno.EFAULT, libc_call, "mremap", m.addr, SZ_2M, 2 * SZ_2M, 0, None)


@pytest.mark.parametrize("pmd", [False, True], ids=["page", "pmd"])
def test_mapping_not_inherited_by_fork(region: obmm.Export, child: object, pmd: bool) -> None:
    """VM_DONTCOPY: a forked child does not have the mapping; the parent's stays whole."""
    code = f"""
import os, obmm, signal
shm = obmm.ShmDev({region.mem_id})
m = shm.mmap({2 * SZ_2M}, pmd={pmd})
m.write({SZ_2M}, b"parent")
pid = os.fork()
if pid == 0:
    import ctypes
    ctypes.c_char.from_address(m.addr + {SZ_2M}).value
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0, m.read({SZ_2M}, 6).decode())
m.close()
"""
    res: ChildResult = child(code)  # type: ignore[operator]
    assert res.returncode == 0, res.stderr
    sig, data = res.stdout.split()
    assert int(sig) == signal.SIGSEGV
    assert data == "parent"


def test_vma_name_in_maps(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M) as m:
        maps = Path("/proc/self/maps").read_text()
        line = next(ln for ln in maps.splitlines() if ln.startswith(f"{m.addr:x}-"))
        assert "OBMM_SHM" in line or f"obmm_shmdev{region.mem_id}" in line


def test_partial_munmap_keeps_rest(region: obmm.Export) -> None:
    """Splitting at a granule boundary is allowed (may_split).  The tail is unmapped first:
    x86 PAT before 6.17 cannot free the head of a pfnmap reservation (see FIDELITY.md)."""
    with obmm.ShmDev(region.mem_id) as shm:
        m = shm.mmap(2 * SZ_2M)
        m.write(0, b"head")
        _libc.munmap(ctypes.c_void_p(m.addr + SZ_2M), ctypes.c_size_t(SZ_2M))
        assert ctypes.string_at(m.addr, 4) == b"head"
        _libc.munmap(ctypes.c_void_p(m.addr), ctypes.c_size_t(SZ_2M))


@pytest.mark.parametrize("pmd", [False, True], ids=["page", "pmd"])
def test_ptrace_access_reads_mapping(region: obmm.Export, pmd: bool) -> None:
    """vm_ops->access: /proc/<pid>/mem (and so gdb) can read and write the mapping
    (through a huge entry too: generic_access_phys() cannot walk one)."""
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(2 * SZ_2M, pmd=pmd) as m:
        m.write(SZ_2M + 64, b"peek")
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(m.addr + SZ_2M + 64)
            assert mem.read(4) == b"peek"
            mem.seek(m.addr + SZ_2M + 128)
            mem.write(b"poke")
        assert m.read(SZ_2M + 128, 4) == b"poke"


# ---- PMD-granule mappings: 2 MiB at a time, huge entries where the kernel allows ----

SZ_64M = 32 * SZ_2M


def vm_pte_kib() -> int:
    """This process's page-table memory (/proc/self/status VmPTE, kB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmPTE:"):
            return int(line.split()[1])
    raise AssertionError("no VmPTE in /proc/self/status")


def touch_every_2m(m: obmm.Mapping) -> None:
    for off in range(0, m.length, SZ_2M):
        m.write(off, off.to_bytes(8, "little"))


def kernel_marks_huge_pfn_entries_special() -> bool:
    """pmd_special(): 6.12 on x86_64 and arm64 (CONFIG_ARCH_SUPPORTS_PMD_PFNMAP).  Only there
    does the emulator install huge pfn entries (kmod/obmm_emu/shmdev.c): before it,
    get_user_pages_fast() reads a struct page for any huge PMD (test_handoff.py)."""
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return platform.machine() in ("x86_64", "aarch64") and (major, minor) >= (6, 12)


@PMD_4K
@pytest.mark.parametrize("sync", [False, True], ids=["cacheable", "o_sync"])
def test_pmd_mapping_uses_huge_entries(dev: obmm.Obmm, sync: bool) -> None:
    """64 MiB mapped with 4 KiB PTEs needs 32 page tables (128 kB of VmPTE); the PMD-granule
    mapping, every 2 MiB touched, adds none (at most the one PMD table above them) where the
    kernel marks huge pfn entries special, and otherwise gets its 4 KiB PTEs 2 MiB at a time
    as it is touched: one page table per 2 MiB, installed at the first touch, not at mmap."""
    with exported(dev, SZ_64M) as page_exp, exported(dev, SZ_64M) as pmd_exp:
        with obmm.ShmDev(page_exp.mem_id, sync=sync) as shm:
            before = vm_pte_kib()
            with shm.mmap(SZ_64M) as m:
                touch_every_2m(m)
                page_tables = vm_pte_kib() - before
        with obmm.ShmDev(pmd_exp.mem_id, sync=sync) as shm:
            before = vm_pte_kib()
            with shm.mmap(SZ_64M, pmd=True) as m:
                untouched = vm_pte_kib() - before
                touch_every_2m(m)
                pmd_tables = vm_pte_kib() - before
                for off in range(0, SZ_64M, SZ_2M):
                    assert int.from_bytes(m.read(off, 8), "little") == off
    assert page_tables >= 32 * 4, page_tables
    assert untouched <= 8, untouched
    if kernel_marks_huge_pfn_entries_special():
        assert pmd_tables <= 8, pmd_tables
    else:
        assert pmd_tables >= 32 * 4, pmd_tables


def test_pmd_mapping_reaches_the_same_bytes(dev: obmm.Obmm, fabric: Fabric) -> None:
    """What the exporter writes through huge entries, a page-granule import reads, and back."""
    with exported(dev, 4 * SZ_2M) as exp, imported(dev, fabric, exp) as imp:  # noqa: SIM117
        with obmm.ShmDev(exp.mem_id) as es, es.mmap(pmd=True) as em:
            with obmm.ShmDev(imp.mem_id) as is_, is_.mmap() as im:
                for off in range(SZ_2M - 8, 4 * SZ_2M, SZ_2M):
                    em.write(off, b"0123456789abcdef"[: min(16, 4 * SZ_2M - off)])
                for off in range(SZ_2M - 8, 4 * SZ_2M, SZ_2M):
                    n = min(16, 4 * SZ_2M - off)
                    assert im.read(off, n) == b"0123456789abcdef"[:n]
                im.write(3 * SZ_2M + 100, b"back")
                assert em.read(3 * SZ_2M + 100, 4) == b"back"


def test_pmd_partial_munmap(region: obmm.Export, child: object) -> None:
    """Unmapping whole 2 MiB pieces of a PMD mapping (head included: no per-VMA PAT
    reservation) leaves the rest mapped with its data; the unmapped piece faults SIGSEGV;
    a cut inside a PMD is refused (may_split)."""
    code = f"""
import ctypes, os, obmm
libc = ctypes.CDLL(None, use_errno=True)
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
SZ = {SZ_2M}
shm = obmm.ShmDev({region.mem_id})
m = shm.mmap(4 * SZ, pmd=True)
for i in range(4):
    m.write(i * SZ + 8, b"piece%d" % i)
assert libc.munmap(m.addr + SZ + 4096, SZ) == -1 and ctypes.get_errno() == 22
assert libc.munmap(m.addr + SZ, SZ) == 0
assert libc.munmap(m.addr, SZ) == 0
out = [ctypes.string_at(m.addr + i * SZ + 8, 6).decode() for i in (2, 3)]
pid = os.fork()
if pid == 0:
    ctypes.c_char.from_address(m.addr + SZ + 8).value
    os._exit(0)
_, status = os.waitpid(pid, 0)
out.append(str(os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0))
assert libc.munmap(m.addr + 2 * SZ, 2 * SZ) == 0
print(" ".join(out))
"""
    res: ChildResult = child(code)  # type: ignore[operator]
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["piece2", "piece3", str(int(signal.SIGSEGV))]


# The PAT memtype hold of lazily installed PMD granules is the emulator's (shmdev.c); under the
# real driver (ub_compat's 4 KiB entries at mmap) the outcome varied from run to run.
@pytest.mark.emulator_only
def test_pmd_mapping_has_the_page_mapping_memtype(dev: obmm.Obmm) -> None:
    """x86 PAT: huge entries get the caching mode a page-granule mapping of the same mode gets
    (the region's memtype reservation, /sys/kernel/debug/x86/pat_memtype_list; WB / WC where
    PAT and MTRRs allow, uncached-minus for both in the TCG guests, whose kernel skips PAT
    setup); the reservation goes with the last mapping."""
    memtypes = Path("/sys/kernel/debug/x86/pat_memtype_list")
    if not memtypes.parent.parent.is_dir():
        subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=False)
    if not memtypes.is_file():
        pytest.skip("no x86 PAT memtype list (not x86, or no debugfs)")

    def kinds(exp: obmm.Export) -> list[str]:
        pa = dev.query_pa_by_memid(exp.mem_id, 0)
        span = f"[mem 0x{pa:016x}-0x{pa + 2 * SZ_2M:016x}]"  # memtype_seq_show()
        return [ln.split()[-1] for ln in memtypes.read_text().splitlines() if span in ln]

    for sync in (True, False):
        with exported(dev, 2 * SZ_2M) as page_exp, exported(dev, 2 * SZ_2M) as pmd_exp:
            with obmm.ShmDev(page_exp.mem_id, sync=sync) as shm, shm.mmap() as m:
                touch_every_2m(m)
                page_kinds = kinds(page_exp)
            with obmm.ShmDev(pmd_exp.mem_id, sync=sync) as shm, shm.mmap(pmd=True) as m:
                touch_every_2m(m)
                pmd_kinds = kinds(pmd_exp)
            assert kinds(pmd_exp) == []
        assert len(page_kinds) == 1 and pmd_kinds == page_kinds, (sync, page_kinds, pmd_kinds)


# ---- OBMM_SHMDEV_UPDATE_RANGE ----


def update(shm: obmm.ShmDev, start: int, end: int, state: int, ops: int = INFER) -> None:
    shm.update_range(start, end, state, ops)


def test_update_range_on_o_sync_fd_is_einval(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id, sync=True) as shm, shm.mmap(SZ_2M) as m:
        expect_errno(errno.EINVAL, update, shm, m.addr, m.addr + SZ_2M, NORMAL | RWS)


def test_update_range_before_mmap_is_einval(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm:
        expect_errno(errno.EINVAL, update, shm, 0, SZ_2M, NORMAL | RWS)


@pytest.mark.parametrize(
    "state,ops",
    [
        (NORMAL | RWS, INFER),
        (NORMAL | RO, abi.OBMM_SHM_CACHE_WB_INVAL),
        (NORMAL | RX, abi.OBMM_SHM_CACHE_NONE),
        (NC | NOACC, abi.OBMM_SHM_CACHE_INVAL),
        (DEVICE | RWS, abi.OBMM_SHM_CACHE_WB_ONLY),
    ],
    ids=["rw-infer", "ro-wbinval", "rx-none", "nc-noaccess-inval", "device-rw-wbonly"],
)
def test_update_range_valid(region: obmm.Export, state: int, ops: int) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M) as m:
        update(shm, m.addr, m.addr + SZ_2M, state, ops)


def test_update_range_start_ge_end_is_einval(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M) as m:
        expect_errno(errno.EINVAL, update, shm, m.addr + SZ_4K, m.addr + SZ_4K, NORMAL | RWS)


def test_update_range_unaligned_page_is_einval(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M) as m:
        expect_errno(errno.EINVAL, update, shm, m.addr + 1, m.addr + SZ_4K, NORMAL | RWS)


def test_update_range_unaligned_pmd_is_einval(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M, pmd=True) as m:
        expect_errno(errno.EINVAL, update, shm, m.addr, m.addr + SZ_4K, NORMAL | RWS)


@pytest.mark.parametrize(
    "state",
    [0x10 | NORMAL, abi.OBMM_SHM_MEM_CACHE_RESV | RWS, NC | RX, DEVICE | RX, NC | RWS, NC | RO],
    ids=["bit4", "resv", "nc-rx", "device-rx", "nc-rw", "nc-ro"],
)
def test_update_range_bad_mem_state_is_einval(region: obmm.Export, state: int) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M) as m:
        expect_errno(errno.EINVAL, update, shm, m.addr, m.addr + SZ_2M, state)


@pytest.mark.parametrize("ops", [5, 0xFF])
def test_update_range_bad_cache_ops_is_einval(region: obmm.Export, ops: int) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M) as m:
        expect_errno(errno.EINVAL, update, shm, m.addr, m.addr + SZ_2M, NORMAL | RO, ops)


def test_update_range_write_on_read_only_fd_is_eperm(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as rw, rw.mmap(SZ_2M) as m:  # noqa: SIM117
        with obmm.ShmDev(region.mem_id, writable=False) as ro:
            expect_errno(errno.EPERM, update, ro, m.addr, m.addr + SZ_2M, NORMAL | RWS)


def test_update_range_access_checked_before_state(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as rw, rw.mmap(SZ_2M) as m:  # noqa: SIM117
        with obmm.ShmDev(region.mem_id, writable=False) as ro:
            expect_errno(errno.EPERM, update, ro, m.addr, m.addr + SZ_2M, NC | RWS)


def test_update_range_past_mapping_is_efault(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M) as m:
        expect_errno(errno.EFAULT, update, shm, m.addr, m.addr + 2 * SZ_2M, NORMAL | RO)


def test_update_range_other_region_is_efault(dev: obmm.Obmm, region: obmm.Export) -> None:
    with exported(dev) as other, obmm.ShmDev(other.mem_id) as oshm, oshm.mmap(SZ_2M) as om:  # noqa: SIM117
        with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M):
            expect_errno(errno.EFAULT, update, shm, om.addr, om.addr + SZ_2M, NORMAL | RO)


def test_update_range_bad_pointer_is_efault(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm:
        expect_errno(errno.EFAULT, fcntl.ioctl, shm.fd, abi.OBMM_SHMDEV_UPDATE_RANGE, 16)


def test_unknown_shmdev_ioctl_is_enotty(region: obmm.Export) -> None:
    with obmm.ShmDev(region.mem_id) as shm:
        expect_errno(errno.ENOTTY, fcntl.ioctl, shm.fd, abi.ioc(0, "X", 1, 0), 0)
        expect_errno(errno.ENOTTY, fcntl.ioctl, shm.fd, abi.OBMM_CMD_EXPORT, 0)


# ---- the device node a region is opened by ----

# Inodes of the scratch tmpfs: statvfs() then counts the free ones exactly.
TMPFS_INODES = 16


@contextlib.contextmanager
def scratch_tmpfs(where: Path) -> Iterator[Path]:
    where.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"nr_inodes={TMPFS_INODES}", "none", str(where)], check=True
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def shmdev_node_in(directory: Path, mem_id: int) -> Path:
    """A second device node of /dev/obmm_shmdev<mem_id>, made with mknod in directory."""
    dev = Path(f"/dev/obmm_shmdev{mem_id}")
    node = directory / dev.name
    os.mknod(node, 0o600 | stat.S_IFCHR, dev.stat().st_rdev)
    return node


def test_region_does_not_pin_the_inode_of_its_first_node(dev: obmm.Obmm, tmp_path: Path) -> None:
    """Opened first through a mknod on a tmpfs, the node unlinked: its inode is freed at once.

    Region state used to hang on the inode of its first open (igrab()), held
    until the region was freed: the tmpfs kept an inode it had no name for.
    """
    with scratch_tmpfs(tmp_path / "mnt") as mnt:
        free_before = os.statvfs(mnt).f_ffree
        with exported(dev) as exp:
            node = shmdev_node_in(mnt, exp.mem_id)
            with obmm.ShmDev(exp.mem_id, dev_dir=str(mnt)) as shm, shm.mmap(SZ_2M) as m:
                m.write(0, b"tmpfs")
            node.unlink()
            free_after = os.statvfs(mnt).f_ffree
            # The region still works, through /dev.
            with obmm.ShmDev(exp.mem_id) as shm, shm.mmap(SZ_2M) as m:
                assert m.read(0, 5) == b"tmpfs"
        # (Checked with the region gone, so that the old module's pinned inode
        # is dropped before the unmount and this test fails instead of oopsing.)
        assert free_after == free_before, "the region still holds the inode of its first node"


def test_region_outlives_the_filesystem_of_its_first_node(
    region: obmm.Export, tmp_path: Path, kernel_log: KernelLog
) -> None:
    """First open through a mknod on a tmpfs, then unmount: no busy inode, the region works.

    With region state on the inode of its first open (igrab()), the unmount
    reported "VFS: Busy inodes after unmount" and Debian's 6.1 hit
    "kernel BUG at fs/super.c" in it: the guest died.
    """
    with scratch_tmpfs(tmp_path / "mnt") as mnt:
        shmdev_node_in(mnt, region.mem_id)
        with obmm.ShmDev(region.mem_id, dev_dir=str(mnt)) as shm, shm.mmap(SZ_2M) as m:
            m.write(0, b"tmpfs")
    with obmm.ShmDev(region.mem_id) as shm, shm.mmap(SZ_2M) as m:
        assert m.read(0, 5) == b"tmpfs"
    log = kernel_log.take()
    assert "Busy inodes" not in log, log
    assert not logscan.scan(log, allow=()), log
