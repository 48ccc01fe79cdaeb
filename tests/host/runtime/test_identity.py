"""obmm.identity: this node's number, CNA and EID, and the handle an exporter builds from them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import obmm
from obmm import api, handle, identity
from obmm.decoder import DecoderError
from obmm.handle import Handle
from obmm.identity import EID_SIZE, NodeIdentity


def fake_node(tmp_path: Path, *, node: int = 2, cna: int = 0x11, eid: int = 0x1234) -> Path:
    """A UB host's controller as drivers/ub/ubus/sysfs.c prints it (ubc is a file)."""
    ctl = tmp_path / "devices" / "ub_bus_controller0" / "00001"
    ctl.mkdir(parents=True)
    (ctl / "ubc").write_text("0x001\n")
    (ctl / "primary_cna").write_text(f"{cna:#06x}\n")
    (ctl / "eid").write_text(f"{eid}\n")
    emu = tmp_path / "obmm_emu"
    emu.mkdir()
    (emu / "node_id").write_text(f"{node}\n")
    return tmp_path


def test_local_identity_reads_the_controller_and_the_node_number(tmp_path: Path) -> None:
    root = fake_node(tmp_path)
    me = NodeIdentity.local(sysfs=str(root / "devices"), emu_sysfs=str(root / "obmm_emu"))
    assert me == NodeIdentity(
        node_id=2, cna=0x11, eid=(0x1234).to_bytes(4, sys.byteorder) + bytes(12)
    )


def test_local_identity_without_a_controller_says_so(tmp_path: Path) -> None:
    with pytest.raises(DecoderError, match="no UB controller"):
        NodeIdentity.local(sysfs=str(tmp_path), emu_sysfs=str(tmp_path))


def test_a_handle_from_an_export_carries_the_exporter_identity() -> None:
    exp = obmm.Export(mem_id=7, tokenid=0x99, uba=(1 << 48) | 0x200000, length=4 << 20)
    me = NodeIdentity(node_id=1, cna=0x22, eid=b"\x05" + bytes(EID_SIZE - 1))
    h = Handle.from_export(exp, me)
    assert (h.mem_id, h.tokenid, h.uba, h.length) == (7, 0x99, exp.uba, 4 << 20)
    assert (h.node_id, h.scna, h.seid) == (1, 0x22, me.eid)
    assert (h.dcna, h.deid, h.pxm_numa, h.base_dist) == (0, bytes(EID_SIZE), -1, 0)
    assert Handle.decode(h.encode()) == h


def test_one_eid_size() -> None:
    assert handle.EID_SIZE is identity.EID_SIZE
    assert not hasattr(api, "EID_LEN")
