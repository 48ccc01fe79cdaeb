"""`obmm-testbed numa`: each node's NUMA nodes and what it borrows (NUMA_REMOTE imports).

One SSH round trip per node runs a small shell report (`REPORT`) of sysfs and procfs; `parse`
and `render` are pure, so the host tests feed them a captured report.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

# Guest side: one line per fact, "kind key=value ...", nothing but sysfs/procfs reads.
REPORT = r"""
cd /sys/devices/system/node || exit 1
echo "nodes possible=$(cat possible) online=$(cat online)"
for d in node[0-9]*; do
  echo "node id=${d#node} cpus=$(cat $d/cpulist | tr -d ' ') \
mem_kb=$(awk '/MemTotal/ {print $4}' $d/meminfo) free_kb=$(awk '/MemFree/ {print $4}' $d/meminfo) \
dist=$(cat $d/distance | tr ' ' ,)"
done
for r in /sys/devices/obmm/obmm_shmdev*; do
  [ -e "$r/import_info/numa_id" ] || continue
  echo "borrow mem_id=${r##*shmdev} numa_id=$(cat $r/import_info/numa_id) size=$(cat $r/size) \
pa=$(cat $r/import_info/pa) preimport=$(cat $r/import_info/preimport)"
done
[ -r /proc/obmm/preimport_info ] && tail -n +2 /proc/obmm/preimport_info | \
  awk '{print "declared start=0x" $1 " end=0x" $3 " nid=" $NF}'
true
"""


@dataclass
class NumaNode:
    nid: int
    cpus: str
    mem_kb: int
    free_kb: int
    distances: list[int]


@dataclass
class NodeReport:
    possible: str = ""
    online: str = ""
    nodes: list[NumaNode] = field(default_factory=list)
    borrows: list[dict[str, str]] = field(default_factory=list)
    declared: list[dict[str, str]] = field(default_factory=list)


def _fields(line: str) -> tuple[str, dict[str, str]]:
    kind, *rest = line.split()
    return kind, dict(item.split("=", 1) for item in rest if "=" in item)


def parse(text: str) -> NodeReport:
    """A guest's `REPORT` output as a NodeReport (unknown lines are ignored)."""
    rep = NodeReport()
    for line in text.splitlines():
        if not line.strip():
            continue
        kind, f = _fields(line)
        if kind == "nodes":
            rep.possible, rep.online = f.get("possible", ""), f.get("online", "")
        elif kind == "node":
            rep.nodes.append(
                NumaNode(
                    nid=int(f["id"]),
                    cpus=f.get("cpus", ""),
                    mem_kb=int(f.get("mem_kb") or 0),
                    free_kb=int(f.get("free_kb") or 0),
                    distances=[int(d) for d in f.get("dist", "").split(",") if d],
                )
            )
        elif kind == "borrow":
            rep.borrows.append(f)
        elif kind == "declared":
            rep.declared.append(f)
    return rep


def render(name: str, rep: NodeReport) -> str:
    """Human-readable lines for one cluster node."""
    out = [f"{name}: NUMA nodes possible {rep.possible or '?'}, online {rep.online or '?'}"]
    for n in sorted(rep.nodes, key=lambda n: n.nid):
        kind = "local" if n.cpus else "remote (no CPUs)"
        out.append(
            f"  node {n.nid}: {kind}, {n.mem_kb >> 10} MiB ({n.free_kb >> 10} MiB free), "
            f"cpus {n.cpus or '-'}, distances {' '.join(map(str, n.distances))}"
        )
    for b in rep.borrows:
        size = int(b.get("size", "0"), 0)
        pre = " (preimport)" if b.get("preimport") == "1" else ""
        out.append(
            f"  borrow mem_id {b.get('mem_id')}: {size >> 20} MiB at {b.get('pa')} "
            f"on NUMA node {b.get('numa_id')}{pre}"
        )
    for d in rep.declared:
        out.append(
            f"  preimport declared {d.get('start')}-{d.get('end')} for NUMA node {d.get('nid')}"
        )
    if not rep.borrows and not rep.declared:
        out.append("  nothing borrowed")
    return "\n".join(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from obmm.testbed.settings import add_arguments as add_settings
    from obmm.testbed.vm.cluster import DEFAULT_NAME

    add_settings(parser, ["name"], defaults_text={"name": DEFAULT_NAME})


def command(args: argparse.Namespace) -> int:
    from obmm.testbed.parallel import on_each
    from obmm.testbed.settings import from_args
    from obmm.testbed.vm.cluster import DEFAULT_NAME, Cluster

    cluster = Cluster.attach(from_args(args).with_defaults(name=DEFAULT_NAME).name or DEFAULT_NAME)

    def report(index: int) -> str:
        with cluster.connect(index) as conn:
            return str(conn.run(REPORT, timeout=60).out)

    outputs = on_each(list(range(len(cluster.nodes))), report)
    for index, text in enumerate(outputs):
        print(render(f"node{index}", parse(text)))
    return 0
