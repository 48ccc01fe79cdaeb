"""The spare, remote NUMA nodes each node boots with, in the form its architecture reads.

Borrowing (NUMA_REMOTE imports) hot-adds a window range as memory of a CPU-less, memory-less
NUMA node, and Linux hot-adds only to a node that was possible at boot.  Which nodes are
possible comes from firmware tables, so the testbed writes its own:

* x86_64 (:data:`obmm.testbed.arch.X86_64`, numa_tables "acpi"): an SRAT and a SLIT passed
  with ``-acpitable`` (:mod:`obmm.testbed.vm.acpi`).
* arm64 (numa_tables "dtb"): QEMU's `virt` machine booted without firmware has no ACPI; the
  kernel reads NUMA from the device tree (drivers/of/of_numa.c).  The testbed has QEMU dump the
  machine's own tree (``-machine ...,dumpdtb=``) with RAM and CPUs in node 0 (``-numa``),
  adds one zero-length ``device_type = "memory"`` node per remote node (of_numa marks a node
  parsed for every memory node with a ``numa-node-id``, and arch_numa makes the parsed nodes
  possible; the zero length leaves the physical map alone, as the SRAT's zero-length entries
  do) and a ``numa-distance-map-v1`` with the SLIT's distances, and boots with ``-dtb``.  QEMU
  drops the tree's ``/memory@...`` nodes and writes its own (so the remote nodes are named
  otherwise), and sets ``/chosen`` (command line, initrd) as for its own tree.

Unlike x86's, arm64's remote nodes are online from boot (memory-less); the kernel onlines
every parsed node there.  Pure but for :func:`write_tables`, which runs QEMU and dtc.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from obmm.testbed.arch import Arch
from obmm.testbed.errors import TestbedError
from obmm.testbed.topology import Topology
from obmm.testbed.vm import acpi

# Bumped when the tree's additions change: the file name carries it, and so the snapshot key.
DTB_VERSION = 1
#: Root node names of the remote nodes (not /memory@: QEMU drops those of a given tree).
REMOTE_NODE = "obmm-remote-numa"


class NumaTablesError(TestbedError, RuntimeError):
    """The NUMA tables of a node could not be made."""


def dtb_path(rundir: Path) -> Path:
    return rundir / f"numa-v{DTB_VERSION}.dtb"


def machine_arg(arch: Arch) -> str:
    """-machine: on x86 the RAM is the machine's memory backend; on arm64 it is node 0's
    (``-numa ...,memdev=ram``), which puts ``numa-node-id`` on the RAM and the CPUs."""
    if arch.numa_tables == "acpi":
        return f"{arch.qemu_machine},memory-backend=ram"
    return arch.qemu_machine


def _max_cpus(smp: str) -> int:
    """The possible CPUs of a -smp value (``2`` or ``1,maxcpus=2``)."""
    head, *opts = smp.split(",")
    for opt in opts:
        key, _, value = opt.partition("=")
        if key == "maxcpus":
            return int(value)
    return int(head)


def qemu_args(arch: Arch, rundir: Path, smp: str) -> list[str]:
    """The options that give a node its NUMA layout (after the files are written)."""
    if arch.numa_tables == "acpi":
        return [a for t in acpi.table_paths(rundir) for a in ("-acpitable", f"file={t}")]
    cpus = _max_cpus(smp)
    return [
        "-numa",
        f"node,nodeid=0,cpus=0-{cpus - 1},memdev=ram",
        "-dtb",
        str(dtb_path(rundir)),
    ]


def distance(i: int, j: int) -> int:
    """The SLIT's distance between NUMA nodes i and j (node 0 local, the rest remote)."""
    if i == j:
        return acpi.LOCAL_DISTANCE
    if i == 0 or j == 0:
        return acpi.REMOTE_TO_LOCAL_DISTANCE
    return acpi.REMOTE_TO_REMOTE_DISTANCE


def dts_additions(remote: int) -> str:
    """Device-tree source (a second root block, merged by dtc) declaring remote nodes
    1..remote and the distances of nodes 0..remote."""
    lines = ["/ {"]
    for nid in range(1, remote + 1):
        lines += [
            f"\t{REMOTE_NODE}@{nid} {{",
            '\t\tdevice_type = "memory";',
            # Zero length: a possible node, no memory (root #address-cells/#size-cells 2/2).
            f"\t\treg = <0x0 {nid:#x} 0x0 0x0>;",
            f"\t\tnuma-node-id = <{nid:#x}>;",
            "\t};",
        ]
    matrix = ", ".join(
        f"<{i} {j} {distance(i, j)}>" for i in range(remote + 1) for j in range(remote + 1)
    )
    lines += [
        "\tdistance-map {",
        '\t\tcompatible = "numa-distance-map-v1";',
        f"\t\tdistance-matrix = {matrix};",
        "\t};",
        "};",
    ]
    return "\n".join(lines) + "\n"


def patch_dts(dts: str, remote: int) -> str:
    """QEMU's dumped tree with the remote nodes added and its random seeds taken out (the
    same tree at every boot; the kernel boots with nokaslr)."""
    kept = [ln for ln in dts.splitlines() if not ln.strip().startswith(("kaslr-seed", "rng-seed"))]
    return "\n".join(kept) + "\n" + dts_additions(remote)


def _run(argv: Sequence[str], what: str, stdin: str | None = None) -> str:
    try:
        proc = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NumaTablesError(f"{what}: {exc}") from exc
    if proc.returncode != 0:
        raise NumaTablesError(
            f"{what}: `{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()[-400:]}"
        )
    return proc.stdout


def write_tables(
    rundir: Path,
    arch: Arch,
    topology: Topology,
    *,
    dump_argv: Callable[[Path], Sequence[str]],
) -> None:
    """Write the NUMA tables of a node of this shape into `rundir` (idempotent).

    `dump_argv(path)` is the QEMU command that dumps the node's machine tree to `path`
    (:func:`obmm.testbed.vm.qemu.dtb_dump_argv`); used for "dtb" architectures only."""
    if arch.numa_tables == "acpi":
        acpi.write_tables(
            rundir,
            cpus=topology.cpus,
            memory_bytes=topology.memory_mib << 20,
            cluster_nodes=topology.nodes,
        )
        return
    out = dtb_path(rundir)
    raw = rundir / "machine.dtb"
    _run(dump_argv(raw), "dump the machine's device tree")
    dts = _run(["dtc", "-q", "-I", "dtb", "-O", "dts", str(raw)], "decompile the device tree")
    patched = patch_dts(dts, acpi.remote_nodes(topology.nodes))
    tmp = out.with_suffix(".tmp")
    _run(["dtc", "-q", "-I", "dts", "-O", "dtb", "-o", str(tmp), "-"], "compile it", patched)
    tmp.replace(out)
    raw.unlink()
