"""The fuzzer's cross-node mode: an importer's operations while its exporter unexports, stops
(SIGSTOP of its QEMU, shorter or longer than the death timeout), reloads its module or dies.

Each round, drawn from ``$OBMM_FUZZ_SEED``: node A exports a region filled with a pattern; node B
imports it and runs the reader of :mod:`obmm.fuzz.cross` (reads, its own writes, the address
handed to futex, vmsplice, O_DIRECT, process_vm_*, ptrace), at either granule; after a random
delay the host makes A go one of those ways, and A gives the withdrawn memory to a new export
filled with poison.  A ``borrow`` round is the hot-plug lock's: B's UNIMPORT of a borrow of A's
memory with a pinned page holds it while a NUMA_REMOTE IMPORT of B's own block waits, whose
export is withdrawn and reused meanwhile.  Invariants, every round:

* no read returns a byte written to the memory after it was withdrawn (poison or the pool's
  zeros: the reader only ever sees the pattern or what it wrote itself);
* an IMPORT that waited for the hot-plug lock does not succeed once its export was reused;
* nothing leaks: both nodes are as they were before the round (regions, devices, pool,
  quarantine, revoked imports, iomem, the module's references);
* no kernel reports anything (the suite's kernel-log guard).

``$OBMM_FUZZ_XROUNDS`` rounds (default 6), each kind of round once in every five; ``make fuzz``
runs this module.  The exporter's death
is the last test (it leaves node A dead).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from test_borrow_xnode import (
    OWN_BLOCK_EXPORT,
    REUSE_OWN,
    SZ_128M,
    borrow_on,
    fill_bound_on_b,
    sleeps_in,
    wait_until,
)
from test_xnode import A, B, exporter
from xharness import ClusterHarness

pytestmark = [pytest.mark.emulator_only, pytest.mark.fuzz]

SEED = int(os.environ.get("OBMM_FUZZ_SEED", "1"))
ROUNDS = int(os.environ.get("OBMM_FUZZ_XROUNDS", "6"))
SZ_2M = 2 << 20
# obmm_emu's defaults: heartbeat_ms x heartbeat_misses, the death timeout.
DEATH_S = 2.0
#: How long a round's reader may read: past the longest stop plus revocation.
READER_LIMIT_S = 30.0
#: What the exporter does in a round; every kind comes once in each run of len(KINDS) rounds,
#: in an order drawn from the seed.
KINDS = ("unexport", "stop", "stop_dead", "reload", "borrow")
GUEST_PY = "from obmm.fuzz import cross\n"


def node_state(xc: ClusterHarness, node: int) -> dict[str, Any]:
    """The node's idle state, once its quarantine drained."""
    return dict(
        xc.py_json(
            node,
            GUEST_PY + "import json, time\n"
            "deadline = time.monotonic() + 30\n"
            "while cross.state()['quarantined'] and time.monotonic() < deadline:\n"
            "    time.sleep(0.2)\n"
            "print(json.dumps(cross.state()))\n",
            timeout=120,
        )
    )


def cleanup(xc: ClusterHarness, node: int) -> None:
    """Every region of `node` gone (imports first)."""
    xc.py(
        node,
        "import obmm, time\n"
        "from obmm.fuzz import target\n"
        "for kind in ('import', 'export'):\n"
        "    for mem_id in sorted(target.sysfs_ids()):\n"
        "        p = target.SHMDEV_SYSFS / f'obmm_shmdev{mem_id}' / 'type'\n"
        "        if p.read_text().strip() != kind:\n"
        "            continue\n"
        "        with obmm.Obmm() as dev:\n"
        "            for _ in range(300):\n"
        "                try:\n"
        "                    (dev.unimport if kind == 'import' else dev.unexport)(mem_id)\n"
        "                    break\n"
        "                except OSError:\n"
        "                    time.sleep(0.1)\n",
        timeout=120,
    )


class Rounds:
    def __init__(self, xc: ClusterHarness, tmp: str, rng: random.Random) -> None:
        self.xc, self.tmp, self.rng = xc, tmp, rng
        self.reads = self.ops = 0
        self.cycle: list[str] = []

    def start_reader(self, handle: dict[str, Any], tag: str) -> str:
        out = f"{self.tmp}/reader-{tag}.json"
        argv = [handle["node"], handle["uba"], handle["length"], handle["tokenid"],
                handle["seed"], int(self.rng.random() < 0.5), self.rng.getrandbits(32),
                READER_LIMIT_S, out]  # fmt: skip
        code = "import sys; from obmm.fuzz import cross; cross.reader_main(sys.argv[1:])"
        self.xc.spawn(B, f"exec python3 -c '{code}' " + " ".join(str(a) for a in argv),
                      name=f"reader-{tag}")  # fmt: skip
        ready = self.xc.run(
            B, f"for i in $(seq 600); do [ -e {out}.ready ] || [ -e {out} ] && exit 0; "
            "sleep 0.1; done; exit 1", timeout=120, check=False,
        )  # fmt: skip
        assert ready.ok, self.xc.run(B, f"cat /tmp/reader-{tag}.log", check=False).out
        return out

    def finish_reader(self, out: str, tag: str) -> dict[str, Any]:
        doc = dict(json.loads(self.xc.wait_file(B, out, timeout=READER_LIMIT_S + 120,
                                                log=f"/tmp/reader-{tag}.log")))  # fmt: skip
        self.reads += int(doc.get("reads", 0))
        self.ops += sum(int(doc.get(k, 0)) for k in ("reads", "writes", "handoffs"))
        return doc

    def export_on_a(self, size: int, seed: int) -> dict[str, Any]:
        doc = dict(
            self.xc.py_json(
                A, GUEST_PY + f"import json\nprint(json.dumps(cross.export_fill({size}, {seed})))\n"
            )
        )
        doc["seed"] = seed
        return doc

    def withdraw_and_reuse(self, handle: dict[str, Any], how: str) -> dict[str, Any]:
        """A unexports (after reloading its module for `reload`) and reuses the memory."""
        xc = self.xc
        if how == "reload":
            xc.py(A, GUEST_PY + "cross.unexport_all()\n")
            xc.py(A, "import xnode\nxnode.reload_obmm()\n", timeout=120)
        else:
            xc.py(
                A, f"import obmm\nwith obmm.Obmm() as dev:\n    dev.unexport({handle['mem_id']})\n"
            )
        poison = self.rng.getrandbits(32) | 1
        return dict(xc.py_json(A, GUEST_PY + "import json\n"
                               f"print(json.dumps(cross.reuse({handle['pa']}, {handle['length']},"
                               f" {poison}, 20)))\n", timeout=120))  # fmt: skip

    def stop_a(self, seconds: float) -> None:
        pid = getattr(self.xc.node(A), "qemu_pid", None)
        if not isinstance(pid, int):
            pytest.skip("needs a QEMU node 0 whose process can be stopped")
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    def read_round(self, index: int, kind: str) -> str:
        size = self.rng.choice((SZ_2M, 2 * SZ_2M, 4 * SZ_2M))
        handle = self.export_on_a(size, self.rng.getrandbits(32) | 1)
        out = self.start_reader(handle, str(index))
        time.sleep(self.rng.uniform(0, 0.5))
        if kind == "stop":
            self.stop_a(self.rng.uniform(0.1, DEATH_S * 0.6))
        elif kind == "stop_dead":
            self.stop_a(self.rng.uniform(DEATH_S + 0.5, DEATH_S + 2.5))
        reused = self.withdraw_and_reuse(handle, kind)
        doc = self.finish_reader(out, str(index))
        assert not doc["violation"], f"round {index} ({kind}): {doc}"
        # the memory was withdrawn: the reader's next access after its revocation faults
        assert doc["ended"] in ("SIGBUS", "import refused"), f"round {index}: {doc}"
        assert doc.get("unimport", "ok") == "ok", f"round {index}: {doc}"
        return f"{kind}: reader {doc['ended']} after {doc.get('reads', 0)} reads; " \
               f"memory reused: {reused['reused']}"  # fmt: skip

    def borrow_round(self, index: int) -> str:
        """The hot-plug lock's round (tests/cluster/test_borrow_xnode.py, randomised)."""
        xc, tag = self.xc, str(index)
        with exporter(xc, self.tmp, size=SZ_128M, seed=100 + index, name=f"xb{index}") as exp:
            mem_id, nid = borrow_on(xc, exp)
            pids: list[int] = []
            try:
                doc = fill_bound_on_b(xc, self.tmp, nid, "--hold --pin", f"xb{index}")
                pids.append(int(doc["pid"]))
                out_u = f"{self.tmp}/u{tag}.json"
                pids.append(xc.spawn_xnode(B, ["blocking", "unimport", str(mem_id), "--out",
                                               out_u], name=f"xu{tag}"))  # fmt: skip
                xc.wait_file(B, out_u + ".started")
                e_id, addr, token = xc.py_json(B, f"MARK = b'first!!!'\n{OWN_BLOCK_EXPORT}")
                if addr % SZ_128M:
                    xc.kill(B, pids[1], "USR1")
                    return "borrow: no block-aligned range"
                out_w = f"{self.tmp}/w{tag}.json"
                argv = ["blocking", "import-numa", hex(addr), hex(SZ_128M), hex(token),
                        "--out", out_w]  # fmt: skip
                waiter = xc.spawn_xnode(B, argv, name=f"xw{tag}")
                pids.append(waiter)
                xc.wait_file(B, out_w + ".started")
                waited = wait_until(lambda: sleeps_in(xc, B, waiter, "obmm_import"), 30)
                for _ in range(self.rng.randint(0, 2)):
                    xc.kill(B, waiter, "USR2")
                time.sleep(self.rng.uniform(0, 1))
                xc.py(B, f"import obmm\nwith obmm.Obmm() as dev:\n    dev.unexport({e_id})\n")
                reuse = self.rng.random() < 0.8
                if reuse:
                    code = f"ADDR, SIZE = {addr}, {SZ_128M}\n{REUSE_OWN}"
                    reuse = bool(xc.py_json(B, code, timeout=180)[0])
                xc.kill(B, pids[1], "USR1")  # the UNIMPORT ends: the lock frees
                result = json.loads(xc.wait_file(B, out_w, timeout=300))
                if result.get("mem_id"):
                    xc.py(B, f"import xnode\nxnode.unimport({result['mem_id']})\n", timeout=300)
                if waited and reuse:
                    assert result["errno"] != 0, (
                        f"round {index} (borrow): a NUMA_REMOTE IMPORT that waited for the "
                        f"hot-plug lock succeeded after its export was withdrawn and reused"
                    )
                assert result["errno"] != 4, f"round {index}: a handled signal gave EINTR"
                return f"borrow: the waiting IMPORT {result}"
            finally:
                if pids:
                    xc.kill(B, pids[0], "USR2")  # the filler lets its page go
                for pid in pids:
                    xc.kill(B, pid, "KILL")
                cleanup(xc, B)

    def round(self, index: int) -> str:
        if not self.cycle:
            self.cycle = self.rng.sample(KINDS, len(KINDS))
        kind = self.cycle.pop()
        if kind == "borrow":
            return self.borrow_round(index)
        return self.read_round(index, kind)


def test_cross_node_rounds(xc: ClusterHarness, guest_tmp: str) -> None:
    rng = random.Random(SEED)
    before = {n: node_state(xc, n) for n in (A, B)}
    rounds = Rounds(xc, guest_tmp, rng)
    t0 = time.monotonic()
    log: list[str] = []
    for i in range(ROUNDS):
        log.append(f"round {i}: " + rounds.round(i))
        cleanup(xc, A)
        cleanup(xc, B)
        for n in (A, B):
            after = node_state(xc, n)
            assert after == before[n], f"round {i} left node{n} changed: {before[n]} -> {after}"
    took = time.monotonic() - t0
    print("\n".join(log))
    print("fuzz-result " + json.dumps({"mode": "cross-node", "seed": SEED, "rounds": ROUNDS,
                                       "ops": rounds.ops, "reads": rounds.reads,
                                       "seconds": round(took, 1)}))  # fmt: skip


@pytest.mark.destroys_cluster
def test_cross_node_exporter_dies(xc: ClusterHarness, guest_tmp: str) -> None:
    """A's QEMU is killed while B reads its memory: B revokes after the death timeout (SIGBUS),
    never reads anything but A's last bytes, unimports, and is idle again."""
    if not xc.alive(A):
        pytest.skip("node 0 is already gone (another destroys_cluster test killed it)")
    rng = random.Random(SEED + 1)
    before = node_state(xc, B)
    rounds = Rounds(xc, guest_tmp, rng)
    handle = rounds.export_on_a(rng.choice((SZ_2M, 4 * SZ_2M)), rng.getrandbits(32) | 1)
    out = rounds.start_reader(handle, "die")
    time.sleep(rng.uniform(0, 0.5))
    node_a = xc.node(A)
    pid = getattr(node_a, "qemu_pid", None)
    if not isinstance(pid, int):
        pytest.skip("needs a QEMU node 0 whose process can be killed")
    os.kill(pid, signal.SIGKILL)
    gone: Callable[[], bool] = lambda: not node_a.alive()  # noqa: E731
    assert wait_until(gone, 10)
    xc.drop(A)
    doc = rounds.finish_reader(out, "die")
    assert not doc["violation"], doc
    assert doc["ended"] == "SIGBUS", doc
    assert doc["unimport"] == "ok", doc
    assert node_state(xc, B) == before
