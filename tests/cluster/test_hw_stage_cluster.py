"""The hardware stage's cluster step, proven against this suite's own 2-node QEMU cluster.

``python -m obmm.testbed.hw.stage --qemu <this cluster> --suite cluster`` is pointed at the
session's nodes exactly as at UB hosts (obmm_emu standing in for obmm.ko): strict known_hosts,
the testbed's key, the nodes' inter-node addresses as ``fabric_addrs``, nothing built or
loaded, and the decoder hook a site would give: a window table file on every host
(``--decoder file:...``, written here from the emulator's windows), not the emulator's sysfs.
It runs this very suite in hardware mode, in a subprocess; that run must pass, skip exactly the
tests ``pytest --collect-only -m emulator_only tests/cluster`` lists (each with the
emulator_only reason), collect both nodes' kernel logs and leave nothing on the nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from xharness import ClusterHarness

from obmm.testbed.paths import is_input_skip, repo_root, results_dir
from obmm.testbed.session import Session
from obmm.testbed.suite.guest_plugin import TESTBED_FABRIC_SKIP, emulator_only_reason

# It needs a QEMU cluster to stand in for hosts (and on hardware it would run itself again).
pytestmark = pytest.mark.emulator_only

STAGE_TIMEOUT_S = 1800.0


def _clean_env() -> dict[str, str]:
    drop = ("HW_", "OBMM_DECODER", "OBMM_HW_", "OBMM_CLUSTER_ATTACH", "OBMM_TESTBED_NAME")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _collect(*args: str) -> set[tuple[str, str]]:
    """(classname, name) as junit spells them, of what pytest collects in tests/cluster."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"]
    proc = subprocess.run(
        [*argv, *args, "tests/cluster"],
        cwd=repo_root(),
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = set()
    for line in proc.stdout.splitlines():
        if "::" in line:
            path, _, name = line.strip().partition("::")
            found.add((path.removesuffix(".py").replace("/", "."), name))
    return found


def _modules(xc: ClusterHarness, node: int) -> str:
    return xc.run(node, "cut -d' ' -f1 /proc/modules | sort").out


# The site's view of the fabric as a table: node j's memory (UBA = bit 48 | j << 40 | PA, see
# obmm.decoder) appears at the window's local base.
WINDOW_TABLE = """
import json, pathlib, sys
from obmm import decoder
doc = {"windows": [
    {"node": w.node, "base": hex(w.base), "size": hex(w.size),
     "remote_base": hex(decoder.EMU_UBA_VALID | w.node << decoder.EMU_UBA_NODE_SHIFT)}
    for w in decoder.EmulatorDecoder().windows()]}
pathlib.Path(PATH).write_text(json.dumps(doc))
print(json.dumps(len(doc["windows"])))
"""


@pytest.fixture
def window_table(xc: ClusterHarness) -> Iterator[str]:
    """A decoder table at the same path on every node; removed afterwards."""
    path = f"/tmp/obmm-windows-{uuid.uuid4().hex[:8]}.json"
    try:
        for i in range(xc.nodes):
            assert xc.py_json(i, WINDOW_TABLE.replace("PATH", repr(path))) >= xc.nodes
        yield path
    finally:
        for i in range(xc.nodes):
            xc.run(i, f"rm -f {path}", check=False)


@pytest.mark.hw_proof
def test_hw_stage_runs_the_cluster_suite_across_the_qemu_nodes(
    cluster: Session, xc: ClusterHarness, window_table: str
) -> None:
    everything = _collect()
    emulator_only = _collect("-m", "emulator_only")
    assert emulator_only and emulator_only < everything
    # testbed_fabric: runs on either testbed driver, needs the testbed's decoder windows
    fabric = _collect("-m", "testbed_fabric and not emulator_only")
    modules_before = [_modules(xc, i) for i in range(xc.nodes)]
    results = results_dir() / "hw-cluster-proof"
    argv = [sys.executable, "-m", "obmm.testbed.hw.stage", "--qemu", cluster.name, "--suite",
            "cluster", "--results", str(results), "--connect-timeout", "90",
            "--decoder", f"file:{window_table}"]  # fmt: skip
    proc = subprocess.run(
        argv,
        cwd=repo_root(),
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=STAGE_TIMEOUT_S,
        check=False,
    )
    out = proc.stdout + proc.stderr
    results.mkdir(parents=True, exist_ok=True)
    (results / "stage-output.txt").write_text(out)
    assert proc.returncode == 0, out[-8000:]

    cases = {
        (c.get("classname", ""), c.get("name", "")): c
        for c in ET.parse(results / "cluster" / "junit.xml").getroot().iter("testcase")
    }
    assert set(cases) == everything
    skips = {
        key: skip.get("message", "").removeprefix("Skipped: ")
        for key, case in cases.items()
        if (skip := case.find("skipped")) is not None
    }
    assert {k for k, why in skips.items() if why == emulator_only_reason("hardware")} == (
        emulator_only
    )
    assert {k for k, why in skips.items() if why == TESTBED_FABRIC_SKIP} == fabric
    # and those of a test whose input was not given (the stock-libobmm tests without
    # OBMM_LIBOBMM_SOURCE): one line saying how to give it, as everywhere else
    inputs = {k for k, why in skips.items() if is_input_skip(why)}
    assert set(skips) == emulator_only | fabric | inputs
    bad = [k for k, c in cases.items() if c.find("failure") is not None or c.find("error")]
    assert bad == []
    summary = json.loads((results / "summary.json").read_text())
    assert summary["cluster"]["exit"] == 0
    assert summary["cluster"]["counts"] == {
        "passed": len(everything) - len(skips),
        "failed": 0,
        "error": 0,
        "skipped": len(skips),
    }
    assert summary["hosts"] == {}  # --suite cluster: no guest suite ran

    ports = [n.ssh_port for n in cluster.cluster.nodes]
    for i, port in enumerate(ports):
        preflight = (results / f"127.0.0.1_{port}" / "preflight.txt").read_text()
        assert f"ok   decoder: file: {window_table} ({xc.nodes} window(s))" in preflight
        assert "ok   identity: /sys/devices/ub_bus_controller0/00001: primary_cna" in preflight
        hostdir = results / "cluster" / f"127.0.0.1_{port}"
        assert f"obmm-hw-test: begin {summary['run_id']}" in (hostdir / "dmesg.txt").read_text()
        assert (hostdir / "dmesg-run.txt").is_file()
        assert summary["cluster"]["kernel_logs"][f"root@127.0.0.1:{port}"] == (
            "kernel log: clean during the run"
        )
        # Nothing left behind and nothing loaded or unloaded: the host's driver is under test.
        assert xc.run(i, "ls -d /tmp/obmm-xnode.* 2>/dev/null; true").out == ""
        assert _modules(xc, i) == modules_before[i]
    # every skip, with its reason: the emulator_only, testbed_fabric and missing-input ones
    assert (Path(results) / "cluster" / "skipped.txt").read_text().count("\n") == len(skips)


@pytest.mark.hw_proof
def test_scheme7_bench_runs_on_the_hardware_stage_hosts(
    cluster: Session, xc: ClusterHarness, window_table: str, tmp_path: Path
) -> None:
    """`bench --scheme7 --hw` goes through the stage's configuration, pre-flight and decoder
    hook like the suites: node 0 exports and fills, node 1 imports through the site's window
    table and runs the seed's client, cacheable and O_SYNC, each beside local memory; the
    package is gone from the hosts afterwards and no region is left."""
    argv = [sys.executable, "-m", "obmm.bench", "--scheme7", "--hw", "--hw-qemu", cluster.name,
            "--quick", "--out", str(tmp_path), "--name", "r", "--no-plots"]  # fmt: skip
    env = dict(_clean_env(), OBMM_DECODER=f"file:{window_table}", HW_CONNECT_TIMEOUT="90")
    proc = subprocess.run(
        argv,
        cwd=repo_root(),
        env=env,
        capture_output=True,
        text=True,
        timeout=STAGE_TIMEOUT_S,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    doc = json.loads((tmp_path / "r" / "results.json").read_text())
    figs = {f["name"]: f for f in doc["figures"]}
    for src in ("cross-node", "cross-node-sync"):
        for bench in ("bench1.row", "bench2.batch32", "bench3.128tok"):
            fig = figs[f"scheme7.{bench}.{src}"]
            assert fig["skipped"] is None and len(fig["samples"]) == 50, (bench, src)
            assert fig["baseline"] == f"scheme7.{bench}.{src}-local"
            assert fig["paired_ratio"] is not None
    ports = ",".join(f"root@127.0.0.1:{n.ssh_port}" for n in cluster.cluster.nodes[:2])
    assert doc["environment"]["extra"]["hw_hosts"] == ports
    assert cluster.name in doc["environment"]["extra"]["hw_stand_in"]
    for i in range(2):
        assert xc.run(i, "ls -d /tmp/obmm-bench.* 2>/dev/null; true").out == ""
        regions = xc.py_json(i, "import json, os; print(json.dumps(sorted(os.listdir('/dev'))))")
        assert not [r for r in regions if r.startswith("obmm_shmdev")], regions
