"""Snapshot keys, files and verification (no VM): what makes a snapshot fit, and what refuses it."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import pytest

from obmm.testbed.topology import Topology
from obmm.testbed.vm import snapshot

QEMU_ID = {"path": "/usr/bin/qemu-system-x86_64", "version": "QEMU 7.2", "size": 1, "mtime_ns": 2}


def _key(**over: object) -> snapshot.Key:
    args: dict[str, object] = {
        "image_fingerprint": "img-a",
        "qemu": QEMU_ID,
        "topology": Topology(nodes=2),
        "init": "fast",
        "accel": "tcg",
        "argvs": [["qemu", "-m", "1024M"], ["qemu", "-m", "1024M"]],
    }
    args.update(over)
    return snapshot.Key.make(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"image_fingerprint": "img-b"},
        {"qemu": {**QEMU_ID, "version": "QEMU 8.2"}},
        {"qemu": {**QEMU_ID, "mtime_ns": 3}},
        {"topology": Topology(nodes=3)},
        {"topology": Topology(nodes=2, pool_mib=128)},
        {"init": "systemd"},
        {"accel": "kvm"},
        {"argvs": [["qemu", "-m", "1024M"], ["qemu", "-m", "1024M", "-extra"]]},
    ],
)
def test_every_key_part_changes_the_digest(change: dict[str, object]) -> None:
    assert _key(**change).digest != _key().digest


def test_description_and_run_specific_paths_and_ports_do_not_change_the_key() -> None:
    a = Topology(nodes=2, description="one")
    b = Topology(nodes=2, description="two")
    assert _key(topology=a).digest == _key(topology=b).digest
    argv = ["-qmp", "unix:/dev/shm/r1/node0.qmp", "hostfwd=tcp:127.0.0.1:4444-:22", "/l1/c.log"]
    other = ["-qmp", "unix:/dev/shm/r2/node0.qmp", "hostfwd=tcp:127.0.0.1:5555-:22", "/l2/c.log"]
    assert snapshot.blank_argv(argv, Path("/dev/shm/r1"), Path("/l1"), 4444) == snapshot.blank_argv(
        other, Path("/dev/shm/r2"), Path("/l2"), 5555
    )


def test_sparse_copy_keeps_holes_and_data_and_its_checksum_sees_both(tmp_path: Path) -> None:
    src = tmp_path / "ram"
    with src.open("wb") as f:
        f.truncate(64 << 20)
        f.seek(8 << 20)
        f.write(b"A" * 4096)
        f.seek(40 << 20)
        f.write(os.urandom(8192))
    size, crc = snapshot.copy_sparse(src, tmp_path / "copy")
    copy = tmp_path / "copy"
    assert size == copy.stat().st_size == 64 << 20
    assert copy.read_bytes() == src.read_bytes()
    assert copy.stat().st_blocks * 512 < 1 << 20  # the holes stayed holes
    # Same bytes at another offset: another checksum.
    moved = tmp_path / "moved"
    with moved.open("wb") as f:
        f.truncate(64 << 20)
        f.seek(9 << 20)
        f.write(b"A" * 4096)
        f.seek(40 << 20)
        f.write(src.read_bytes()[40 << 20 : (40 << 20) + 8192])
    assert snapshot.copy_sparse(moved, tmp_path / "c2")[1] != crc


def _fake_snapshot(root: Path, key: snapshot.Key) -> snapshot.Snapshot:
    d = root / key.digest
    d.mkdir(parents=True)
    files = {}
    for name in ("control", "node0.ram", "node0.qcow2", "node1.ram", "node1.qcow2"):
        (d / name).write_bytes(name.encode() * 100)
        files[name] = {
            "size": (d / name).stat().st_size,
            "crc32": snapshot.copy_sparse(d / name, root.parent / "scratch")[1],
        }
    for name in ("node0.state", "node1.state", snapshot.BARS_FILE):
        data = name.encode() * 50
        (d / name).write_bytes(data)
        files[name] = {"size": len(data), "crc32": zlib.crc32(data)}
    (d / snapshot.MANIFEST).write_text(json.dumps({"key": key.parts, "files": files}))
    return snapshot.Snapshot.open(d)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OBMM_TESTBED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "snapshots"


def test_a_good_snapshot_is_found_verified_and_restored(cache: Path, tmp_path: Path) -> None:
    key = _key()
    _fake_snapshot(cache, key)
    snap = snapshot.find(key)
    assert snap is not None
    snap.verify_states()
    rundir = tmp_path / "run"
    rundir.mkdir()
    snap.restore_into(rundir)
    assert (rundir / "node1.ram").read_bytes() == b"node1.ram" * 100
    assert snapshot.find(_key(init="systemd")) is None  # another shape: never used


def test_truncated_or_corrupt_files_are_refused_with_the_file_named(
    cache: Path, tmp_path: Path
) -> None:
    key = _key()
    snap = _fake_snapshot(cache, key)
    state = snap.directory / "node1.state"
    state.write_bytes(state.read_bytes()[:-10])
    with pytest.raises(snapshot.SnapshotError, match=r"node1.state is \d+ bytes.*truncated"):
        snap.verify_states()
    state.write_bytes(b"X" * snap.manifest["files"]["node1.state"]["size"])
    with pytest.raises(snapshot.SnapshotError, match=r"node1\.state does not match its checksum"):
        snap.verify_states()
    ram = snap.directory / "node0.ram"
    ram.write_bytes(b"Y" * ram.stat().st_size)
    (tmp_path / "run").mkdir()
    with pytest.raises(snapshot.SnapshotError, match=r"node0\.ram does not match its checksum"):
        snap.restore_into(tmp_path / "run")


def test_a_manifest_for_another_key_is_refused(cache: Path) -> None:
    key = _key()
    snap = _fake_snapshot(cache, key)
    manifest = json.loads((snap.directory / snapshot.MANIFEST).read_text())
    manifest["key"]["init"] = "systemd"
    (snap.directory / snapshot.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(snapshot.SnapshotError, match="another key"):
        snapshot.find(key)


def test_list_and_clear(cache: Path) -> None:
    _fake_snapshot(cache, _key())
    _fake_snapshot(cache, _key(init="systemd"))
    (cache / ".tmp-leftover-1").mkdir()
    assert len(snapshot.list_all()) == 2
    assert snapshot.clear() == 2
    assert list(cache.iterdir()) == []


def test_bars_are_mapped_where_the_saved_guest_had_them() -> None:
    bars = [
        {"bus": 0, "slot": 0x10, "function": 0, "bar": 2, "address": 0x1_4000_0000, "is64": True}
    ]
    cmds = snapshot.map_bars_commands(bars)
    assert cmds == [
        "o /w 0xcf8 0x80008018",
        "o /w 0xcfc 0x40000000",
        "o /w 0xcf8 0x8000801c",
        "o /w 0xcfc 0x1",
        "o /w 0xcf8 0x80008004",
        "o /h 0xcfc 0x2",
    ]


def test_restored_guest_gets_the_host_clock_and_randomness() -> None:
    cmd = snapshot.guest_fixup_command(1700000000.25, b"\x00\xff")
    assert cmd == "date -s @1700000000.250 >/dev/null && printf '\\x00\\xff' > /dev/urandom"


def test_a_refused_restore_says_qemus_own_error_not_the_monitor_disconnect() -> None:
    qmp = "QMP: StateError: QMPClient is disconnecting. Call disconnect() to return to IDLE state."
    log0 = (
        "$ qemu-system-aarch64 -machine virt -incoming defer\n"
        "qemu-system-aarch64: Mismatched GPAs for block 0000:00:10.0/ivshmem.bar2\n"
        "qemu-system-aarch64: error while loading state for instance 0x0 of device 'ram'\n"
        "qemu-system-aarch64: load of migration failed: Invalid argument\n"
    )
    why = snapshot.refusal(qmp, [(0, 1, log0), (1, 0, "$ qemu-system-aarch64 -incoming defer\n")])
    assert why == (
        "node0: QEMU exited (1): "
        "qemu-system-aarch64: Mismatched GPAs for block 0000:00:10.0/ivshmem.bar2 | "
        "qemu-system-aarch64: error while loading state for instance 0x0 of device 'ram' | "
        "qemu-system-aarch64: load of migration failed: Invalid argument"
    )
    # No node said anything (or none exited): the monitor's error is all there is.
    assert snapshot.refusal(qmp, []) == qmp
    assert snapshot.refusal(qmp, [(1, 0, "$ qemu-system-aarch64\n")]) == qmp


MTREE_VIRT = """\
FlatView #2
 AS "memory", root: system
 Root memory region: system
  0000000040000000-000000007fffffff (prio 0, ram): ram
  0000004010000000-000000401fffffff (prio 0, i/o): pcie-mmcfg-mmio
  0000008000000000-00000080001fffff (prio 1, ram): ctl
"""


def test_on_a_machine_with_only_ecam_the_bars_are_mapped_through_its_config_window() -> None:
    # aarch64 `virt` has no 0xCF8 ports (a port write maps nothing, so loading the stream
    # fails QEMU's x-ignore-shared address check): the same writes go to ECAM, bus<<20 |
    # slot<<15 | function<<12 | register above the window's base, found in the memory map.
    base = snapshot.ecam_base(MTREE_VIRT)
    assert base == 0x40_1000_0000
    bars = [
        {"bus": 0, "slot": 0x10, "function": 0, "bar": 0, "address": 0x1008_1100, "is64": False},
        {"bus": 0, "slot": 0x10, "function": 0, "bar": 2, "address": 0x80_0000_0000, "is64": True},
    ]
    assert snapshot.map_bars_ecam_commands(bars, base) == [
        "writel 0x4010080010 0x10081100",
        "writew 0x4010080004 0x2",
        "writel 0x4010080018 0x0",
        "writel 0x401008001c 0x80",
        "writew 0x4010080004 0x2",
    ]
    with pytest.raises(snapshot.SnapshotError, match="pcie-mmcfg-mmio"):
        snapshot.ecam_base("FlatView #0\n  0000000000000000-ffffffffffffffff (prio 0, i/o): io\n")


def test_the_restoring_qemu_gets_a_quiet_qtest_socket(tmp_path: Path) -> None:
    assert snapshot.qtest_argv(tmp_path / "node0.qtest") == [
        "-qtest",
        f"unix:{tmp_path}/node0.qtest,server=on,wait=off",
        "-qtest-log",
        "none",
    ]


def test_qtest_writes_are_sent_in_order_and_a_refused_one_is_named(tmp_path: Path) -> None:
    import asyncio

    sock = tmp_path / "q.sock"
    seen: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := (await reader.readline()).decode().strip():
            seen.append(line)
            writer.write(b"OK\n" if line.startswith("writel") else b"FAIL Unknown command\n")
            await writer.drain()
        writer.close()

    async def exchange(cmds: list[str]) -> None:
        server = await asyncio.start_unix_server(serve, path=str(sock))
        async with server:
            await snapshot._qtest(sock, cmds, "node1")

    asyncio.run(exchange(["writel 0x10 0x1", "writel 0x14 0x2"]))
    assert seen == ["writel 0x10 0x1", "writel 0x14 0x2"]
    seen.clear()
    with pytest.raises(snapshot.SnapshotError, match=r"node1: qtest writeq 0x10 0x1: FAIL"):
        asyncio.run(exchange(["writeq 0x10 0x1", "writel 0x14 0x2"]))
    assert seen == ["writeq 0x10 0x1"]
