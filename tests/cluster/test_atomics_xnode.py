"""Cross-node atomics: every node does fetch-and-adds and takes a CAS spin lock on one word of
node 0's export at the same time, and no update is lost.

On hardware the UB fabric makes these atomic.  In the testbed two QEMUs share the exporter's
RAM file, and TCG makes a guest's atomic instructions host atomics only when it runs the vCPU
"parallel" (multi-threaded TCG, more than one possible CPU: obmm.testbed.vm.qemu.TCG_ACCEL); a
1-vCPU guest without that lost 5.7 of 40 million increments and left a CAS lock held.
"""

from __future__ import annotations

import json

import pytest
from xharness import ClusterHarness

A = 0
SZ_2M = 2 << 20
ADDS = 10_000_000  # per node
LOCKS = 1_000_000  # per node
RUN_TIMEOUT_S = 900.0
FIELDS = {"counter": 0, "lock": 64, "plain": 128, "arrived": 192, "left": 256}


def test_fetch_and_add_and_a_cas_lock_are_exact_across_nodes(
    xc: ClusterHarness, guest_tmp: str
) -> None:
    model = xc.run(A, "cat /sys/module/obmm/parameters/coherence 2>/dev/null", check=False)
    if model.out.strip() == "strict":
        # Each node's atomics act on its own cached copy there (docs/coherence.md): the
        # strict model has no fabric atomics, which these need.
        pytest.skip("coherence=strict: cacheable atomics across nodes need fabric atomics")
    nodes = list(range(xc.nodes))
    exe = f"{guest_tmp}/atomics"
    for node in nodes:
        xc.run(node, f"gcc -O2 -o {exe} {xc.helpers}/atomics.c", timeout=300)

    handle = xc.py_json(
        A,
        "import xnode\n"
        f"h = xnode.export_fill({SZ_2M}, 7)\n"
        f"xnode.write_local(h.mem_id, 0, bytes(4096))\n"
        "print(h.to_json())\n",
    )
    mem_ids = {A: int(handle["mem_id"])}
    try:
        for node in nodes[1:]:
            mem_ids[node] = int(
                xc.py_json(
                    node,
                    "import json, xnode\n"
                    "from obmm.handle import Handle\n"
                    f"imp = xnode.import_handle(Handle.from_json({json.dumps(handle)!r}))\n"
                    "print(json.dumps(imp.mem_id))\n",
                )
            )
        pids = {
            node: xc.spawn(
                node,
                f"exec {exe} /dev/obmm_shmdev{mem_ids[node]} {len(nodes)} {ADDS} {LOCKS} "
                f"> {guest_tmp}/atomics.json",
                name=f"atomics-{node}",
            )
            for node in nodes
        }
        times = {}
        for node in nodes:
            log = f"/tmp/atomics-{node}.log"
            script = (
                f"while kill -0 {pids[node]} 2>/dev/null; do sleep 0.5; done; "
                f"cat {guest_tmp}/atomics.json; cat {log} >&2"
            )
            res = xc.run(node, script, timeout=RUN_TIMEOUT_S)
            assert res.out.strip(), f"node{node}: atomics printed nothing: {res.err}"
            times[node] = json.loads(res.out.strip().splitlines()[-1])
        words = xc.py_json(
            A,
            "import json, xnode\n"
            f"d = xnode.read_local({mem_ids[A]}, 0, 512)\n"
            f"print(json.dumps({{k: int.from_bytes(d[o:o + 8], 'little') "
            f"for k, o in {FIELDS!r}.items()}}))\n",
        )
        print(f"{len(nodes)} nodes, {ADDS} adds and {LOCKS} lock rounds each, seconds: {times}")
        assert words == {
            "counter": len(nodes) * ADDS,
            "lock": 0,
            "plain": len(nodes) * LOCKS,
            "arrived": len(nodes),
            "left": len(nodes),
        }, words
    finally:
        for node, mem_id in mem_ids.items():
            if node != A and xc.alive(node):
                xc.py(node, f"import xnode\nxnode.unimport({mem_id})\n", check=False)
        if xc.alive(A):
            xc.py(A, f"import xnode\nxnode.unexport({mem_ids[A]})\n", check=False)
