"""NUMA_REMOTE imports ("borrow"): the window range becomes memory of a remote NUMA node.

Reference: docs/obmm-driver.md sections 3.4 and 4.5 rows 15-17 (obmm_import.c,
`setup_remote_numa()`: `add_memory_remote()` < 0 -> EPERM) and section 4.4 (UNIMPORT:
`remove_memory_remote()`, whose errno is returned; openeuler-mirror/kernel
drivers/base/numa_remote.c@6c696d0: it is offline_and_remove_memory()'s).  On one node these are
loopback borrows: the node hot-adds its own export through its own window.
"""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from obmm_fixtures import (
    SZ_2M,
    UNPLUG_S,
    Fabric,
    expect_errno,
    pool_total,
    pool_used,
    quarantined,
    wait_for,
)

import obmm
from obmm import abi
from obmm.tools import logscan

pytest_plugins = ["obmm_fixtures"]

if TYPE_CHECKING:
    from conftest import KernelLog  # the guest suite's conftest, beside this file

pytestmark = pytest.mark.testbed_fabric

NUMA = abi.OBMM_IMPORT_FLAG_NUMA_REMOTE
NODE_SYSFS = Path("/sys/devices/system/node")
MEMORY_SYSFS = Path("/sys/devices/system/memory")
EMU_SYSFS = Path("/sys/kernel/obmm_emu")
MARKER = b"OBMM-BORROW-GUEST"


def possible_nodes() -> set[int]:
    return _node_list((NODE_SYSFS / "possible").read_text())


def _node_list(text: str) -> set[int]:
    nodes: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        nodes.update(range(int(lo), int(hi or lo) + 1))
    return nodes


def populated_nodes() -> set[int]:
    """Nodes with CPUs or memory.  On x86 the online ones; arm64 onlines its spare nodes at
    boot, memory-less (obmm.testbed.vm.numa), so online alone does not tell there."""
    return _node_list((NODE_SYSFS / "has_cpu").read_text()) | _node_list(
        (NODE_SYSFS / "has_memory").read_text()
    )


def remote_nodes() -> set[int]:
    """Possible nodes without CPUs or memory: what borrowing hot-adds to."""
    return possible_nodes() - populated_nodes()


def node_memory(nid: int) -> int:
    path = NODE_SYSFS / f"node{nid}" / "meminfo"
    if not path.exists():
        return 0
    for line in path.read_text().splitlines():
        if "MemTotal:" in line:
            return int(line.split()[-2]) * 1024
    return 0


def memory_blocks() -> set[str]:
    return {p.name for p in MEMORY_SYSFS.glob("memory[0-9]*")}


def iomem() -> str:
    return Path("/proc/iomem").read_text()


def revoked_ids() -> list[str]:
    return (EMU_SYSFS / "revoked").read_text().split()


def borrow(dev: obmm.Obmm, fabric: Fabric, exp: obmm.Export, **kw: object) -> obmm.Import:
    return fabric.import_loopback(dev, exp, flags=NUMA, **kw)


# The process that uses borrowed memory: it binds a buffer to the node, writes a marker at every
# page start, then answers commands on stdin: "verify" (markers intact? pages per node),
# "unpin" (let go of the page held in a pipe), "exit".
HOLDER = r"""
import ctypes, json, mmap, os, platform, sys
size, node = int(sys.argv[1]), int(sys.argv[2])
marker, pin = bytes.fromhex(sys.argv[3]), sys.argv[4] == "1"
PAGE = 4096
libc = ctypes.CDLL(None, use_errno=True)
buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
mask = ctypes.c_ulong(1 << node)
nr = {"x86_64": 237, "aarch64": 235}[platform.machine()]
if libc.syscall(nr, ctypes.c_void_p(addr), ctypes.c_ulong(size), 2, ctypes.byref(mask),
                ctypes.c_ulong(node + 2), 0):
    sys.exit("mbind: " + os.strerror(ctypes.get_errno()))
def mark(i):
    return marker + i.to_bytes(8, "little")
for i in range(size // PAGE):
    buf[i * PAGE:i * PAGE + len(marker) + 8] = mark(i)
pipe = []
if pin:
    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    pipe = list(os.pipe())
    if libc.vmsplice(pipe[1], ctypes.byref(IoVec(addr, PAGE)), 1, 0) != PAGE:
        sys.exit("vmsplice failed")
def nodes():
    for line in open("/proc/self/numa_maps"):
        f = line.split()
        if int(f[0], 16) == addr:
            return {x[1:].split("=")[0]: int(x.split("=")[1])
                    for x in f if x[0] == "N" and "=" in x}
    return {}
print(json.dumps({"nodes": nodes()}), flush=True)
for cmd in sys.stdin:
    cmd = cmd.strip()
    if cmd == "verify":
        ok = all(buf[i * PAGE:i * PAGE + len(marker) + 8] == mark(i) for i in range(size // PAGE))
        print(json.dumps({"ok": ok, "nodes": nodes()}), flush=True)
    elif cmd == "unpin":
        for fd in pipe:
            os.close(fd)
        pipe = []
        print(json.dumps({"unpinned": True}), flush=True)
    else:
        break
"""


class Holder:
    def __init__(self, size: int, node: int, *, pin: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(size), str(node), MARKER.hex(), "1" if pin else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.first = self._reply()

    def _reply(self) -> dict[str, object]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"holder died: {self.proc.wait()}"
        return dict(json.loads(line))

    def ask(self, cmd: str) -> dict[str, object]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


# ---- success: a node with the memory appears, UNIMPORT takes it away ----


def test_numa_remote_import_hot_adds_a_remote_node(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export, block: int
) -> None:
    free = remote_nodes()
    assert free, "the guest has no spare remote NUMA node"
    blocks = memory_blocks()
    imp = borrow(dev, fabric, blk_export)
    try:
        assert imp.numa_id == min(free)  # the first unused remote node
        assert imp.numa_id in populated_nodes()
        assert node_memory(imp.numa_id) == block
        assert list((NODE_SYSFS / f"node{imp.numa_id}").glob("memory[0-9]*"))
        assert not (NODE_SYSFS / f"node{imp.numa_id}" / "cpulist").read_text().strip()
        # Auto-onlined movable: no kernel allocation can keep UNIMPORT from removing it.
        for mem in (NODE_SYSFS / f"node{imp.numa_id}").glob("memory[0-9]*"):
            assert (mem / "state").read_text().strip() == "online"
            assert (mem / "valid_zones").read_text().strip() == "Movable"
        rng = f"{imp.addr:x}-{imp.addr + block - 1:x}"
        lines = [ln.strip() for ln in iomem().splitlines()]
        assert f"{rng} : DIRECT_IMPORT_UBMEM" in lines
        assert f"{rng} : System RAM (Remote)" in lines
        assert f"{rng} : MEMID_{imp.mem_id}" in lines
        info = Path(f"/sys/devices/obmm/obmm_shmdev{imp.mem_id}")
        assert (info / "allow_mmap").read_text().strip() == "0"
        assert (info / "import_info" / "numa_id").read_text().strip() == str(imp.numa_id)
        assert (info / "import_info" / "preimport").read_text().strip() == "0"
    finally:
        dev.unimport(imp.mem_id)
    assert imp.numa_id not in populated_nodes()
    assert node_memory(imp.numa_id) == 0
    assert memory_blocks() == blocks
    assert "System RAM (Remote)" not in iomem()


def test_borrowed_pages_are_the_exports_memory(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export
) -> None:
    imp = borrow(dev, fabric, blk_export)
    try:
        size = 8 * SZ_2M
        holder = Holder(size, imp.numa_id)
        try:
            nodes = holder.first["nodes"]
            assert nodes.get(str(imp.numa_id), 0) >= size // 4096, nodes  # type: ignore[attr-defined]
        finally:
            holder.close()
        # The exporter's own mapping holds what the process wrote into the borrowed node.
        with obmm.ShmDev(blk_export.mem_id) as shm, shm.mmap() as m:
            data = m.read(0, m.length)
        found = {
            int.from_bytes(data[p + len(MARKER) : p + len(MARKER) + 8], "little")
            for p in range(0, len(data), 4096)
            if data[p : p + len(MARKER)] == MARKER
        }
        assert found == set(range(size // 4096))
    finally:
        dev.unimport(imp.mem_id)


def test_explicit_remote_numa_id_is_used(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export
) -> None:
    nid = max(remote_nodes())
    imp = borrow(dev, fabric, blk_export, numa_id=nid)
    try:
        assert imp.numa_id == nid
    finally:
        dev.unimport(imp.mem_id)


@pytest.mark.parametrize("base_dist", [0, 11, 255])
def test_base_dist_is_accepted_distance_stays_the_boot_one(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export, base_dist: int
) -> None:
    """Emulator: x86 Linux has no runtime distance update; the SLIT's 100 stays."""
    imp = borrow(dev, fabric, blk_export, base_dist=base_dist)
    try:
        distances = (NODE_SYSFS / f"node{imp.numa_id}" / "distance").read_text().split()
        assert distances[0] == "100"
    finally:
        dev.unimport(imp.mem_id)


# ---- refused hot-adds: EPERM, nothing left behind ----


def _expect_eperm_leaves_nothing(dev: obmm.Obmm, addr: int, length: int, **kw: object) -> None:
    blocks, lines, populated = memory_blocks(), iomem(), populated_nodes()
    expect_errno(errno.EPERM, dev.import_, addr, length, flags=NUMA, **kw)
    assert memory_blocks() == blocks
    assert iomem() == lines
    assert populated_nodes() == populated


@pytest.mark.parametrize("where", ["length", "addr"])
def test_range_not_memory_block_aligned_is_eperm(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export, block: int, where: str
) -> None:
    addr = fabric.loopback_addr(dev, blk_export.mem_id)
    if where == "length":
        _expect_eperm_leaves_nothing(
            dev, addr, block - SZ_2M, scna=fabric.cna, tokenid=blk_export.tokenid
        )
    else:
        _expect_eperm_leaves_nothing(
            dev, addr + SZ_2M, block - SZ_2M, scna=fabric.cna, tokenid=blk_export.tokenid
        )


@pytest.mark.parametrize("which", ["local", "impossible", "negative"])
def test_numa_id_that_is_not_a_remote_node_is_eperm(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export, block: int, which: str
) -> None:
    nid = {"local": 0, "impossible": max(possible_nodes()) + 1, "negative": -5}[which]
    addr = fabric.loopback_addr(dev, blk_export.mem_id)
    _expect_eperm_leaves_nothing(
        dev, addr, block, scna=fabric.cna, tokenid=blk_export.tokenid, numa_id=nid
    )


@pytest.mark.real_driver_differs(
    "ub_compat refuses a declaration over own-window memory no export maps (its guard "
    "against reaching the node's kernel RAM); a host's decoder accepts it"
)
def test_no_unused_remote_node_is_eperm(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export, block: int
) -> None:
    """Preimport declarations reserve their nodes: once every remote node is reserved, a
    NUMA_REMOTE import that asks for any node finds none (find_unused_remote_node())."""
    addr = fabric.loopback_addr(dev, blk_export.mem_id)
    # Declared ranges need not be exported: other blocks of the own window.
    spare = [a for a in range(fabric.window_base(), fabric.window_base() + fabric.window_size(),
                              block) if a != addr]  # fmt: skip
    nodes = len(remote_nodes())
    assert len(spare) > nodes
    declared = []
    try:
        for pa in spare[:nodes]:
            dev.declare_preimport(pa, block, scna=fabric.cna)
            declared.append(pa)
        expect_errno(errno.EPERM, dev.declare_preimport, spare[nodes], block, scna=fabric.cna)
        _expect_eperm_leaves_nothing(dev, addr, block, scna=fabric.cna, tokenid=blk_export.tokenid)
    finally:
        for pa in declared:
            dev.undeclare_preimport(pa, block)


def test_a_borrow_does_not_check_the_tokenid(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export, block: int
) -> None:
    """The real IMPORT never reads tokenid: 0 borrows the live export as its own does (the
    real checks first: EPERM for less than a block)."""
    addr = fabric.loopback_addr(dev, blk_export.mem_id)
    _expect_eperm_leaves_nothing(dev, addr, SZ_2M, scna=fabric.cna, tokenid=0)
    imp = dev.import_(addr, block, scna=fabric.cna, flags=NUMA, tokenid=0)
    try:
        assert imp.numa_id >= 1
    finally:
        dev.unimport(imp.mem_id)


def test_borrowed_range_overlap_is_eexist(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export, block: int
) -> None:
    imp = borrow(dev, fabric, blk_export)
    try:
        expect_errno(errno.EEXIST, dev.import_, imp.addr, SZ_2M, scna=fabric.cna,
                     tokenid=blk_export.tokenid)  # fmt: skip
        expect_errno(errno.EEXIST, fabric.import_loopback, dev, blk_export, flags=NUMA)
    finally:
        dev.unimport(imp.mem_id)


def test_borrowed_region_cannot_be_mmapped(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export
) -> None:
    imp = borrow(dev, fabric, blk_export)
    try:
        with obmm.ShmDev(imp.mem_id) as shm:
            expect_errno(errno.EPERM, shm.mmap, SZ_2M)
    finally:
        dev.unimport(imp.mem_id)


# ---- UNIMPORT while the memory is in use ----


def test_unimport_migrates_pages_in_use(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export
) -> None:
    """offline_and_remove_memory() moves movable pages to other nodes: the process keeps its
    data, now on node 0, and the node's memory is gone."""
    imp = borrow(dev, fabric, blk_export)
    holder = Holder(4 * SZ_2M, imp.numa_id)
    try:
        dev.unimport(imp.mem_id)
        after = holder.ask("verify")
        assert after["ok"] is True
        assert str(imp.numa_id) not in after["nodes"]  # type: ignore[operator]
        assert node_memory(imp.numa_id) == 0
    finally:
        holder.close()


def test_unimport_with_a_pinned_page_waits_until_a_signal_eintr(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export, block: int
) -> None:
    """A page held by a pipe cannot migrate: memory offlining retries until a signal arrives,
    and UNIMPORT fails with its EINTR; the import stays whole and is removable once the page
    is let go."""
    imp = borrow(dev, fabric, blk_export)
    holder = Holder(4 * SZ_2M, imp.numa_id, pin=True)
    old = signal.signal(signal.SIGALRM, lambda signum, frame: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 2.0)
        t0 = time.monotonic()
        expect_errno(errno.EINTR, dev.unimport, imp.mem_id)
        assert time.monotonic() - t0 >= 1.5
        assert node_memory(imp.numa_id) == block
        assert f"MEMID_{imp.mem_id}" in iomem()
        assert Path(f"/dev/obmm_shmdev{imp.mem_id}").exists()
        assert holder.ask("unpin") == {"unpinned": True}
        dev.unimport(imp.mem_id)
        assert holder.ask("verify")["ok"] is True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        holder.close()  # its pipe goes with it
        if Path(f"/dev/obmm_shmdev{imp.mem_id}").exists():
            dev.unimport(imp.mem_id)


# ---- revocation of a borrowed range ----


@pytest.mark.emulator_only
def test_unexport_while_borrowed_unplugs_before_the_memory_is_reused(
    dev: obmm.Obmm, fabric: Fabric, block: int
) -> None:
    """Loopback: UNEXPORT revokes the borrow at once; the memory stays quarantined until the
    revoked range is offlined and removed (a pinned page holds that up), then comes back."""
    wait_for(lambda: quarantined() == 0, UNPLUG_S)
    if pool_total() - pool_used() < block:
        pytest.skip("the pool has no free memory block")
    exp = dev.export(block)
    if fabric.loopback_addr(dev, exp.mem_id) % block:
        dev.unexport(exp.mem_id)
        pytest.skip("the pool gave no block-aligned range")
    imp = borrow(dev, fabric, exp)
    holder = Holder(4 * SZ_2M, imp.numa_id, pin=True)
    try:
        dev.unexport(exp.mem_id)
        assert str(imp.mem_id) in revoked_ids()
        time.sleep(3)  # > quarantine_ms: only the borrow holds the memory now
        assert node_memory(imp.numa_id) == block
        assert quarantined() >= block
        holder.ask("unpin")
        assert wait_for(lambda: "System RAM (Remote)" not in iomem(), UNPLUG_S)
        assert node_memory(imp.numa_id) == 0
        assert f"MEMID_{imp.mem_id}" in iomem()  # the region lives on, revoked
        assert wait_for(lambda: quarantined() == 0, UNPLUG_S)
        verified = holder.ask("verify")
        assert verified["ok"] is True
    finally:
        holder.close()
        dev.unimport(imp.mem_id)
    assert f"MEMID_{imp.mem_id}" not in iomem()


# A DECLARE_PREIMPORT and UNDECLARE_PREIMPORT, each in a process of its own: the revocation
# test below must see them end (or not) without hanging itself in one.
DECLARE_UNDECLARE = r"""
import obmm, sys, time
pa, length, cna = (int(a, 0) for a in sys.argv[1:4])
t0 = time.monotonic()
with obmm.Obmm() as dev:
    dev.declare_preimport(pa, length, scna=cna)
    dev.undeclare_preimport(pa, length)
print(round(time.monotonic() - t0, 3))
"""
# How long a DECLARE may wait for the hot-plug lock: one bounded try of the unplug thread (1 s)
# and TCG scheduling.  Before the bound it waited for as long as the page stayed pinned.
LOCK_WAIT_S = 30.0


@pytest.mark.emulator_only  # the emulator's revocation (emulated UMMU): FIDELITY.md
def test_a_revoked_borrow_that_cannot_go_keeps_no_lock_for_long(
    dev: obmm.Obmm, fabric: Fabric, block: int
) -> None:
    """A revoked borrow with a pinned page: offlining retries until a signal, which a kernel
    thread never gets.  The unplug work used to retry in a kworker holding the borrow lock and
    the kernel's hot-plug locks for as long as the pin lasted, and DECLARE, UNDECLARE and an
    IMPORT's rollback slept uninterruptibly behind it (a hung task after 120 s).  Now each try
    is bounded and the locks are free between tries: those calls finish while the page stays
    pinned, and the memory stays borrowed and quarantined until the page is let go."""
    wait_for(lambda: quarantined() == 0, UNPLUG_S)
    if pool_total() - pool_used() < block:
        pytest.skip("the pool has no free memory block")
    exp = dev.export(block)
    if fabric.loopback_addr(dev, exp.mem_id) % block:
        dev.unexport(exp.mem_id)
        pytest.skip("the pool gave no block-aligned range")
    imp = borrow(dev, fabric, exp)
    holder = Holder(4 * SZ_2M, imp.numa_id, pin=True)
    # a declaration's range: the block above the window base, away from the borrowed one
    pa = fabric.window_base() + block
    waited: list[float] = []
    blocked = False
    try:
        dev.unexport(exp.mem_id)
        assert str(imp.mem_id) in revoked_ids()
        time.sleep(2)  # the unplug thread is at it
        for _ in range(3):
            proc = subprocess.Popen(
                [sys.executable, "-c", DECLARE_UNDECLARE, hex(pa), hex(block), hex(fabric.cna)],
                stdout=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + LOCK_WAIT_S
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if proc.poll() is None:
                blocked = True
                break
            out, _ = proc.communicate()
            assert proc.returncode == 0, out
            waited.append(float(out.strip()))
        if not blocked:
            # still held: borrowed, and the exporter's memory quarantined
            assert node_memory(imp.numa_id) == block
            assert quarantined() >= block
    finally:
        holder.ask("unpin")
        if blocked:
            proc.wait(timeout=UNPLUG_S)  # the lock frees with the pin
        holder.close()
    assert not blocked, f"DECLARE+UNDECLARE still waiting after {LOCK_WAIT_S} s"
    print(f"DECLARE+UNDECLARE while a revoked borrow is pinned: {waited} s")
    assert wait_for(lambda: "System RAM (Remote)" not in iomem(), UNPLUG_S)
    assert wait_for(lambda: quarantined() == 0, UNPLUG_S)
    dev.unimport(imp.mem_id)


def _iomem_lines() -> list[str]:
    return [ln.rstrip() for ln in iomem().splitlines()]


@pytest.mark.emulator_only  # the emulator's borrow path and its hot-plug lock (FIDELITY.md)
def test_the_memid_resource_moves_under_the_hot_plug_lock(
    dev: obmm.Obmm, fabric: Fabric, block: int, kernel_log: KernelLog
) -> None:
    """MEMID_<id> sits under the borrowed "System RAM (Remote)" while the memory is there,
    under the import's DIRECT_IMPORT_UBMEM once a revocation unplugged it, and is gone with
    UNIMPORT.  Every move (and the walk that finds the System RAM resource) happens under the
    borrow lock: sibling imports of a preimport range change the same children list, and the
    walk takes no resource lock (a WARN says so where lockdep does not)."""
    wait_for(lambda: quarantined() == 0, UNPLUG_S)
    if pool_total() - pool_used() < block:
        pytest.skip("the pool has no free memory block")
    exp = dev.export(block)
    if fabric.loopback_addr(dev, exp.mem_id) % block:
        dev.unexport(exp.mem_id)
        pytest.skip("the pool gave no block-aligned range")
    kernel_log.take()
    imp = borrow(dev, fabric, exp)
    try:
        rng = f"{imp.addr:x}-{imp.addr + block - 1:x}"
        lines = _iomem_lines()
        ubmem = next(i for i, ln in enumerate(lines) if ln.endswith(f"{rng} : DIRECT_IMPORT_UBMEM"))
        depth = len(lines[ubmem]) - len(lines[ubmem].lstrip())
        assert lines[ubmem + 1].strip() == f"{rng} : System RAM (Remote)"
        assert lines[ubmem + 2].strip() == f"{rng} : MEMID_{imp.mem_id}"
        assert len(lines[ubmem + 2]) - len(lines[ubmem + 2].lstrip()) > depth + 2
        dev.unexport(exp.mem_id)
        assert wait_for(lambda: "System RAM (Remote)" not in iomem(), UNPLUG_S)
        lines = _iomem_lines()
        ubmem = next(i for i, ln in enumerate(lines) if ln.endswith(f"{rng} : DIRECT_IMPORT_UBMEM"))
        assert lines[ubmem + 1].strip() == f"{rng} : MEMID_{imp.mem_id}"
    finally:
        dev.unimport(imp.mem_id)
    assert f"MEMID_{imp.mem_id}" not in iomem()
    log = kernel_log.take()
    assert not logscan.scan(log, allow=()), log


@pytest.mark.emulator_only
@pytest.mark.parametrize("pmd", [False, True], ids=["page", "pmd"])
def test_a_borrow_of_an_export_its_exporter_maps_is_eacces_and_leaves_nothing(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export, pmd: bool
) -> None:
    """Issue 36, finding 4: while the exporter maps its export its processes read and write
    that memory; a borrow of it would put this kernel's pages there.  The emulated UMMU refuses
    it (EACCES, nothing added); once the last mapping is gone the borrow is made.  The real
    driver cannot see the exporter's mappings and hot-adds (FIDELITY.md)."""
    blocks, ram = memory_blocks(), iomem().count("System RAM (Remote)")
    with obmm.ShmDev(blk_export.mem_id) as shm, shm.mmap(SZ_2M, pmd=pmd) as m:
        m.write(0, b"MINE")
        expect_errno(errno.EACCES, borrow, dev, fabric, blk_export)
        assert memory_blocks() == blocks
        assert iomem().count("System RAM (Remote)") == ram
    imp = borrow(dev, fabric, blk_export)
    dev.unimport(imp.mem_id)


def test_failed_numa_import_leaves_the_range_free(
    dev: obmm.Obmm, fabric: Fabric, blk_export: obmm.Export, block: int
) -> None:
    addr = fabric.loopback_addr(dev, blk_export.mem_id)
    expect_errno(errno.EPERM, dev.import_, addr, SZ_2M, scna=fabric.cna, flags=NUMA,
                 tokenid=blk_export.tokenid)  # fmt: skip
    imp = borrow(dev, fabric, blk_export)
    dev.unimport(imp.mem_id)


@pytest.mark.emulator_only
def test_a_block_export_right_after_a_quarantine_is_still_borrowable(
    dev: obmm.Obmm, fabric: Fabric, block: int
) -> None:
    """Right after a freed block leaves quarantine the zero worker clears it granule by
    granule.  A block-sized EXPORT then waits for the granule being cleared instead of taking
    an unaligned run (which no NUMA_REMOTE import can use): here the second block is broken by
    a small export at its top, so an unaligned run across both would fit."""
    wait_for(lambda: quarantined() == 0, UNPLUG_S)
    if pool_total() - pool_used() < 2 * block:
        pytest.skip("the pool has no two free memory blocks")
    first = dev.export(block)
    below = dev.export(block - SZ_2M)
    top = dev.export(SZ_2M)
    live = [below, first, top]
    try:
        if fabric.loopback_addr(dev, first.mem_id) % block:
            pytest.skip("the pool gave no block-aligned range")
        for exp in (below, first):
            dev.unexport(exp.mem_id)
            live.remove(exp)
        assert wait_for(lambda: quarantined() == 0, UNPLUG_S)
        again = dev.export(block)  # while the worker clears the first block
        try:
            addr = fabric.loopback_addr(dev, again.mem_id)
            assert addr % block == 0, f"block export placed at {addr:#x}: not borrowable"
            imp = borrow(dev, fabric, again)
            dev.unimport(imp.mem_id)
        finally:
            dev.unexport(again.mem_id)
    finally:
        for exp in live:
            dev.unexport(exp.mem_id)
