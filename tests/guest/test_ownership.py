"""OBMM_SHMDEV_UPDATE_RANGE changes what a mapping may do (libobmm's obmm_set_ownership).

The real driver (obmm_shm_dev.c:obmm_shm_update_range) gives the range's VMAs the access of
the new mem_state and makes their page-table entries over with it: a mapping made PROT_NONE
becomes readable, then writable, then faults again.  Checked for page and PMD mappings, of
an export and of an import.  Also the reader/writer counts behind it: one that would pass
U16_MAX fails with EOVERFLOW (the newest obmm_ownership.c:update_page_ownership).

Every access that may fault runs in a child interpreter (VM_DONTCOPY: a fork has no
mapping); the child prints one line per step, so the step that faulted is known.
"""

from __future__ import annotations

import errno
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from obmm_fixtures import SZ_2M, SZ_4K, Fabric, exported, imported, run_in_child

import obmm
from obmm import abi

pytest_plugins = ["obmm_fixtures"]

if TYPE_CHECKING:
    from conftest import KernelLog  # the guest suite's conftest, beside this file

NORMAL = abi.OBMM_SHM_MEM_NORMAL
READ = NORMAL | abi.OBMM_SHM_MEM_READONLY
WRITE = NORMAL | abi.OBMM_SHM_MEM_READWRITE
NONE = NORMAL | abi.OBMM_SHM_MEM_NO_ACCESS
INFER = abi.OBMM_SHM_CACHE_INFER
MAP_SHARED = 1
MAP_FAILED = (1 << 64) - 1
PATTERN = b"ownership moves"

# The child: map region MEM_ID, then each step; "step N" before each, the data read after.
CHILD = """
import ctypes, json, sys
import obmm
from obmm import abi
mem_id, steps = int(sys.argv[1]), json.loads(sys.argv[2])
shm = obmm.ShmDev(mem_id)
m = None
for i, (kind, *args) in enumerate(steps):
    print("step", i, flush=True)
    if kind == "map":
        length, prot, pmd = args
        m = shm.mmap(length, prot=prot, pmd=pmd)
    elif kind == "map_rdonly":  # through a read-only fd; "update" still goes through shm's
        length, prot, pmd = args
        rdonly = obmm.ShmDev(mem_id, writable=False)
        m = rdonly.mmap(length, prot=prot, pmd=pmd)
    elif kind == "madvise":  # splits the VMA at the range's bounds
        off, length, advice = args
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        ret = libc.madvise(m.addr + off, length, advice)
        print("madvise", ctypes.get_errno() if ret else 0, flush=True)
    elif kind == "unmap":
        m.close()
    elif kind == "update":
        off, length, state = args
        shm.update_range(m.addr + off, m.addr + off + length, state, abi.OBMM_SHM_CACHE_INFER)
    elif kind == "read":
        off, n = args
        print("read", ctypes.string_at(m.addr + off, n).hex(), flush=True)
    elif kind == "write":
        off, data = args
        ctypes.memmove(m.addr + off, bytes.fromhex(data), len(data) // 2)
    elif kind == "move":  # mremap() to another address: refused (EOPNOTSUPP)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = libc.mremap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                ctypes.c_int, ctypes.c_void_p]
        spare = libc.mmap(None, m.length, 0, 0x22, -1, 0)  # MAP_PRIVATE | MAP_ANONYMOUS
        ret = libc.mremap(m.addr, m.length, m.length, 3, spare)  # MAYMOVE | FIXED
        print("move", ctypes.get_errno() if ret == 2**64 - 1 else 0, flush=True)
        libc.munmap(ctypes.c_void_p(spare), ctypes.c_size_t(m.length))
    elif kind == "maps":
        start = f"{m.addr:x}-"
        line = next(ln for ln in open("/proc/self/maps") if ln.startswith(start))
        print("maps", line.split()[1], flush=True)
print("done", flush=True)
"""


def run_steps(mem_id: int, steps: list[list[Any]]) -> tuple[list[str], int]:
    """The child's output lines and the signal that ended it (0: it finished)."""
    code = CHILD.replace("sys.argv[1]", repr(str(mem_id))).replace(
        "sys.argv[2]", repr(json.dumps(steps))
    )
    res = run_in_child(code, timeout=120)
    assert res.signal or res.returncode == 0, res.stderr
    return res.stdout.splitlines(), res.signal


def last_step(lines: list[str]) -> int:
    return max(int(ln.split()[1]) for ln in lines if ln.startswith("step "))


def reads(lines: list[str]) -> list[bytes]:
    return [bytes.fromhex(ln.split()[1]) for ln in lines if ln.startswith("read ")]


@pytest.fixture(params=["page", "pmd"])
def pmd(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "pmd")


@pytest.fixture(params=["export", "import"])
def region(
    request: pytest.FixtureRequest, dev: obmm.Obmm, fabric: Fabric, pmd: bool
) -> Iterator[int]:
    """The mem_id of a 4 MiB export, or of a loopback import of one; PATTERN at 0 and 2 MiB.
    The export is filled through a mapping of the test's granule (the first mmap of a region
    fixes it for good: obmm_shm_dev.c:obmm_shm_fops_mmap)."""
    with exported(dev, 2 * SZ_2M) as exp:
        with obmm.ShmDev(exp.mem_id) as shm, shm.mmap(2 * SZ_2M, pmd=pmd) as m:
            m.write(0, PATTERN)
            m.write(SZ_2M, PATTERN)
        if request.param == "export":
            yield exp.mem_id
        else:
            with imported(dev, fabric, exp) as imp:
                yield imp.mem_id


def test_prot_none_mapping_gains_read_and_write_then_loses_them(region: int, pmd: bool) -> None:
    """PROT_NONE faults; READ reads what is there; READWRITE writes; NO_ACCESS faults again."""
    n = len(PATTERN)
    steps: list[list[Any]] = [
        ["map", SZ_2M, obmm.PROT_NONE, pmd],
        ["update", 0, SZ_2M, READ],
        ["read", 0, n],
        ["update", 0, SZ_2M, WRITE],
        ["write", SZ_4K, PATTERN[::-1].hex()],
        ["read", SZ_4K, n],
        ["update", 0, SZ_2M, NONE],
        ["read", 0, n],
    ]
    lines, sig = run_steps(region, steps)
    assert sig == signal.SIGSEGV, lines
    assert last_step(lines) == len(steps) - 1, lines
    assert reads(lines) == [PATTERN, PATTERN[::-1]]

    lines, sig = run_steps(region, [["map", SZ_2M, obmm.PROT_NONE, pmd], ["read", 0, n]])
    assert (sig, last_step(lines)) == (signal.SIGSEGV, 1), "PROT_NONE must fault before any update"


def test_read_only_faults_a_write(region: int, pmd: bool) -> None:
    """A read-write mapping made READONLY reads, and its first write faults."""
    rw = obmm.PROT_READ | obmm.PROT_WRITE
    steps: list[list[Any]] = [
        ["map", SZ_2M, rw, pmd],
        ["read", 0, 4],
        ["update", 0, SZ_2M, READ],
        ["read", 0, len(PATTERN)],
        ["write", 0, "00"],
    ]
    lines, sig = run_steps(region, steps)
    assert (sig, last_step(lines)) == (signal.SIGSEGV, 4), lines
    assert reads(lines) == [PATTERN[:4], PATTERN]


def test_part_of_a_mapping(region: int, pmd: bool) -> None:
    """Only the range changes: the second 2 MiB reads, the first still faults."""
    steps: list[list[Any]] = [
        ["map", 2 * SZ_2M, obmm.PROT_NONE, pmd],
        ["update", SZ_2M, SZ_2M, READ],
        ["read", SZ_2M, len(PATTERN)],
        ["read", 0, len(PATTERN)],
    ]
    lines, sig = run_steps(region, steps)
    assert (sig, last_step(lines)) == (signal.SIGSEGV, 3), lines
    assert reads(lines) == [PATTERN]


def test_whole_mapping_flags_follow_the_update(region: int, pmd: bool) -> None:
    steps: list[list[Any]] = [
        ["map", SZ_2M, obmm.PROT_NONE, pmd],
        ["maps"],
        ["update", 0, SZ_2M, WRITE],
        ["maps"],
        ["update", 0, SZ_2M, READ],
        ["maps"],
        ["update", 0, SZ_2M, NONE],
        ["maps"],
    ]
    lines, sig = run_steps(region, steps)
    assert sig == 0, lines
    assert [ln for ln in lines if ln.startswith("maps")] == [
        "maps ---s",
        "maps rw-s",
        "maps r--s",
        "maps ---s",
    ]


# ---- the reader/writer counts ----

U16_MAX = 0xFFFF


@pytest.mark.real_driver_differs(
    "the pinned driver (65ba333) wraps its u16 counts; EOVERFLOW is openeuler-mirror/kernel "
    "obmm_ownership.c@401e969's (FIDELITY.md)"
)
def test_a_count_past_u16_max_is_eoverflow(
    dev: obmm.Obmm, many_maps: None, kernel_log: KernelLog
) -> None:
    """65535 read mappings of one page: one more reader of it, by mmap or by UPDATE_RANGE,
    is EOVERFLOW and changes nothing; another page counts on its own; once they are gone a
    mapping of the page counts from 0 again."""
    libc = abi.libc()
    ffi = abi.ffi
    addrs = []
    with exported(dev) as exp, obmm.ShmDev(exp.mem_id) as shm:
        try:
            for _ in range(U16_MAX):
                ptr = libc.mmap(ffi.NULL, SZ_4K, obmm.PROT_READ, MAP_SHARED, shm.fd, 0)
                addr = int(ffi.cast("uintptr_t", ptr))
                assert addr != MAP_FAILED, f"mmap {len(addrs)} failed: errno {ffi.errno}"
                addrs.append(addr)
            kernel_log.take()
            with pytest.raises(obmm.ObmmError) as err:
                shm.mmap(SZ_4K, prot=obmm.PROT_READ)
            assert err.value.errname == "EOVERFLOW"
            assert "obmm ownership: reader count overflow at pgoff=0" in kernel_log.take()
            with shm.mmap(SZ_4K, prot=obmm.PROT_NONE) as none:  # counts nothing
                with pytest.raises(OSError) as oserr:
                    shm.update_range(none.addr, none.addr + SZ_4K, READ, INFER)
                assert oserr.value.errno == errno.EOVERFLOW
            kernel_log.take()
            with shm.mmap(SZ_4K, SZ_4K, prot=obmm.PROT_READ) as other:
                assert other.read(0, 1) == b"\0"
        finally:
            for addr in addrs:
                libc.munmap(ffi.cast("void *", addr), SZ_4K)
        with shm.mmap(SZ_4K, prot=obmm.PROT_READ) as m:
            assert m.read(0, 1) == b"\0"


def test_a_refused_move_leaves_the_mapping_its_access(region: int, pmd: bool) -> None:
    """mremap() copies the VMA, the driver refuses the move, and the copy is unmapped again:
    that close released the entries the original still maps, so its next fault (a PMD
    granule's first touch) was SIGSEGV (the fuzzer died there, fuzz-diff seed 1 op 13853)."""
    steps: list[list[Any]] = [
        ["map", 2 * SZ_2M, obmm.PROT_READ | obmm.PROT_WRITE, pmd],
        ["move"],
        ["read", SZ_2M + SZ_4K, 4],
        ["read", 0, len(PATTERN)],
        ["read", SZ_2M, len(PATTERN)],
    ]
    lines, sig = run_steps(region, steps)
    assert sig == 0 and f"move {errno.EOPNOTSUPP}" in lines, lines
    assert reads(lines) == [bytes(4), PATTERN, PATTERN]


# ---- mappings of a read-only fd, and splits between updates (issue 36, findings 1 and 6) ----

MADV_RANDOM = 1


def granule(pmd: bool) -> int:
    return SZ_2M if pmd else SZ_4K


def region_reads(mem_id: int, pmd: bool, n: int) -> bytes:
    """The first n bytes of the region, through a new shared writable mapping of it."""
    with obmm.ShmDev(mem_id) as shm, shm.mmap(granule(pmd), pmd=pmd) as m:
        return m.read(0, n)


def test_a_read_only_fd_mapping_made_read_write_reads(region: int, pmd: bool) -> None:
    """A MAP_SHARED mapping of a read-only fd is no shared writable VMA (the kernel clears
    VM_SHARED and VM_MAYWRITE).  An UPDATE_RANGE to READWRITE through a read-write fd of the
    region is accepted and the touch reads (the real driver does so); the emulator made it a
    copy-on-write pfn mapping, whose entry vmf_insert_pfn_prot() refuses with a kernel BUG
    (mm/memory.c), leaving the task stuck in exit_mm with the mm and the region locked."""
    steps: list[list[Any]] = [
        ["map_rdonly", granule(pmd), obmm.PROT_READ, pmd],
        ["update", 0, granule(pmd), WRITE],
        ["read", 0, len(PATTERN)],
    ]
    lines, sig = run_steps(region, steps)
    assert sig == 0 and "done" in lines, lines
    assert reads(lines) == [PATTERN]
    assert region_reads(region, pmd, len(PATTERN)) == PATTERN


@pytest.mark.emulator_only
def test_a_read_only_fd_mapping_never_writes(region: int, pmd: bool) -> None:
    """Made READWRITE, that mapping still may not write: its VMA does not get VM_WRITE (no
    VM_SHARED: a write would be copy-on-write, which a pfn mapping cannot do), so a write
    faults (SIGSEGV) and the region keeps its bytes.  The real driver makes the VMA a
    copy-on-write one (FIDELITY.md)."""
    steps: list[list[Any]] = [
        ["map_rdonly", granule(pmd), obmm.PROT_READ, pmd],
        ["update", 0, granule(pmd), WRITE],
        ["maps"],
        ["read", 0, len(PATTERN)],
        ["write", 0, "00"],
    ]
    lines, sig = run_steps(region, steps)
    assert (sig, last_step(lines)) == (signal.SIGSEGV, 4), lines
    assert "maps r--s" in lines and reads(lines) == [PATTERN]
    assert region_reads(region, pmd, len(PATTERN)) == PATTERN


@pytest.mark.real_driver_differs(
    "upstream's bug: its UPDATE_RANGE sets and clears VM_MAYWRITE (OBMM_UPDATE_VM_FLAGS_MASK), "
    "so the mapping's VMAs are counted in i_mmap_writable unevenly and the later writable mmap "
    "is EPERM (FIDELITY.md)"
)
def test_a_split_between_updates_keeps_writable_mmaps(region: int, pmd: bool) -> None:
    """READONLY, a split (madvise), READWRITE, munmap: the region's count of shared writable
    mappings (i_mmap_writable) must come back to 0.  When UPDATE_RANGE cleared VM_MAYWRITE,
    the split piece was not counted, READWRITE set it again and the munmap uncounted both
    pieces: the count ended at -1 and every later shared writable mmap of the region was
    EPERM."""
    g = granule(pmd)
    steps: list[list[Any]] = [
        ["map", 2 * g, obmm.PROT_READ | obmm.PROT_WRITE, pmd],
        ["update", 0, 2 * g, READ],
        ["madvise", g, g, MADV_RANDOM],
        ["update", 0, 2 * g, WRITE],
        ["read", g, 4],
        ["unmap"],
    ]
    lines, sig = run_steps(region, steps)
    assert sig == 0 and "madvise 0" in lines and "done" in lines, lines
    assert region_reads(region, pmd, len(PATTERN)) == PATTERN


MAP_FAIL = Path("/sys/module/obmm/parameters/test_map_fail")


@pytest.mark.parametrize("first_pmd", [True, False], ids=["pmd-then-page", "page-then-pmd"])
def test_a_failed_first_mapping_leaves_the_counters_to_the_next_granule(
    dev: obmm.Obmm, first_pmd: bool, kernel_log: KernelLog
) -> None:
    """A cacheable mmap that fails after its entries were counted (its memtype reservation:
    ENOMEM under fault injection, here the test-only test_map_fail) does not fix the region's
    granule, so the next mapping may use the other one; its entries are counted in counters
    of its own granule.  Seen on the debug kernel (the fuzzer, seed 1): a PMD mmap failed
    that way, then a page mmap counted entries past the PMD-sized counters (KASAN
    slab-out-of-bounds in obmm_owner_move, then "writer count overflow", EOVERFLOW)."""
    if not MAP_FAIL.is_file():
        pytest.skip("not the suites' build of obmm_emu (no test_map_fail)")
    size = 2 * SZ_2M
    with exported(dev, size) as exp, obmm.ShmDev(exp.mem_id) as shm:
        MAP_FAIL.write_text("1")
        try:
            with pytest.raises(obmm.ObmmError) as err:
                shm.mmap(size, pmd=first_pmd)
        finally:
            MAP_FAIL.write_text("0")
        assert err.value.errname == "ENOMEM"
        kernel_log.take()
        with shm.mmap(size, pmd=not first_pmd) as m:
            last = size - SZ_4K  # the last entry of either granule
            m.write(last, PATTERN)
            assert m.read(last, len(PATTERN)) == PATTERN
            # every entry of the mapping moves: READONLY, then READWRITE again
            shm.update_range(m.addr, m.addr + size, READ, INFER)
            assert m.read(last, len(PATTERN)) == PATTERN
            shm.update_range(m.addr, m.addr + size, WRITE, INFER)
            m.write(0, PATTERN)
        assert not kernel_log.take_reports()
