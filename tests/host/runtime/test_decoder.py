"""obmm.decoder: emulator windows from (fake) sysfs, site tables, site commands."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

import obmm.decoder as decoder_mod
from obmm.decoder import (
    CommandDecoder,
    DecoderError,
    EmulatorDecoder,
    TableDecoder,
    decoder_from_spec,
    emulator_uba_split,
)
from obmm.identity import local_cna, local_eid, local_node_id

GIB = 1 << 30


def _emu_sysfs(root: Path, windows: dict[int, tuple[int, int]]) -> Path:
    for node, (base, size) in windows.items():
        w = root / "windows" / str(node)
        w.mkdir(parents=True)
        (w / "node").write_text(f"{node}\n")
        (w / "base").write_text(f"{base:#x}\n")
        (w / "size").write_text(f"{size:#x}\n")
    return root


def _uba(node: int, pa: int) -> int:
    return (1 << 48) | (node << 40) | pa


def test_emulator_resolves_into_the_exporters_window(tmp_path: Path) -> None:
    sysfs = _emu_sysfs(tmp_path, {0: (0x8000_0000, GIB), 1: (0xC000_0000, GIB)})
    dec = EmulatorDecoder(str(sysfs))
    assert dec.resolve(1, _uba(1, 0x3000_0000), 4 << 20) == 0xC000_0000 + 0x3000_0000
    assert dec.resolve(0, _uba(0, 0x3020_0000), 2 << 20) == 0x8000_0000 + 0x3020_0000


def test_emulator_refuses_out_of_window_wrong_node_and_foreign_uba(tmp_path: Path) -> None:
    dec = EmulatorDecoder(str(_emu_sysfs(tmp_path, {0: (0x8000_0000, GIB)})))
    with pytest.raises(DecoderError, match="outside its 0x40000000-byte window"):
        dec.resolve(0, _uba(0, GIB - (2 << 20)), 4 << 20)
    with pytest.raises(DecoderError, match="belongs to node 0, not node 1"):
        dec.resolve(1, _uba(0, 0), 2 << 20)
    with pytest.raises(DecoderError, match="no decoder window onto node 2"):
        dec.resolve(2, _uba(2, 0), 2 << 20)
    with pytest.raises(DecoderError, match="is not an obmm_emu UBA"):
        dec.resolve(0, 0x1234, 2 << 20)


def test_emulator_without_module_says_so(tmp_path: Path) -> None:
    with pytest.raises(DecoderError, match=r"neither the emulated obmm\.ko nor ub_compat"):
        EmulatorDecoder(str(tmp_path / "none")).resolve(0, _uba(0, 0), 2 << 20)


def test_a_scattered_uba_is_refused_with_its_reason() -> None:
    # ub_compat's UMMU marks an export whose memory is not one physical run (bit 49).
    with pytest.raises(DecoderError, match="not one physical run"):
        emulator_uba_split(_uba(1, 0x3000_0000) | 1 << 49)


def test_the_fabric_is_found_where_either_driver_publishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu, compat = tmp_path / "obmm_emu", tmp_path / "ub_compat"
    monkeypatch.setattr(decoder_mod, "FABRIC_SYSFS", (str(emu), str(compat)))
    compat.mkdir()
    assert decoder_mod.fabric_sysfs() == str(compat)
    emu.mkdir()
    assert decoder_mod.fabric_sysfs() == str(emu)


def test_uba_split() -> None:
    assert emulator_uba_split(_uba(7, 0x12_3456_7000)) == (7, 0x12_3456_7000)


def test_table_decoder(tmp_path: Path) -> None:
    table = tmp_path / "decoder.json"
    window = {"node": 3, "base": "0x2000000000", "size": "0x40000000"}
    window["remote_base"] = "0x100000000"
    table.write_text(json.dumps({"windows": [window]}))
    dec = decoder_from_spec(f"file:{table}")
    assert isinstance(dec, TableDecoder)
    assert dec.resolve(3, 0x1_0020_0000, 2 << 20) == 0x20_0020_0000
    with pytest.raises(DecoderError, match=r"no window in .* covers node 3"):
        dec.resolve(3, 0x2_0000_0000, 2 << 20)
    table.write_text("{not json")
    with pytest.raises(DecoderError, match="bad decoder table"):
        dec.resolve(3, 0x1_0000_0000, 2 << 20)


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "resolve.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_command_decoder_gets_the_request_in_its_environment(tmp_path: Path) -> None:
    script = _script(tmp_path, 'echo "$OBMM_EXPORTER_NODE $OBMM_UBA $OBMM_LENGTH" > "$0.req"\n'
                                "echo 0x4000200000\n")  # fmt: skip
    dec = decoder_from_spec(f"cmd:{script}")
    assert isinstance(dec, CommandDecoder)
    assert dec.resolve(2, 0xABC00000, 4 << 20) == 0x40_0020_0000
    assert Path(f"{script}.req").read_text() == f"2 0xabc00000 {4 << 20}\n"


def test_command_decoder_failures(tmp_path: Path) -> None:
    with pytest.raises(DecoderError, match="exited 3: nope"):
        CommandDecoder(str(_script(tmp_path, "echo nope >&2; exit 3\n"))).resolve(0, 0, 1)
    with pytest.raises(DecoderError, match="printed 'hello', not an address"):
        CommandDecoder(str(_script(tmp_path, "echo hello\n"))).resolve(0, 0, 1)
    with pytest.raises(DecoderError, match="failed"):
        CommandDecoder(str(tmp_path / "missing")).resolve(0, 0, 1)


def test_unknown_spec() -> None:
    with pytest.raises(DecoderError, match="unknown decoder 'magic'"):
        decoder_from_spec("magic")


def fake_controller(root: Path, index: int, name: str) -> Path:
    """A controller's directory as a UB host's bus prints it (``ubc`` is a file in it)."""
    ctl = root / f"ub_bus_controller{index}" / name
    ctl.mkdir(parents=True)
    (ctl / "ubc").write_text("0x001\n")
    return ctl


def test_local_cna_reads_libobmm_path(tmp_path: Path) -> None:
    ctl = fake_controller(tmp_path, 1, "00002")
    (ctl / "primary_cna").write_text("0x0012\n")
    first = fake_controller(tmp_path, 0, "00001")
    (first / "primary_cna").write_text("0x0011\n")
    assert local_cna(str(tmp_path)) == 0x11  # the lowest controller, as libobmm takes it
    with pytest.raises(DecoderError, match="no UB controller"):
        local_cna(str(tmp_path / "empty"))


def test_local_eid_is_the_controller_eid_in_the_first_four_bytes(tmp_path: Path) -> None:
    ubc = fake_controller(tmp_path, 0, "00001")
    (ubc / "primary_cna").write_text("0x0011\n")
    (ubc / "eid").write_text("4660\n")  # %u, as the bus prints it
    assert local_eid(str(tmp_path)) == (0x1234).to_bytes(4, sys.byteorder) + bytes(12)
    (ubc / "eid").write_text("0\n")  # libobmm rejects an all-zero EID
    with pytest.raises(DecoderError, match="not a non-zero 32-bit"):
        local_eid(str(tmp_path))


def test_local_node_id_prefers_obmm_emu_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OBMM_NODE_ID", "3")
    assert local_node_id(str(tmp_path / "absent")) == 3
    (tmp_path / "node_id").write_text("1\n")
    assert local_node_id(str(tmp_path)) == 1
    monkeypatch.delenv("OBMM_NODE_ID")
    with pytest.raises(DecoderError, match=r"\$OBMM_NODE_ID is unset: set it"):
        local_node_id(str(tmp_path / "absent"))
    monkeypatch.setenv("OBMM_NODE_ID", "two")
    with pytest.raises(DecoderError, match="OBMM_NODE_ID is 'two'"):
        local_node_id(str(tmp_path / "absent"))
