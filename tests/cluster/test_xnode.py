"""Cross-node OBMM on the emulated fabric: node A (0) exports, node B (1) imports.

Handles go from A to B as in production: A publishes them with obmm.exchange on its link-local
address, B fetches them over the inter-node network, resolves the decoder address and imports
with the handle's tokenid.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from xharness import ClusterHarness

A, B = 0, 1
SZ_2M = 2 << 20
SIGBUS_STATUS = 128 + signal.SIGBUS  # how sh reports a child killed by SIGBUS
# Revocation must reach B's mapping within this (the module's heartbeat is 1 s).
REVOKE_BUDGET_S = 30.0


@dataclass
class Exporter:
    node: int
    pid: int
    handle: dict[str, Any]
    host: str
    port: int
    name: str
    ready: str
    seed: int
    size: int

    @property
    def mem_id(self) -> int:
        return int(self.handle["mem_id"])


def _port() -> int:
    return random.randint(20000, 29999)


@contextlib.contextmanager
def exporter(xc: ClusterHarness, tmp: str, *, size: int = SZ_2M, seed: int = 1,
             node: int = A, name: str = "region") -> Iterator[Exporter]:  # fmt: skip
    """`xnode serve` on `node`: export, fill pattern(seed), publish the handle; unexport at end."""
    port = _port()
    ready = f"{tmp}/export-{name}.json"
    host = xc.ip(node)
    argv = ["serve", "--size", str(size), "--seed", str(seed), "--name", name, "--bind", host,
            "--port", str(port), "--ready", ready]  # fmt: skip
    pid = xc.spawn_xnode(node, argv, name=f"serve-{name}-{port}")
    try:
        doc = json.loads(xc.wait_file(node, ready, log=f"/tmp/serve-{name}-{port}.log"))
        yield Exporter(node, pid, doc["handle"], host, port, name, ready, seed, size)
    finally:
        if xc.alive(node):
            xc.kill(node, pid)
            xc.run(
                node, f"for i in $(seq 50); do kill -0 {pid} 2>/dev/null || exit 0; sleep 0.2; "
                "done; kill -9 {pid}; exit 1".replace("{pid}", str(pid)), check=False
            )  # fmt: skip


def import_on(xc: ClusterHarness, node: int, exp: Exporter, *, tokenid: str = "None") -> int:
    """Fetch the handle over the inter-node network and import it on `node`; its mem_id."""
    doc = xc.py_json(
        node,
        f"import json, xnode\n"
        f"h = xnode.fetch({exp.host!r}, {exp.port}, {exp.name!r})\n"
        f"imp = xnode.import_handle(h, tokenid={tokenid})\n"
        f"print(json.dumps({{'mem_id': imp.mem_id, 'addr': imp.addr}}))\n",
    )
    return int(doc["mem_id"])


def unimport_on(xc: ClusterHarness, node: int, mem_id: int) -> None:
    xc.py(node, f"import xnode\nxnode.unimport({mem_id})\n")


def digest_on(xc: ClusterHarness, node: int, mem_id: int, offset: int, size: int,
              *, sync: bool = False) -> str:  # fmt: skip
    return str(
        xc.py_json(
            node,
            "import hashlib, json, xnode\n"
            f"d = xnode.read_local({mem_id}, {offset}, {size}, sync={sync})\n"
            "print(json.dumps(hashlib.sha256(d).hexdigest()))\n",
        )
    )


def expected_digest(seed: int, size: int, offset: int = 0) -> str:
    data = random.Random(seed).randbytes(offset + size)[offset:]
    return hashlib.sha256(data).hexdigest()


def test_nodes_reach_each_other_on_link_local_addresses(xc: ClusterHarness, guest_tmp: str
                                                         ) -> None:  # fmt: skip
    # TCP over the inter-node NIC: A listens on its 169.254 address, B connects, A answers with
    # B's address as it saw it and then 4 MiB of data (a burst through the hub's queues).
    port = _port()
    ready = f"{guest_tmp}/echo.ready"
    server = (
        "import random, socket, pathlib\n"
        f"s = socket.create_server(({xc.ip(A)!r}, {port}))\n"
        f"pathlib.Path({ready!r}).write_text('1')\n"
        "c, peer = s.accept()\n"
        "c.sendall(c.recv(5) + peer[0].encode().ljust(16))\n"
        "c.sendall(random.Random(3).randbytes(4 << 20))\n"
        "c.close()\n"
    )
    xc.run(A, f"cat > {guest_tmp}/echo.py", stdin=server.encode())
    xc.spawn(A, f"exec timeout 120 {xc.python} {guest_tmp}/echo.py", name="echo")
    xc.wait_file(A, ready)
    got = xc.py_json(
        B,
        "import hashlib, json, random, socket, time\n"
        f"c = socket.create_connection(({xc.ip(A)!r}, {port}), timeout=30)\n"
        "c.sendall(b'ping-')\n"
        "t0 = time.monotonic()\n"
        "data = b''\n"
        "while chunk := c.recv(1 << 16):\n"
        "    data += chunk\n"
        "dt = time.monotonic() - t0\n"
        "body = data[21:]\n"
        "ok = body == random.Random(3).randbytes(4 << 20)\n"
        "print(json.dumps([data[:21].decode().strip(), ok, len(body), dt]))\n",
        timeout=180,
    )
    print(f"4 MiB A -> B over the inter-node network in {got[3]:.2f} s")
    if xc.hardware:
        # A host's fabric address may be a name and its source address another interface's.
        assert got[1:3] == [True, 4 << 20], got
        return
    assert got[:3] == [f"ping-{xc.ip(B)}", True, 4 << 20], got
    for i in range(xc.nodes):
        addrs = xc.run(i, "ip -4 -o addr show | awk '{print $2, $4}'").out
        assert f"{xc.ip(i)}/16" in addrs


def test_a_exports_and_fills_b_imports_and_reads(xc: ClusterHarness, guest_tmp: str) -> None:
    with exporter(xc, guest_tmp, seed=11) as exp:
        assert exp.handle["node_id"] == A  # obmm_emu's node_id, or OBMM_NODE_ID on hardware
        assert exp.handle["tokenid"] != 0
        mem_id = import_on(xc, B, exp)
        try:
            assert digest_on(xc, B, mem_id, 0, exp.size) == expected_digest(11, exp.size)
        finally:
            unimport_on(xc, B, mem_id)


@pytest.mark.parametrize("sync", [False, True], ids=["cacheable", "o_sync"])
def test_b_writes_a_sees(xc: ClusterHarness, guest_tmp: str, sync: bool) -> None:
    with exporter(xc, guest_tmp, seed=12) as exp:
        mem_id = import_on(xc, B, exp)
        try:
            off, size = 4096 + 123, 300_000
            xc.py(
                B,
                "import random, xnode\n"
                f"data = random.Random(99).randbytes({size})\n"
                f"xnode.write_local({mem_id}, {off}, data, sync={sync})\n",
            )
            want = hashlib.sha256(random.Random(99).randbytes(size)).hexdigest()
            # A reads its own export (through the exporter's shmdev), cacheable and O_SYNC.
            assert digest_on(xc, A, exp.mem_id, off, size, sync=sync) == want
            assert digest_on(xc, A, exp.mem_id, off, size, sync=not sync) == want
            # Untouched bytes are still A's pattern.
            assert digest_on(xc, A, exp.mem_id, 0, 4096) == expected_digest(12, 4096)
            # And A's writes reach B's mapping the other way.
            xc.py(A, f"import xnode\nxnode.write_local({exp.mem_id}, 0, b'A' * 4096)\n")
            assert (
                digest_on(xc, B, mem_id, 0, 4096, sync=sync)
                == hashlib.sha256(b"A" * 4096).hexdigest()
            )
        finally:
            unimport_on(xc, B, mem_id)


def test_several_importers_of_one_export(xc: ClusterHarness, guest_tmp: str) -> None:
    # Every node imports A's export: B (and any further node) through its window onto A,
    # A itself through its loopback window.
    with exporter(xc, guest_tmp, seed=13) as exp:
        imports = {node: import_on(xc, node, exp) for node in range(xc.nodes)}
        try:
            want = expected_digest(13, exp.size)
            for node, mem_id in imports.items():
                assert digest_on(xc, node, mem_id, 0, exp.size) == want, f"node{node}"
            # Two processes on B map the same import at once and see each other's store.
            code = (
                "import obmm, sys, time\n"
                f"with obmm.ShmDev({imports[B]}) as s, s.mmap({SZ_2M}) as m:\n"
                "    if sys.argv[1] == 'w':\n"
                "        m.write(100, b'from-writer')\n"
                "    else:\n"
                "        t = time.monotonic() + 60\n"
                "        while m.read(100, 11) != b'from-writer':\n"
                "            assert time.monotonic() < t, 'never saw the store'\n"
                "            time.sleep(0.05)\n"
                "        print('seen')\n"
            )
            xc.run(B, f"cat > {guest_tmp}/two.py", stdin=code.encode())
            reader = xc.spawn(B, f"exec {xc.python} {guest_tmp}/two.py r", name="two-r")
            xc.py(B, f"import sys; sys.argv = ['x', 'w']; exec(open('{guest_tmp}/two.py').read())")
            xc.run(B, f"while kill -0 {reader} 2>/dev/null; do sleep 0.2; done", timeout=90)
            assert xc.run(B, "cat /tmp/two-r.log").out.strip() == "seen"
            # ... and every other importer sees it too, A included.
            for node, mem_id in imports.items():
                got = xc.py_json(
                    node, f"import json, xnode\nprint(json.dumps(xnode.read_local({mem_id}, "
                    "100, 11).decode()))\n",
                )  # fmt: skip
                assert got == "from-writer", f"node{node}"
        finally:
            for node, mem_id in imports.items():
                unimport_on(xc, node, mem_id)


def test_two_importers_write_disjoint_halves_concurrently(xc: ClusterHarness, guest_tmp: str
                                                          ) -> None:  # fmt: skip
    size = 4 << 20
    half = size // 2
    with exporter(xc, guest_tmp, size=size, seed=14) as exp:
        imports = {A: import_on(xc, A, exp), B: import_on(xc, B, exp)}
        try:
            errors: list[BaseException] = []

            def writer(node: int, offset: int, seed: int) -> None:
                try:
                    xc.py(
                        node,
                        "import random, obmm\n"
                        f"data = random.Random({seed}).randbytes({half})\n"
                        f"with obmm.ShmDev({imports[node]}) as s, s.mmap({size}) as m:\n"
                        "    for _ in range(20):\n"
                        f"        m.buf[{offset}:{offset + half}] = data\n",
                        timeout=300,
                    )
                except BaseException as exc:
                    errors.append(exc)

            threads = [
                threading.Thread(target=writer, args=(A, 0, 201)),
                threading.Thread(target=writer, args=(B, half, 202)),
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=330)
            assert not any(t.is_alive() for t in threads), "a writer hung"
            assert not errors, errors
            first = hashlib.sha256(random.Random(201).randbytes(half)).hexdigest()
            second = hashlib.sha256(random.Random(202).randbytes(half)).hexdigest()
            for node in (A, B):
                assert digest_on(xc, node, imports[node], 0, half) == first, f"node{node}"
                assert digest_on(xc, node, imports[node], half, half) == second, f"node{node}"
            assert digest_on(xc, A, exp.mem_id, 0, half) == first
            assert digest_on(xc, A, exp.mem_id, half, half) == second
        finally:
            for node, mem_id in imports.items():
                unimport_on(xc, node, mem_id)


@pytest.mark.parametrize("which", ["zero", "other"])
def test_import_does_not_check_the_tokenid(xc: ClusterHarness, guest_tmp: str, which: str) -> None:
    """The real IMPORT never reads tokenid (obmm_import.c:obmm_import): a program that
    passes 0, as ones written on UB hosts do, or another value imports the export and reads
    what A wrote."""
    with exporter(xc, guest_tmp, seed=15) as exp:
        tokenid = 0 if which == "zero" else (exp.handle["tokenid"] ^ 0x5A5A) or 1
        mem_id = import_on(xc, B, exp, tokenid=str(tokenid))
        try:
            assert digest_on(xc, B, mem_id, 0, exp.size) == expected_digest(exp.seed, exp.size)
        finally:
            unimport_on(xc, B, mem_id)


def _touch_in_background(xc: ClusterHarness, node: int, mem_id: int, tmp: str, tag: str,
                         *, sync: bool = False) -> str:  # fmt: skip
    """A process on `node` loading from import `mem_id` until it dies; returns its status file."""
    status = f"{tmp}/{tag}.status"
    ready = f"{tmp}/{tag}.ready"
    flag = " --sync" if sync else ""
    xc.spawn(
        node,
        f"{xc.python} -m xnode touch --mem-id {mem_id} --ready {ready} --limit 120{flag}; "
        f"echo $? > {status}",
        name=f"touch-{tag}",
    )
    xc.wait_file(node, ready, log=f"/tmp/touch-{tag}.log")
    return status


def _wait_status(xc: ClusterHarness, node: int, status: str, budget: float) -> int:
    start = time.monotonic()
    text = xc.wait_file(node, status, timeout=budget)
    elapsed = time.monotonic() - start
    code = int(text.strip())
    assert code == SIGBUS_STATUS, (
        f"the reader on node{node} exited with status {code} after {elapsed:.1f} s, "
        f"not by SIGBUS ({SIGBUS_STATUS})"
    )
    return code


@pytest.mark.emulator_only  # the emulator's revocation (FIDELITY.md: on hardware the UMMU)
def test_unexport_while_b_has_it_mapped_faults_b(xc: ClusterHarness, guest_tmp: str) -> None:
    with exporter(xc, guest_tmp, seed=16) as exp:
        mem_id = import_on(xc, B, exp)
        try:
            status = _touch_in_background(xc, B, mem_id, guest_tmp, "unexport")
            xc.kill(A, exp.pid, "USR1")
            assert xc.wait_file(A, exp.ready + ".unexported").strip() == "ok"
            _wait_status(xc, B, status, REVOKE_BUDGET_S)
        finally:
            # B can close and unimport after the revocation.
            unimport_on(xc, B, mem_id)


def _engram_picks(tables: int, rows: int, tokens: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[t, rng.randrange(rows)] for _ in range(tokens) for t in range(tables)]


def test_engram_random_rows_match_a_byte_for_byte(xc: ClusterHarness, guest_tmp: str) -> None:
    # 12 tables of 1024 rows of 1364 bytes (341 fp32), like the seed's Engram prefetch; 128
    # tokens pick one random row from each table (1536 row reads).
    tables, rows, row_size, tokens = 12, 1024, 1364, 128
    size = 16 << 20
    assert tables * rows * row_size <= size
    picks = _engram_picks(tables, rows, tokens, seed=7)
    with exporter(xc, guest_tmp, size=size, seed=17) as exp:
        mem_id = import_on(xc, B, exp)
        try:
            xc.run(B, f"cat > {guest_tmp}/picks.json", stdin=json.dumps(picks).encode())
            xc.run(A, f"cat > {guest_tmp}/picks.json", stdin=json.dumps(picks).encode())
            snippet = (
                "import json, xnode\n"
                f"picks = json.load(open('{guest_tmp}/picks.json'))\n"
                "print(json.dumps(xnode.engram_rows({mem_id}, "
                f"{tables}, {rows}, {row_size}, picks)))\n"
            )
            on_b = xc.py_json(B, snippet.replace("{mem_id}", str(mem_id)), timeout=300)
            on_a = xc.py_json(A, snippet.replace("{mem_id}", str(exp.mem_id)), timeout=300)
            expected = xc.py_json(
                B,
                "import json, xnode\n"
                f"picks = json.load(open('{guest_tmp}/picks.json'))\n"
                f"print(json.dumps(xnode.engram_expected(17, {size}, {rows}, {row_size}, "
                "picks)))\n",
                timeout=300,
            )
            assert on_b == on_a == expected
        finally:
            unimport_on(xc, B, mem_id)


@pytest.mark.emulator_only  # kills node A's QEMU
@pytest.mark.destroys_cluster
def test_killing_a_while_b_has_it_mapped_faults_b_and_leaves_b_clean(
    xc: ClusterHarness, guest_tmp: str
) -> None:
    if not xc.alive(A):
        pytest.skip("node 0 is already gone (another destroys_cluster test killed it)")
    exp_ctx = exporter(xc, guest_tmp, seed=18)
    exp = exp_ctx.__enter__()
    mem_id = import_on(xc, B, exp)
    status = _touch_in_background(xc, B, mem_id, guest_tmp, "kill-a")
    node_a = xc.node(A)
    pid = getattr(node_a, "qemu_pid", None)
    if not isinstance(pid, int):
        pytest.skip("needs a QEMU node 0 whose process can be killed")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while node_a.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not node_a.alive()
    xc.drop(A)
    try:
        _wait_status(xc, B, status, REVOKE_BUDGET_S)
    finally:
        unimport_on(xc, B, mem_id)
        # The exporter context's cleanup must not wait on the dead node.
        with contextlib.suppress(Exception):
            exp_ctx.__exit__(None, None, None)
    # B is fully usable: a fresh export and loopback import on B still work.
    assert xc.py_json(
        B,
        "import json, obmm, xnode\n"
        "h = xnode.export_fill(2 << 20, 5)\n"
        "imp = xnode.import_handle(h)\n"
        "ok = xnode.read_local(imp.mem_id, 0, 64) == xnode.pattern(5, 64)\n"
        "xnode.unimport(imp.mem_id)\nxnode.unexport(h.mem_id)\n"
        "print(json.dumps(ok))\n",
    )
    # The kernel-log guard (conftest) then scans B's log for WARN/BUG/oops from the revocation.


@pytest.mark.emulator_only  # obmm_testhook.ko makes the WARN
@pytest.mark.after_destroys
def test_kernel_log_guard_reports_a_warn_on_the_node_that_warned(xc: ClusterHarness) -> None:
    # The guard (conftest) is what proves "no kernel report on the survivors": check it sees one.
    # Runs last: B's log then holds a WARN that a whole-log scan would report.
    xc.run(B, "echo warn > /dev/obmm_testhook")
    failures = xc.take_kernel_log()  # the test owns this WARN; the guard starts over
    text = "\n".join(failures)
    assert failures and all(f.startswith(f"node{B}") for f in failures), text
    assert failures[0].startswith(f"node{B} kernel reports"), text
    assert "WARN requested by test" in text
