"""Fixtures of the OBMM guest suite: device handles, the fabric, leak checks.

Load from a conftest with ``pytest_plugins = ["obmm_fixtures"]``.

* ``dev``: an open ``obmm.Obmm``.
* ``fabric``: the testbed fabric as obmm_emu.ko publishes it in
  /sys/kernel/obmm_emu, or the real obmm.ko's compat layer in
  /sys/kernel/ub_compat (node id, CNA, EID, decoder windows, pool); on real UB
  hardware the decoder address of a loopback import comes from management
  software, so it skips where neither is loaded.
* ``obmm_leak_check`` (autouse): after every test no region, shmdev node,
  region sysfs directory or pool usage may be left over, and /proc/iomem
  must read as it did before the test (a resource left behind, or one
  unlinked, fails it).  Leftover regions are removed (so one leak does not
  cascade) and the test fails.
* ``module_unloads_promptly`` (autouse, session): after the last test, the emulated obmm
  (idle) unloads within 5 s and is loaded again with its fabric parameters (ubc_dev among
  them); the last test fails otherwise
  (a worker that outlives its work, an unload that waits for one).  Emulator only.
* ``export`` / ``imported``: context managers that always clean up.
* ``block`` / ``blk_export``: the memory block size, and a live export of one block at a
  block-aligned address in one physical run (what a borrow or a declaration goes over).
* ``run_in_child``: run a snippet in a fresh interpreter, return how it died.
"""

from __future__ import annotations

import contextlib
import ctypes
import difflib
import errno
import gc
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import obmm
from obmm import decoder
from obmm.fuzz import faults, target

DEV_OBMM = Path("/dev/obmm")
EMU_SYSFS = Path("/sys/kernel/obmm_emu")
#: The fabric's files: the emulator's, or the real driver's compat layer's (obmm.decoder).
FABRIC_SYSFS = tuple(Path(p) for p in decoder.FABRIC_SYSFS)
MEMPOOL_SYSFS = Path("/sys/kernel/obmm_mempool")
SHMDEV_SYSFS = Path("/sys/devices/obmm")
SZ_4K = 4 << 10
SZ_2M = 2 << 20
SZ_128M = 128 << 20
MAP_HUGETLB = 0x40000
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
PROC_IOMEM = Path("/proc/iomem")
MEMORY_BLOCK_SIZE = Path("/sys/devices/system/memory/block_size_bytes")


def read_int(path: Path) -> int:
    return int(path.read_text().strip(), 0)


@dataclass(frozen=True)
class Fabric:
    """This node's view of the emulated UB fabric."""

    node_id: int
    cna: int
    eid: int
    windows: dict[int, tuple[int, int]]  # node -> (base, size)
    pool_base: int
    pool_size: int
    #: Every node's physical address at offset 0 of its window (0 on x86, the RAM base of
    #: QEMU's virt machine on arm64; windows/<n>/remote_base).
    ram_base: int = 0

    @property
    def seid(self) -> bytes:
        """The 16-byte EID of the local controller as libobmm builds it."""
        return self.eid.to_bytes(4, sys.byteorder).ljust(16, b"\0")

    def window_base(self, node: int | None = None) -> int:
        return self.windows[self.node_id if node is None else node][0]

    def window_size(self, node: int | None = None) -> int:
        return self.windows[self.node_id if node is None else node][1]

    def window_addr(self, pa: int, node: int | None = None) -> int:
        """Where this node reaches node `node`'s physical address `pa` (its decoder address)."""
        return self.window_base(node) + pa - self.ram_base

    def loopback_addr(self, dev: obmm.Obmm, mem_id: int, offset: int = 0) -> int:
        """Decoder address, in this node's own window, of byte `offset` of export `mem_id`."""
        return self.window_addr(dev.query_pa_by_memid(mem_id, offset))

    def import_loopback(self, dev: obmm.Obmm, exp: obmm.Export, **kw: object) -> obmm.Import:
        skip_if_in_pieces(exp)
        kw.setdefault("tokenid", exp.tokenid)
        return dev.import_(
            self.loopback_addr(dev, exp.mem_id),
            exp.length,
            scna=self.cna,
            **kw,  # type: ignore[arg-type]
        )


def skip_if_in_pieces(exp: obmm.Export) -> None:
    """Skip where the real driver's pool gave `exp` in pieces (kmod/ub_compat/pool.c): a
    host's UMMU maps them to one UBA range, the testbed's decoder reaches one run only."""
    if exp.uba & decoder.EMU_UBA_SCATTERED and os.environ.get("OBMM_DRIVER") == "real":
        pytest.skip("the real driver's pool gave the export in pieces; no UBA reaches it")


def load_fabric() -> Fabric | None:
    root = next((r for r in FABRIC_SYSFS if r.is_dir()), None)
    if root is None:
        return None
    windows = {}
    ram_base = 0
    for w in sorted((root / "windows").iterdir()):
        windows[read_int(w / "node")] = (read_int(w / "base"), read_int(w / "size"))
        if (w / "remote_base").exists():
            ram_base = read_int(w / "remote_base")
    return Fabric(
        node_id=read_int(root / "node_id"),
        cna=read_int(root / "cna"),
        eid=read_int(root / "eid"),
        windows=windows,
        pool_base=read_int(root / "pool_base"),
        pool_size=read_int(root / "pool_size"),
        ram_base=ram_base,
    )


def pool_dirs() -> list[Path]:
    return sorted(MEMPOOL_SYSFS.glob("obmm-*")) if MEMPOOL_SYSFS.is_dir() else []


def pool_used() -> int:
    return sum(read_int(d / "used") for d in pool_dirs())


def pool_total() -> int:
    return sum(read_int(d / "total") for d in pool_dirs())


#: How long the real driver's pool may take to fill again: its pool thread wakes every 5 s, and
#: after a failed allocation waits mempool_refill_timeout (the testbed loads it with 1 s).
POOL_SETTLE_S = 20.0


def settle_pool(timeout: float = POOL_SETTLE_S) -> None:
    """Wait until the pool holds all of the fabric's pool memory, cleared (what is not used).

    obmm_emu's pool is always whole; the real obmm.ko refills its pool in the background after
    an unexport, so a test that needs the whole pool (sizes from the counters, FAST, a free
    memory block) waits for it here.  Returns at the deadline either way: the test's own
    assertion then says what was missing."""
    fab = load_fabric()
    want = fab.pool_size if fab is not None else 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dirs = pool_dirs()
        total = sum(read_int(d / "total") for d in dirs)
        used = sum(read_int(d / "used") for d in dirs)
        cleared = sum(read_int(d / "available_cleared") for d in dirs)
        if dirs and total >= want and cleared == total - used:
            return
        time.sleep(0.1)


def quarantined() -> int:
    """Memory obmm_emu holds back after an unexport (0 under the real driver: no quarantine)."""
    path = EMU_SYSFS / "quarantined"
    return int(path.read_text().strip(), 0) if path.exists() else 0


#: How long revocation, unplug and the removal of a few MiB of borrowed memory take under TCG.
UNPLUG_S = 60.0


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    """Whether `predicate` held within `timeout` seconds (checked every 0.2 s)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def memory_block_size() -> int:
    try:
        return int(MEMORY_BLOCK_SIZE.read_text().strip(), 16)
    except OSError:
        return SZ_128M


@pytest.fixture
def block() -> int:
    """The guest's memory block size: the unit of hot-add (borrows, preimport declarations)."""
    return memory_block_size()


@pytest.fixture
def blk_export(dev: obmm.Obmm, fabric: Fabric, block: int) -> Iterator[obmm.Export]:
    """A live export of one memory block at a block-aligned address, in one physical run."""
    # Quarantined memory from earlier tests could leave only unaligned runs free (obmm_emu);
    # the real driver's pool fills again in the background.
    wait_for(lambda: quarantined() == 0, UNPLUG_S)
    settle_pool()
    if pool_total() - pool_used() < block:
        pytest.skip("the pool has no free memory block")
    with exported(dev, block) as exp:
        if fabric.loopback_addr(dev, exp.mem_id) % block:
            pytest.skip("the pool gave no block-aligned range")
        first = dev.query_pa_by_memid(exp.mem_id)
        if any(dev.query_pa_by_memid(exp.mem_id, off) != first + off
               for off in range(0, block, SZ_2M)):  # fmt: skip
            # the real driver's pool can; the testbed's UMMU maps one run only
            pytest.skip("the pool gave no block in one physical run")
        yield exp


@dataclass(frozen=True)
class ObmmState:
    """Everything a leaked region leaves behind."""

    shmdevs: frozenset[str]
    sysfs: frozenset[str]
    pool_used: int
    iomem: tuple[str, ...]

    def region_ids(self) -> set[int]:
        return {int(n.removeprefix("obmm_shmdev")) for n in self.shmdevs | self.sysfs}


def snapshot() -> ObmmState:
    return ObmmState(
        shmdevs=frozenset(p.name for p in Path("/dev").glob("obmm_shmdev*")),
        sysfs=frozenset(p.name for p in SHMDEV_SYSFS.glob("obmm_shmdev*"))
        if SHMDEV_SYSFS.is_dir()
        else frozenset(),
        pool_used=pool_used(),
        iomem=tuple(PROC_IOMEM.read_text().splitlines()),
    )


def iomem_diff(before: tuple[str, ...], after: tuple[str, ...]) -> str:
    """The /proc/iomem lines a test added (+) or removed (-)."""
    lines = difflib.unified_diff(before, after, "before", "after", n=0, lineterm="")
    return "\n".join(ln for ln in lines if ln[:1] in "+-" and ln[:3] not in ("+++", "---"))


def _remove_region(dev: obmm.Obmm, mem_id: int) -> str:
    kind = (SHMDEV_SYSFS / f"obmm_shmdev{mem_id}" / "type").read_text().strip()
    try:
        if kind == "export":
            dev.unexport(mem_id)
        else:
            dev.unimport(mem_id)
    except obmm.ObmmError as exc:
        return f"{kind} {mem_id} (cleanup failed: {exc.errname})"
    return f"{kind} {mem_id}"


@pytest.fixture(autouse=True)
def obmm_leak_check() -> Iterator[None]:
    """Fail a test that leaves a region, a shmdev node, sysfs or pool memory behind."""
    if not DEV_OBMM.exists():
        yield
        return
    before = snapshot()
    yield
    gc.collect()  # drop mappings / fds the test forgot, so cleanup can work
    after = snapshot()
    if after == before:
        return
    leaked = []
    with obmm.Obmm() as dev:
        for mem_id in sorted(after.region_ids() - before.region_ids()):
            leaked.append(_remove_region(dev, mem_id))
    iomem = ""
    if after.iomem != before.iomem:
        iomem = "; /proc/iomem changed:\n" + iomem_diff(before.iomem, after.iomem)
    pytest.fail(
        f"test leaked OBMM state: regions {leaked or 'none'}; "
        f"pool used {before.pool_used:#x} -> {after.pool_used:#x}{iomem}"
    )


#: The driver module as the testbed installs it (either driver is named obmm, as on UB hosts).
MODULE = "obmm"
MODULE_KO = Path("/opt/obmm-testbed/kmod") / f"{MODULE}.ko"
MODULE_PARAMS = Path("/sys/module") / MODULE / "parameters"


def module_loaded() -> bool:
    return (Path("/sys/module") / MODULE).is_dir()


#: The fabric parameters the testbed loads the module with (obmm.testbed.provision.insmod_command),
#: those the module declares: a reload needs them (ubc_dev among them) to come back as it was.
MODULE_RELOAD_PARAMS = ("node_id", "nr_nodes", "nodes", "pool_base", "pool_size", "ubc_dev")


def module_reload_args() -> list[str]:
    """NAME=VALUE of each of MODULE_RELOAD_PARAMS the loaded module declares."""
    return [
        f"{p}={(MODULE_PARAMS / p).read_text().strip()}"
        for p in MODULE_RELOAD_PARAMS
        if (MODULE_PARAMS / p).is_file()
    ]


def unload_bound() -> float:
    """rmmod of the idle module returns within this, whatever the suite did before: the
    fuzzer's bound (obmm.fuzz.target.Module), one copy."""
    return target.Module.unload_bound()


@pytest.fixture(scope="session", autouse=True)
def module_unloads_promptly() -> Iterator[None]:
    yield
    if os.environ.get("OBMM_TARGET") == "hardware" or not MODULE_KO.is_file():
        return
    if not EMU_SYSFS.is_dir() or not module_loaded() or snapshot().region_ids():
        return  # not the emulator loaded by the testbed, or a leak the leak check has reported
    args = module_reload_args()
    t0 = time.monotonic()
    done = subprocess.run(["rmmod", MODULE], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    subprocess.run(["insmod", str(MODULE_KO), *args], check=False)
    assert done.returncode == 0, f"rmmod {MODULE} after the suite: {done.stderr.strip()}"
    assert took < unload_bound(), f"rmmod {MODULE} after the suite took {took:.1f} s"
    assert module_loaded(), f"insmod {MODULE_KO} {' '.join(args)} after the suite failed"
    print(f"rmmod {MODULE} after the suite: {took:.2f} s")


@pytest.fixture(scope="module")
def fault_injection() -> Iterator[faults.FaultInjection]:
    """failslab / fail_page_alloc (a kernel with CONFIG_FAULT_INJECTION), else a skip."""
    fi = faults.FaultInjection.detect()
    if fi is None:
        pytest.skip(faults.why_absent())
    try:
        yield fi
    finally:
        fi.close()


@pytest.fixture(scope="session")
def fabric() -> Fabric:
    fab = load_fabric()
    if fab is None:
        pytest.skip("no /sys/kernel/obmm_emu or /sys/kernel/ub_compat: not the testbed fabric")
    return fab


@pytest.fixture
def dev() -> Iterator[obmm.Obmm]:
    if not DEV_OBMM.exists():
        pytest.skip("no /dev/obmm")
    with obmm.Obmm() as handle:
        yield handle


@contextlib.contextmanager
def exported(dev: obmm.Obmm, size: int = SZ_2M, **kw: object) -> Iterator[obmm.Export]:
    """An export that is withdrawn at the end, whatever the test did."""
    exp = dev.export(size, **kw)  # type: ignore[arg-type]
    try:
        yield exp
    finally:
        gc.collect()
        dev.unexport(exp.mem_id)


@contextlib.contextmanager
def imported(
    dev: obmm.Obmm, fabric: Fabric, exp: obmm.Export, **kw: object
) -> Iterator[obmm.Import]:
    """A loopback import of `exp`, unimported at the end."""
    imp = fabric.import_loopback(dev, exp, **kw)
    try:
        yield imp
    finally:
        gc.collect()
        dev.unimport(imp.mem_id)


@pytest.fixture
def export() -> Callable[..., contextlib.AbstractContextManager[obmm.Export]]:
    return exported


def expect_errno(err: int, func: Callable[..., object], *args: object, **kw: object) -> None:
    """Call `func` and assert it fails with exactly `err` (an OSError / ObmmError)."""
    with pytest.raises(OSError) as info:
        func(*args, **kw)
    got = info.value.errno
    assert got == err, (
        f"expected {errno.errorcode.get(err)}, got {errno.errorcode.get(got or 0, got)}: "
        f"{info.value}"
    )


@dataclass(frozen=True)
class ChildResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def signal(self) -> int:
        return -self.returncode if self.returncode < 0 else 0


def run_in_child(code: str, timeout: float = 60.0) -> ChildResult:
    """Run Python `code` in a fresh interpreter (for accesses that may kill it)."""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )
    return ChildResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def child() -> Callable[..., ChildResult]:
    return run_in_child


FREE_HUGEPAGES = Path("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")


def _quarantine_s() -> float:
    try:
        return read_int(Path("/sys/module/obmm/parameters/quarantine_ms")) / 1000
    except (OSError, ValueError):
        return 0.0


@pytest.fixture
def hugepages() -> Iterator[int]:
    """At least two free 2 MiB hugetlbfs pages for the duration of the test."""
    old = read_int(NR_HUGEPAGES)
    NR_HUGEPAGES.write_text(str(old + 2))
    free = read_int(FREE_HUGEPAGES)
    # Pages an earlier EXPORT_PID pinned come back when their quarantine ends.
    deadline = time.monotonic() + _quarantine_s() + 2.0
    while free < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        free = read_int(FREE_HUGEPAGES)
    if free < 1:
        NR_HUGEPAGES.write_text(str(old))
        pytest.skip("no free 2 MiB hugetlbfs page")
    yield free
    NR_HUGEPAGES.write_text(str(old))


def buffer_address(buf: mmap.mmap) -> int:
    """Virtual address of a Python mmap object."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def aligned_anonymous(size: int, align: int = SZ_2M) -> tuple[mmap.mmap, int]:
    """Anonymous private memory with an `align`-aligned, touched range of `size` bytes."""
    buf = mmap.mmap(-1, size + align, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = buffer_address(buf)
    start = (base + align - 1) & ~(align - 1)
    off = start - base
    buf[off : off + size] = b"\x01" * size
    return buf, start
