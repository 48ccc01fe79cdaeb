"""examples/README.md, run as written: exporters on node 0, clients on node 1, C and Python.

Both exporters serve at once (on different ports); each client then reads each exporter's
handle, so the C and Python implementations of the handle format and exchange protocol are
checked against each other too.

Emulator only: as written the examples take the node's identity and decoder window from
/sys/kernel/obmm_emu (on hardware they need --node-id/--cna/--eid and --addr; examples/README.md).
"""

from __future__ import annotations

import random
import re
import shlex

import pytest
from xharness import ClusterHarness

from obmm import decoder, envvars
from obmm.testbed.parallel import on_each

pytestmark = pytest.mark.testbed_fabric

A, B = 0, 1


def _wait_log(xc: ClusterHarness, node: int, log: str, text: str, timeout: float = 120) -> str:
    script = (
        f"t=0; until grep -q {shlex.quote(text)} {log} 2>/dev/null; do sleep 0.2; "
        f"t=$((t+1)); [ $t -ge {int(timeout * 5)} ] && exit 1; done; cat {log}"
    )
    res = xc.run(node, script, timeout=timeout + 30, check=False)
    if not res.ok:
        log_text = xc.run(node, f"cat {log}", check=False).out
        raise AssertionError(f"node{node}: {text!r} never appeared in {log}:\n{log_text}")
    return res.out


@pytest.fixture(scope="module")
def built(xc: ClusterHarness) -> None:
    # Both nodes build at once (each is one TCG vCPU on its own host core).
    on_each([A, B], lambda n: xc.run(n, f"make -s -C {xc.examples}/c", timeout=300))


def test_examples_end_to_end(xc: ClusterHarness, built: None) -> None:
    port_c, port_py = (random.randint(30000, 39999) for _ in range(2))
    host = xc.ip(A)
    c_log, py_log = "/tmp/example-exporter-c.log", "/tmp/example-exporter-py.log"
    pids = {
        "c": xc.spawn(
            A, f"exec {xc.examples}/c/exporter --bind {host} --port {port_c} --size 16",
            name="example-exporter-c",
        ),
        "py": xc.spawn(
            A, f"exec {xc.python} {xc.examples}/python/exporter.py --bind {host} --port {port_py} "
            "--size 4", name="example-exporter-py",
        ),
    }  # fmt: skip
    shmdevs = "ls /dev | grep -c '^obmm_shmdev' || true"
    before = xc.run(B, shmdevs).out.strip()
    try:
        c_out = _wait_log(xc, A, c_log, "serving handle")
        py_out = _wait_log(xc, A, py_log, "serving handle")
        mem_ids = {
            "c": int(re.search(r"mem_id=(\d+)", c_out).group(1)),  # type: ignore[union-attr]
            "py": int(re.search(r"mem_id=(\d+)", py_out).group(1)),  # type: ignore[union-attr]
        }
        clients = {
            "c": f"{xc.examples}/c/client {host} --port {{port}}",
            "py": f"env {xc.env(B)} {xc.python} {xc.examples}/python/client.py {host} "
            "--port {port}",
        }
        for exp_kind, port in (("c", port_c), ("py", port_py)):
            floats = (16 if exp_kind == "c" else 4) << 18
            for client_kind, cmd in clients.items():
                res = xc.run(B, cmd.format(port=port), timeout=300, check=False)
                what = f"{client_kind} client vs {exp_kind} exporter"
                print(f"--- {what} ---\n{res.out}")  # shown with -rA: the measured latencies
                assert res.ok, f"{what}: exit {res.exit_status}\n{res.out}\n{res.err}"
                assert f"floats of {floats}: OK" in res.out, f"{what}:\n{res.out}"
                assert re.search(r"random row read \(1364 B, \d+ rows\): avg \d+ ns", res.out), (
                    f"{what}:\n{res.out}"
                )
                assert "node 0" in res.out
        # B's imports are gone again: the clients unimported.
        assert xc.run(B, shmdevs).out.strip() == before
    finally:
        for pid in pids.values():
            xc.kill(A, pid, "TERM")  # background jobs ignore SIGINT; both handle TERM like Ctrl-C
    # Each exporter stops and unexports its region.
    for kind, log in (("c", c_log), ("py", py_log)):
        _wait_log(xc, A, log, "stopping", timeout=60)
        pid = pids[kind]
        xc.run(A, f"for i in $(seq 100); do kill -0 {pid} 2>/dev/null || exit 0; sleep 0.1; done;"
               " exit 1", timeout=60)  # fmt: skip
        assert not xc.run(A, f"test -e /dev/obmm_shmdev{mem_ids[kind]}", check=False).ok


def test_borrow_examples(xc: ClusterHarness, built: None) -> None:
    """The borrowers (C and Python) against the C exporter's 128 MiB export."""
    port = random.randint(30000, 39999)
    host = xc.ip(A)
    log = "/tmp/example-exporter-borrow.log"
    pid = xc.spawn(
        A, f"exec {xc.examples}/c/exporter --bind {host} --port {port} --size 128",
        name="example-exporter-borrow",
    )  # fmt: skip
    try:
        _wait_log(xc, A, log, "serving handle")
        c = xc.run(B, f"{xc.examples}/c/borrower {host} --port {port}", timeout=300, check=False)
        print(f"--- C borrower ---\n{c.out}")
        refused = re.search(r"UBA (0x[0-9a-f]+) is not a testbed UBA", c.err)
        if refused and int(refused.group(1), 16) & decoder.EMU_UBA_SCATTERED:
            # only the real driver's pool gives an export in pieces (kmod/ub_compat/pool.c)
            assert envvars.DRIVER.get() == "real", c.err
            pytest.skip("the real driver's pool gave the export in pieces; no UBA reaches it")
        assert c.ok, f"C borrower: exit {c.exit_status}\n{c.out}\n{c.err}"
        node = int(re.search(r"on NUMA node (\d+) \(128 MiB\)", c.out).group(1))  # type: ignore[union-attr]
        assert "16384 of 16384 pages on node" in c.out
        assert f"unimported; node {node} has 0 MiB" in c.out
        py = xc.run(
            B, f"env {xc.env(B)} {xc.python} {xc.examples}/python/borrower.py {host} --port {port}",
            timeout=300, check=False,
        )  # fmt: skip
        print(f"--- Python borrower ---\n{py.out}")
        assert py.ok, f"Python borrower: exit {py.exit_status}\n{py.out}\n{py.err}"
        assert re.search(r"pages per node: N\d+=8192$", py.out, re.M), py.out
        assert "has 0 MiB" in py.out
    finally:
        xc.kill(A, pid, "TERM")
    _wait_log(xc, A, log, "stopping", timeout=60)
