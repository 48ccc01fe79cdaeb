"""The emulator's shared control region: header, this node's table entry, export records.

Layout: kmod/obmm_emu/obmm_emu_ctl.h.  The region is ivshmem-plain BAR 2 at PCI 00:0f.0,
read here through sysfs resource2 like any other node (or the host) would read it.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from obmm_fixtures import SZ_2M, Fabric, expect_errno, exported

import obmm
from obmm import abi

pytest_plugins = ["obmm_fixtures"]
pytestmark = pytest.mark.emulator_only

CTL_RESOURCE = Path("/sys/bus/pci/devices/0000:00:0f.0/resource2")
MAGIC = int.from_bytes(b"OBMMEMU1", "little")
HEADER = struct.Struct("<QIIIIIII")
NODE = struct.Struct("<IIII16sQQQQQI")
RECORD = struct.Struct("<IIQQQQQQII16sI")
REC_LIVE = 1
REC_FREE = 0
NODE_ONLINE = 1


class Control:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        (
            self.magic,
            self.version,
            self.max_nodes,
            self.node_off,
            self.node_stride,
            self.rec_off,
            self.rec_size,
            self.rec_per_node,
        ) = HEADER.unpack_from(buf, 0)

    def _stable(self, off: int, layout: struct.Struct) -> tuple[object, ...]:
        """Seqcount read: retry until the entry is not being written and did not change."""
        for _ in range(1000):
            seq = struct.unpack_from("<I", self.buf, off)[0]
            if seq & 1:
                continue
            fields = layout.unpack_from(self.buf, off)
            if struct.unpack_from("<I", self.buf, off)[0] == seq:
                return fields
        raise AssertionError(f"entry at {off:#x} never stable")

    def node(self, node: int) -> tuple[object, ...]:
        return self._stable(self.node_off + node * self.node_stride, NODE)

    def records(self, node: int) -> Iterator[tuple[object, ...]]:
        base = self.rec_off + node * self.rec_per_node * self.rec_size
        for slot in range(self.rec_per_node):
            yield self._stable(base + slot * self.rec_size, RECORD)

    def live_record(self, node: int, mem_id: int) -> tuple[object, ...] | None:
        for rec in self.records(node):
            if rec[1] == REC_LIVE and rec[4] == mem_id:
                return rec
        return None


@pytest.fixture
def ctl() -> Iterator[Control]:
    if not CTL_RESOURCE.exists():
        pytest.skip("no control region device 00:0f.0")
    fd = os.open(CTL_RESOURCE, os.O_RDONLY | os.O_SYNC)
    try:
        buf = mmap.mmap(fd, SZ_2M, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    yield Control(buf)
    buf.close()


def test_header(ctl: Control) -> None:
    assert ctl.magic == MAGIC
    assert ctl.version == 1
    assert ctl.max_nodes == 8
    assert (ctl.node_off, ctl.node_stride) == (0x1000, 0x100)
    assert (ctl.rec_off, ctl.rec_size, ctl.rec_per_node) == (0x10000, 0x80, 1024)


def test_own_node_entry(ctl: Control, fabric: Fabric) -> None:
    entry = ctl.node(fabric.node_id)
    _seq, state, node_id, cna, eid, _hb, boot_id, pool_base, pool_size, ram_size, hb_ms = entry
    assert state == NODE_ONLINE
    assert node_id == fabric.node_id
    assert cna == fabric.cna
    assert eid == fabric.seid
    assert boot_id != 0
    assert (pool_base, pool_size) == (fabric.pool_base, fabric.pool_size)
    assert ram_size == fabric.window_size()
    assert hb_ms > 0


def test_heartbeat_advances(ctl: Control, fabric: Fabric) -> None:
    first = ctl.node(fabric.node_id)
    period = int(first[10]) / 1000.0  # type: ignore[call-overload]
    deadline = time.monotonic() + 5 * period + 2
    while time.monotonic() < deadline:
        if ctl.node(fabric.node_id)[5] != first[5]:
            return
        time.sleep(period / 2)
    raise AssertionError("heartbeat did not advance")


def test_export_record_published_and_withdrawn(
    ctl: Control, fabric: Fabric, dev: obmm.Obmm
) -> None:
    deid = bytes(range(16))
    with exported(dev, 2 * SZ_2M, deid=deid) as exp:
        rec = ctl.live_record(fabric.node_id, exp.mem_id)
        assert rec is not None, "no live record for the export"
        _seq, _state, gen, boot_id, mem_id, uba, pa, size, tokenid, flags, rdeid, _pxm = rec
        assert boot_id == ctl.node(fabric.node_id)[6]
        assert (mem_id, uba, size, tokenid) == (exp.mem_id, exp.uba, exp.length, exp.tokenid)
        assert pa == dev.query_pa_by_memid(exp.mem_id)
        assert flags & 0xFFFF == abi.OBMM_EXPORT_FLAG_ALLOW_MMAP
        assert rdeid == deid
        gen_live = gen
    assert ctl.live_record(fabric.node_id, exp.mem_id) is None
    withdrawn = [r for r in ctl.records(fabric.node_id) if r[4] == exp.mem_id]
    assert any(r[1] == REC_FREE and r[2] == gen_live + 1 for r in withdrawn)


def test_one_record_per_live_export(ctl: Control, fabric: Fabric, dev: obmm.Obmm) -> None:
    with exported(dev) as a, exported(dev) as b:
        live = {r[4] for r in ctl.records(fabric.node_id) if r[1] == REC_LIVE}
        assert {a.mem_id, b.mem_id} <= live


SZ_128M = 128 << 20


def test_forged_own_record_reaches_nothing(ctl: Control, fabric: Fabric, dev: obmm.Obmm) -> None:
    """A LIVE record another node forges in this node's own slots (its boot id is public)
    covering this node's kernel RAM gives a loopback import no access: this node answers its
    own lookups from what it exported, not from the shared bytes (issue 36, finding 7)."""
    node = fabric.node_id
    boot_id = ctl.node(node)[6]
    slot = ctl.rec_per_node - 1
    off = ctl.rec_off + (node * ctl.rec_per_node + slot) * ctl.rec_size
    forged = RECORD.pack(
        2, REC_LIVE, 1 << 40, boot_id, 0x7FFF0000, 0, SZ_128M, SZ_2M, 0, 0, bytes(16), 0
    )
    fd = os.open(CTL_RESOURCE, os.O_RDWR | os.O_SYNC)
    try:
        wbuf = mmap.mmap(fd, SZ_2M, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    saved = bytes(wbuf[off : off + RECORD.size])
    assert struct.unpack_from("<I", saved, 4)[0] == REC_FREE, "the last slot is in use"
    try:
        wbuf[off : off + RECORD.size] = forged
        revoked = Path("/sys/kernel/obmm_emu/revoked")
        imp = dev.import_(fabric.window_base() + SZ_128M, SZ_2M, scna=fabric.cna)
        try:
            assert imp.mem_id in {int(x) for x in revoked.read_text().split()}, (
                "a forged record of this node made its import live"
            )
            with obmm.ShmDev(imp.mem_id) as shm:
                expect_errno(errno.ENXIO, shm.mmap, SZ_2M)
        finally:
            dev.unimport(imp.mem_id)
    finally:
        wbuf[off : off + RECORD.size] = saved
        wbuf.close()
