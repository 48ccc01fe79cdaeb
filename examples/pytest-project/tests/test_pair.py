"""The exporter/client pair across two nodes, tested with the obmm-testbed pytest plugin.

The ``obmm_cluster`` fixture is the session's 2-node cluster with obmm.ko (the emulator)
loaded; around every test the plugin scans the nodes' kernel logs (a WARN or oops fails the test
with the excerpt), checks that no region, shmdev node or pool memory was left behind, and stops the
processes the test started.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from obmm.testbed.ssh import CommandTimeout
from obmm.testbed.usercluster import UserCluster

PROJECT = Path(__file__).resolve().parents[1]
DEST = "/root/pytest-project"  # where the project goes on every node
PORT = 7000


@pytest.fixture
def built(obmm_cluster: UserCluster) -> UserCluster:
    """The project on every node, built there (make is incremental: later tests reuse it)."""
    obmm_cluster.put(PROJECT, DEST)
    for node, res in zip(obmm_cluster.nodes, obmm_cluster.run_all(f"make -s -C {DEST}")):
        assert res.ok, f"{node.name}: build failed\n{res.err}"
    return obmm_cluster


def test_the_client_reads_the_exporters_pattern(built: UserCluster) -> None:
    node0, node1 = built.nodes
    exporter = node0.start(f"exec ./exporter {PORT}", cwd=DEST, ready_line="serving 'region'")
    res = node1.run(f"./client {node0.addr} {PORT}", cwd=DEST, timeout=120)
    assert res.exit_status == 0, res.err
    assert f"handle 'region' from {node0.addr}: node 0" in res.out
    assert "read node 0's pattern: 524288 words, 0 wrong" in res.out
    assert exporter.stop() == 0  # SIGTERM: it unexports and exits 0
    assert "exporter: unexported" in exporter.stdout


@pytest.mark.obmm_cluster(nodes=2)  # the shape can be given per test (same as pytest.ini here)
def test_a_test_fetches_the_handle_itself(built: UserCluster) -> None:
    node0, node1 = built.nodes
    node0.start(f"exec ./exporter {PORT} 4", cwd=DEST, ready_line="serving")
    assert node1.list_handles(node0, port=PORT) == ["region"]
    handle = node1.fetch_handle(node0, "region", port=PORT)
    assert handle.node_id == 0 and handle.length == 4 << 20
    # The exporter still runs: the plugin stops it after the test (it unexports on SIGTERM,
    # so the leak check passes).


def test_a_handle_made_in_the_test_is_served_to_the_client(built: UserCluster) -> None:
    node0, node1 = built.nodes
    node0.start(f"exec ./exporter {PORT}", cwd=DEST, ready_line="serving")
    handle = node1.fetch_handle(node0, port=PORT)
    # Republish it from node1 (obmm.exchange); the C client takes it from there.
    node1.serve_handles({"region": handle}, port=PORT + 1)
    res = node1.run(f"./client {node1.addr} {PORT + 1}", cwd=DEST)
    assert res.ok and "0 wrong" in res.out, res.err


def test_files_and_deadlines(built: UserCluster, tmp_path: Path) -> None:
    node0 = built.nodes[0]
    node0.get(f"{DEST}/exporter", tmp_path / "exporter")
    assert (tmp_path / "exporter").read_bytes()[:4] == b"\x7fELF"  # built in the guest
    (tmp_path / "note.txt").write_text("hello\n")
    node0.put(tmp_path / "note.txt", "/tmp/note/note.txt")
    assert node0.read_text("/tmp/note/note.txt") == "hello\n"
    with pytest.raises(CommandTimeout):
        node0.run("sleep 600", timeout=2)
    # The command's process group was killed at the deadline.
    comms = node0.run("cat /proc/[0-9]*/comm 2>/dev/null", check=False).out.split()
    assert "sleep" not in comms
