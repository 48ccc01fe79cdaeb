"""Borrowing across nodes: node B hot-adds node A's export as memory of a remote NUMA node.

A exports 128 MiB (one memory block) and publishes its handle; B imports it with NUMA_REMOTE,
a NUMA node with that much memory appears on B, a process on B bound to it fills it with page
markers, and A finds the markers through its own mapping of the export: the borrowed memory is
A's RAM.  UNIMPORT removes the node's memory; revocation (A unexports while B borrows) makes B
migrate the pages away and remove the memory before it acknowledges, so A's pool never hands out
memory B's kernel still uses.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from collections.abc import Callable

import pytest
from test_xnode import SZ_2M, A, B, Exporter, exporter
from xharness import ClusterHarness

pytestmark = pytest.mark.testbed_fabric

SZ_128M = 128 << 20
NUMA_REMOTE = 0x4
MARKER = b"OBMM-BORROW-"
# The process on B fills this much of the 128 MiB node (Python itself needs some of it).
FILL = 96 << 20
# Unexport -> B's scan -> migration of FILL under TCG -> removal -> ack -> A's pool free.
REVOKE_UNPLUG_S = 120.0
# How long B is watched holding revoked memory it cannot offline (quarantine_ms is 1 s).
HELD_CHECK_S = 5.0


def borrow_on(xc: ClusterHarness, exp: Exporter) -> tuple[int, int]:
    """B fetches A's handle and imports it with NUMA_REMOTE: (mem_id, numa_id)."""
    doc = xc.py_json(
        B,
        "import json, xnode\n"
        f"h = xnode.fetch({exp.host!r}, {exp.port}, {exp.name!r})\n"
        f"imp = xnode.import_handle(h, flags={NUMA_REMOTE})\n"
        "print(json.dumps([imp.mem_id, imp.numa_id]))\n",
        timeout=180,
    )
    return int(doc[0]), int(doc[1])


def node_memory(xc: ClusterHarness, node: int, nid: int) -> int:
    return int(
        xc.py_json(node, f"import json, xnode\nprint(json.dumps(xnode.node_memory({nid})))\n")
    )


def borrowed_iomem(xc: ClusterHarness, node: int) -> str:
    return xc.run(
        node, "grep -E 'System RAM \\(Remote\\)|MEMID_|IMPORT_UBMEM' /proc/iomem || true"
    ).out


def memory_blocks_of(xc: ClusterHarness, node: int, nid: int) -> str:
    return xc.run(node, f"ls -d /sys/devices/system/node/node{nid}/memory* 2>/dev/null || true").out


def pool_used(xc: ClusterHarness, node: int) -> int:
    out = xc.run(node, "cat /sys/kernel/obmm_mempool/obmm-*/used").out
    return sum(int(v, 0) for v in out.split())


def wait_pool_empty(xc: ClusterHarness, node: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    used = pool_used(xc, node)
    while used and time.monotonic() < deadline:
        time.sleep(1)
        used = pool_used(xc, node)
    return used


def fill_on_b(xc: ClusterHarness, tmp: str, command_prefix: str, extra: str, name: str) -> dict:
    ready = f"{tmp}/fill-{name}.json"
    xc.spawn(
        B,
        f"exec {command_prefix}{xc.python} -m xnode fill --size {FILL} --marker {MARKER.hex()} "
        f"{extra} --ready {ready}",
        name=f"fill-{name}",
    )
    return dict(json.loads(xc.wait_file(B, ready, timeout=300, log=f"/tmp/fill-{name}.log")))


# Open race (cause not found): in about 1 run in 3 under load, a buffer mbind()-bound to the
# node just borrowed gets 417-488 of its 24576 pages on node 0, all else on the node.  Waiting
# for the node in Mems_allowed did not stop it; moving the strays with MPOL_MF_MOVE hung; a
# cpuset rebind of the policy was ruled out.  These tests need every page on the node, so a
# filler that got strays is ended and started again; once (2026-12-01) all three tries got
# strays.  The filler reports the stray runs and the buffer's policy for the next look.
FILL_TRIES = 3


def fill_bound_on_b(xc: ClusterHarness, tmp: str, nid: int, extra: str, name: str) -> dict:
    """fill_on_b with `--mbind nid`, until every page of the buffer is on node `nid`."""
    for attempt in range(1, FILL_TRIES + 1):
        doc = fill_on_b(xc, tmp, "", f"--mbind {nid} {extra}", f"{name}{attempt}")
        strays = {n: c for n, c in doc["nodes"].items() if n != str(nid)}
        if not strays:
            doc["ready"] = f"{tmp}/fill-{name}{attempt}.json"
            return doc
        runs, policy = doc["off_node_runs"], doc["policy"]
        print(f"fill attempt {attempt}: {doc['pages']} pages by node {doc['nodes']}, runs off "
              f"node {nid}: {runs}, buffer policy {policy}; filling again")  # fmt: skip
        xc.kill(B, int(doc["pid"]), "KILL")
        time.sleep(1)
    raise AssertionError(f"{FILL_TRIES} fillers bound to node {nid} all got pages elsewhere")


def find_on_a(xc: ClusterHarness, exp: Exporter) -> list[int]:
    return list(
        xc.py_json(
            A,
            "import json, xnode\n"
            f"print(json.dumps(xnode.find_markers({exp.mem_id}, {MARKER!r})))\n",
            timeout=300,
        )
    )


def test_b_borrows_a_memory_as_a_numa_node(xc: ClusterHarness, guest_tmp: str) -> None:
    with exporter(xc, guest_tmp, size=SZ_128M, seed=21, name="borrow") as exp:
        mem_id, nid = borrow_on(xc, exp)
        try:
            assert nid > 0, nid
            assert node_memory(xc, B, nid) == SZ_128M
            assert "System RAM (Remote)" in borrowed_iomem(xc, B)
            # A process bound to the borrowed node (numactl --membind) fills it and waits...
            doc = fill_on_b(xc, guest_tmp, f"numactl --membind={nid} ", "--hold", "membind")
            pages, pid = int(doc["pages"]), int(doc["pid"])
            assert doc["nodes"] == {str(nid): pages}, doc  # every page of the buffer
            # ... its bytes are A's RAM: A finds every page marker in its own export.
            found = find_on_a(xc, exp)
            assert found == list(range(pages)), (len(found), found[:5], found[-5:])
            # The process ends (its memory is free again), then B gives the memory back.
            xc.kill(B, pid, "TERM")
            xc.run(B, f"for i in $(seq 100); do kill -0 {pid} 2>/dev/null || exit 0; "
                   "sleep 0.2; done; exit 1", timeout=60)  # fmt: skip
        finally:
            xc.py(B, f"import xnode\nxnode.unimport({mem_id})\n", timeout=300)
        assert node_memory(xc, B, nid) == 0
        assert borrowed_iomem(xc, B) == ""
        assert memory_blocks_of(xc, B, nid) == ""
    assert wait_pool_empty(xc, A, 30) == 0


def quarantined(xc: ClusterHarness, node: int) -> int:
    return int(xc.run(node, "cat /sys/kernel/obmm_emu/quarantined").out.strip(), 0)


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    return True


@pytest.mark.emulator_only
def test_revocation_unplugs_the_borrowed_memory_before_a_reuses_it(
    xc: ClusterHarness, guest_tmp: str
) -> None:
    with exporter(xc, guest_tmp, size=SZ_128M, seed=22, name="revoked") as exp:
        mem_id, nid = borrow_on(xc, exp)
        try:
            # Only the buffer is bound to the borrowed node, so the process lives on after the
            # node's memory goes; one of its pages sits in a pipe, which keeps it from moving.
            doc = fill_bound_on_b(xc, guest_tmp, nid, "--hold --pin", "held")
            pages, pid = int(doc["pages"]), int(doc["pid"])
            assert doc["nodes"] == {str(nid): pages}, doc
            xc.kill(A, exp.pid, "USR1")  # A unexports while B borrows
            xc.wait_file(A, exp.ready + ".unexported")
            # B revokes at once but cannot offline the pinned page: it keeps the memory and does
            # not acknowledge, so A's unexported memory stays quarantined (never reused).
            assert wait_until(
                lambda: str(mem_id) in xc.run(B, "cat /sys/kernel/obmm_emu/revoked").out.split(),
                30,
            )
            time.sleep(HELD_CHECK_S)
            assert node_memory(xc, B, nid) == SZ_128M
            assert quarantined(xc, A) == SZ_128M
            # The pipe lets go: B migrates the pages to its own node, removes the memory,
            # acknowledges, and A's memory comes back.
            xc.kill(B, pid, "USR2")
            xc.wait_file(B, doc["ready"] + ".unpinned")
            assert wait_until(lambda: node_memory(xc, B, nid) == 0, REVOKE_UNPLUG_S)
            assert "System RAM (Remote)" not in borrowed_iomem(xc, B)
            assert memory_blocks_of(xc, B, nid) == ""
            assert wait_until(lambda: quarantined(xc, A) == 0, REVOKE_UNPLUG_S)
            assert pool_used(xc, A) == 0
            # The process kept its data, now on B's own memory.
            xc.kill(B, pid, "USR1")
            verified = json.loads(xc.wait_file(B, doc["ready"] + ".verified"))
            assert verified["ok"] is True
            assert str(nid) not in verified["nodes"], verified
            xc.kill(B, pid, "TERM")
        finally:
            xc.py(B, f"import xnode\nxnode.unimport({mem_id})\n", timeout=300)
        assert borrowed_iomem(xc, B) == ""


def pool_total(xc: ClusterHarness, node: int) -> int:
    out = xc.run(node, "cat /sys/kernel/obmm_mempool/obmm-*/total").out
    return sum(int(v, 0) for v in out.split())


def export_unexport(xc: ClusterHarness, node: int, size: int) -> None:
    xc.py(
        node,
        f"import obmm\nwith obmm.Obmm() as dev:\n    dev.unexport(dev.export({size}).mem_id)\n",
        timeout=120,
    )


def unimport_when_unpinned(xc: ClusterHarness, node: int, mem_id: int) -> None:
    """Unimport `mem_id` on `node`, retrying for up to a minute: the pinning process was just
    told to let go and exit, and the memory cannot be unplugged while it holds a page."""
    xc.py(
        node,
        "import time, xnode\n"
        "for _ in range(60):\n"
        "    try:\n"
        f"        xnode.unimport({mem_id})\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(1)\n",
        timeout=300,
    )


@pytest.mark.emulator_only  # the emulator's acknowledgment protocol: FIDELITY.md
def test_a_borrow_stuck_on_a_pinned_page_holds_back_only_its_own_memory(
    xc: ClusterHarness, guest_tmp: str
) -> None:
    """Issue 36, finding 5.  A process on B bound to the borrowed node keeps a page of it in a
    pipe it never reads; A unexports.  B cannot unplug the borrow: that 128 MiB stays withdrawn
    for good.  A's later exports must still come back: B used to hold back its whole
    acknowledgment of A, so everything A unexported after it stayed quarantined and an EXPORT
    needing that memory ended EBUSY."""
    with exporter(xc, guest_tmp, size=SZ_128M, seed=25, name="stuck") as exp:
        mem_id, nid = borrow_on(xc, exp)
        pid = 0
        try:
            doc = fill_bound_on_b(xc, guest_tmp, nid, "--hold --pin", "stuck")
            pid = int(doc["pid"])
            xc.kill(A, exp.pid, "USR1")  # A unexports while B borrows
            xc.wait_file(A, exp.ready + ".unexported")
            assert wait_until(
                lambda: str(mem_id) in xc.run(B, "cat /sys/kernel/obmm_emu/revoked").out.split(),
                30,
            )
            time.sleep(HELD_CHECK_S)
            assert node_memory(xc, B, nid) == SZ_128M
            assert quarantined(xc, A) == SZ_128M
            # A exports and unexports other memory: it leaves quarantine as before the borrow.
            for _ in range(2):
                export_unexport(xc, A, SZ_2M)
            assert wait_until(lambda: quarantined(xc, A) == SZ_128M, 30), quarantined(xc, A)
            # All of A's pool but the stuck borrow's memory can be exported again.
            free = pool_total(xc, A) - SZ_128M - pool_used(xc, A)
            export_unexport(xc, A, free)
            assert wait_until(lambda: quarantined(xc, A) == SZ_128M, 30), quarantined(xc, A)
            assert node_memory(xc, B, nid) == SZ_128M  # still stuck
        finally:
            if pid:
                xc.kill(B, pid, "USR2")  # unpin
                xc.kill(B, pid, "TERM")
            unimport_when_unpinned(xc, B, mem_id)
        assert borrowed_iomem(xc, B) == ""
    assert wait_until(lambda: quarantined(xc, A) == 0, REVOKE_UNPLUG_S)
    assert wait_pool_empty(xc, A, 30) == 0


@pytest.mark.emulator_only
def test_stalled_exporter_is_dead_and_the_borrow_is_unplugged(
    xc: ClusterHarness, guest_tmp: str
) -> None:
    """A's QEMU stops: B declares A dead (8 x 250 ms), revokes the borrow and moves the pages
    off it (A's RAM file is still mapped, its bytes still valid) before it drops the memory."""
    pid_of = getattr(xc.node(A), "qemu_pid", None)
    if not isinstance(pid_of, int):
        pytest.skip("needs a QEMU node 0 whose process can be stopped")
    with exporter(xc, guest_tmp, size=SZ_128M, seed=23, name="stalled") as exp:
        mem_id, nid = borrow_on(xc, exp)
        try:
            doc = fill_bound_on_b(xc, guest_tmp, nid, "--hold", "stalled")
            pid = int(doc["pid"])
            os.kill(pid_of, signal.SIGSTOP)
            try:
                assert wait_until(lambda: node_memory(xc, B, nid) == 0, REVOKE_UNPLUG_S)
                assert str(mem_id) in xc.run(B, "cat /sys/kernel/obmm_emu/revoked").out.split()
                assert "System RAM (Remote)" not in borrowed_iomem(xc, B)
                xc.kill(B, pid, "USR1")
                verified = json.loads(xc.wait_file(B, doc["ready"] + ".verified"))
                assert verified["ok"] is True
                assert str(nid) not in verified["nodes"], verified
                xc.kill(B, pid, "TERM")
            finally:
                os.kill(pid_of, signal.SIGCONT)
        finally:
            xc.py(B, f"import xnode\nxnode.unimport({mem_id})\n", timeout=300)
        assert borrowed_iomem(xc, B) == ""


# A block export of B's own pool, for a loopback borrow on B: [mem_id, window address, tokenid].
OWN_BLOCK_EXPORT = f"""
import json, obmm
from pathlib import Path
emu = Path("/sys/kernel/obmm_emu")
me = int((emu / "node_id").read_text(), 0)
base = int((emu / "windows" / str(me) / "base").read_text(), 0)
with obmm.Obmm() as dev:
    exp = dev.export({SZ_128M})
    pa = dev.query_pa_by_memid(exp.mem_id)
    with obmm.ShmDev(exp.mem_id) as shm, shm.mmap({SZ_2M}) as m:
        m.write(0, MARK)
print(json.dumps([exp.mem_id, base + pa, exp.tokenid]))
"""


# On B, after B's block export at window address ADDR was withdrawn: exports until that memory
# comes back (other free memory is taken first), filled with poison; their mem_ids.
REUSE_OWN = """
import json
from pathlib import Path
from obmm.fuzz import cross
emu = Path("/sys/kernel/obmm_emu")
me = int((emu / "node_id").read_text(), 0)
base = int((emu / "windows" / str(me) / "base").read_text(), 0)
got = cross.reuse(ADDR - base, SIZE, 0x5eed, 60)
print(json.dumps([got["reused"], got["mem_ids"]]))
"""


def sleeps_in(xc: ClusterHarness, node: int, pid: int, function: str) -> bool:
    """Whether `pid` sleeps (state S or D) with `function` on its kernel stack."""
    out = xc.run(
        node, f"cat /proc/{pid}/stack; echo; cut -d' ' -f3 /proc/{pid}/stat", check=False
    ).out.split()
    return function in " ".join(out) and out[-1:] in (["S"], ["D"])


@pytest.mark.emulator_only  # the emulator's revocation (emulated UMMU): FIDELITY.md
def test_a_borrow_that_waited_for_the_hot_plug_lock_checks_its_export_again(
    xc: ClusterHarness, guest_tmp: str
) -> None:
    """Issue 24, items 2 and 9.  B's UNIMPORT of a borrow with a pinned page holds the hot-plug
    lock (offlining retries until a signal).  Meanwhile a NUMA_REMOTE IMPORT on B of B's own
    block export passes every check and waits for that lock:

    * handled signals do not end the wait (the real IMPORT blocks in lock_device_hotplug());
      it returned EINTR, with no log line;
    * the export is withdrawn, the import revoked, the withdrawal acknowledged, the quarantine
      ends and a new export gets the memory.  Once the lock frees, the IMPORT must see that
      (EACCES): nothing re-checked after the lock, and it put the new export's memory online
      as a NUMA node of B."""
    with exporter(xc, guest_tmp, size=SZ_128M, seed=24, name="lockholder") as exp:
        mem_id, nid = borrow_on(xc, exp)
        pids: list[int] = []
        own: list[int] = []
        waited: dict = {}
        try:
            doc = fill_bound_on_b(xc, guest_tmp, nid, "--hold --pin", "lockholder")
            pids.append(int(doc["pid"]))
            out_u = f"{guest_tmp}/blocking-unimport.json"
            unimporter = xc.spawn_xnode(
                B, ["blocking", "unimport", str(mem_id), "--out", out_u], name="block-unimport"
            )
            pids.append(unimporter)
            xc.wait_file(B, out_u + ".started")
            time.sleep(3)
            assert not xc.run(B, f"test -e {out_u}", check=False).ok, "UNIMPORT did not wait"
            e_id, addr, token = xc.py_json(B, f"MARK = b'first!!!'\n{OWN_BLOCK_EXPORT}")
            own.append(e_id)
            if addr % SZ_128M:
                pytest.skip("B's pool gave no block-aligned range")
            out_w = f"{guest_tmp}/blocking-import.json"
            waiter = xc.spawn_xnode(
                B,
                ["blocking", "import-numa", hex(addr), hex(SZ_128M), hex(token), "--out", out_w],
                name="block-import",
            )
            pids.append(waiter)
            xc.wait_file(B, out_w + ".started")
            # asleep in IMPORT: the hot-plug lock is the only wait there
            assert wait_until(lambda: sleeps_in(xc, B, waiter, "obmm_import"), 60), xc.run(
                B, f"cat /proc/{waiter}/stack /proc/{waiter}/stat", check=False
            ).out
            # item 9: handled signals do not end the wait
            for _ in range(3):
                xc.kill(B, waiter, "USR2")
                time.sleep(0.5)
            assert not xc.run(B, f"test -e {out_w}", check=False).ok, (
                "a handled signal ended the IMPORT's wait: "
                + xc.run(B, f"cat {out_w}", check=False).out
            )
            # item 2: the export goes, and its memory is given to a new export
            xc.py(B, f"import obmm\nwith obmm.Obmm() as dev:\n    dev.unexport({e_id})\n")
            own.remove(e_id)
            reused, ids = xc.py_json(B, f"ADDR, SIZE = {addr}, {SZ_128M}\n{REUSE_OWN}", timeout=180)
            own.extend(ids)
            assert reused, f"B's withdrawn block did not come back to a new export: {ids}"
            # the lock frees: the UNIMPORT ends (EINTR), the IMPORT goes on
            xc.kill(B, unimporter, "USR1")
            assert json.loads(xc.wait_file(B, out_u, timeout=120))["errno"] == errno.EINTR
            waited = json.loads(xc.wait_file(B, out_w, timeout=300))
            assert waited["signals"] >= 1  # delivered once the call returned (coalesced)
            assert waited["errno"] == errno.EACCES, waited  # its export is gone
            remote = [ln for ln in borrowed_iomem(xc, B).splitlines() if "System RAM" in ln]
            assert not any(ln.strip().startswith(f"{addr:x}-") for ln in remote), remote
        finally:
            for pid in pids[1:]:
                xc.kill(B, pid, "KILL")
            if pids:
                xc.kill(B, pids[0], "USR2")  # unpin
                xc.kill(B, pids[0], "TERM")
            if waited.get("mem_id"):
                xc.py(B, f"import xnode\nxnode.unimport({waited['mem_id']})\n", timeout=300)
            unimport_when_unpinned(xc, B, mem_id)
            for e in own:
                xc.py(B, f"import obmm\nwith obmm.Obmm() as dev:\n    dev.unexport({e})\n")
        assert borrowed_iomem(xc, B) == ""
    assert wait_pool_empty(xc, B, 60) == 0
