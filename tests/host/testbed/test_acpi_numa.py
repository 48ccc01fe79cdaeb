"""The guests' own SRAT/SLIT (obmm.testbed.vm.acpi) and the `obmm-testbed numa` report parser."""

from __future__ import annotations

import struct
from pathlib import Path

from obmm.testbed.cli import numaview
from obmm.testbed.topology import Topology
from obmm.testbed.vm import acpi, qemu


def _entries(table: bytes) -> list[bytes]:
    body = table[36 + 12 :]  # header, then SRAT's reserved u32 + u64
    out = []
    while body:
        length = body[1]
        out.append(body[:length])
        body = body[length:]
    return out


def test_srat_checksum_length_and_entries() -> None:
    t = acpi.srat(cpus=2, memory_bytes=1 << 30, remote=4)
    assert t[:4] == b"SRAT"
    assert struct.unpack_from("<I", t, 4)[0] == len(t)
    assert sum(t) % 256 == 0
    entries = _entries(t)
    cpus = [e for e in entries if e[0] == 0]
    mems = [e for e in entries if e[0] == 1]
    assert [(e[2], e[3], e[4] & 1) for e in cpus] == [(0, 0, 1), (0, 1, 1)]  # domain, APIC id
    decoded = []
    for e in mems:
        _t, _l, dom, _r, blo, bhi, llo, lhi, _r2, flags, _r3 = struct.unpack("<BBIHIIIIIIQ", e)
        decoded.append((dom, blo | bhi << 32, llo | lhi << 32, flags))
    assert decoded[0] == (0, 0, 1 << 30, 1)  # all RAM, enabled, not hotpluggable
    # One enabled, hotpluggable, empty entry per remote domain: possible nodes, no memory.
    assert decoded[1:] == [(d, 0, 0, 3) for d in range(1, 5)]


def test_slit_distances() -> None:
    t = acpi.slit(remote=2)
    assert t[:4] == b"SLIT" and sum(t) % 256 == 0
    n = struct.unpack_from("<Q", t, 36)[0]
    assert n == 3
    m = list(t[44:])
    assert m == [10, 100, 100, 100, 10, 255, 100, 255, 10]


def test_remote_nodes_cover_every_peer() -> None:
    assert acpi.remote_nodes(1) == acpi.MIN_REMOTE_NODES
    assert acpi.remote_nodes(8) == 8


def test_argv_passes_the_tables_and_the_online_policy(tmp_path: Path) -> None:
    topo = Topology(nodes=2)
    launch = qemu.NodeLaunch(
        index=0,
        ssh_port=2222,
        rundir=tmp_path,
        overlay=tmp_path / "o.qcow2",
        console_log=tmp_path / "c.log",
        qmp_socket=tmp_path / "q.sock",
        pidfile=tmp_path / "p.pid",
        kernel=tmp_path / "vmlinuz",
        initrd=tmp_path / "initrd",
    )
    argv = qemu.build_argv(topo, launch)
    srat, slit = acpi.table_paths(tmp_path)
    assert f"file={srat}" in argv and f"file={slit}" in argv
    assert argv[argv.index(f"file={srat}") - 1] == "-acpitable"
    assert "-numa" not in argv  # QEMU must not emit an SRAT of its own
    assert "memhp_default_state=online_movable" in qemu.kernel_cmdline(topo, 0).split()
    acpi.write_tables(tmp_path, cpus=1, memory_bytes=1 << 30, cluster_nodes=2)
    assert srat.read_bytes()[:4] == b"SRAT" and slit.read_bytes()[:4] == b"SLIT"


REPORT = """\
nodes possible=0-4 online=0-1
node id=0 cpus=0 mem_kb=723456 free_kb=600000 dist=10,100
node id=1 cpus= mem_kb=131072 free_kb=131000 dist=100,10
borrow mem_id=2 numa_id=1 size=0x8000000 pa=0x170000000 preimport=0
declared start=0x100000000 end=0x107ffffff nid=2
"""


def test_numa_report_parse_and_render() -> None:
    rep = numaview.parse(REPORT)
    assert (rep.possible, rep.online) == ("0-4", "0-1")
    assert [(n.nid, n.cpus, n.mem_kb) for n in rep.nodes] == [(0, "0", 723456), (1, "", 131072)]
    text = numaview.render("node1", rep)
    assert "node 1: remote (no CPUs), 128 MiB (127 MiB free), cpus -, distances 100 10" in text
    assert "borrow mem_id 2: 128 MiB at 0x170000000 on NUMA node 1" in text
    assert "preimport declared 0x100000000-0x107ffffff for NUMA node 2" in text
    assert "nothing borrowed" in numaview.render(
        "node0", numaview.parse("nodes possible=0 online=0")
    )
