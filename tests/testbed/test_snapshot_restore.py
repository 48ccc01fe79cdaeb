"""Cluster snapshots against real QEMU: saved after a cold boot, restored in seconds, refused
(then a cold boot) when corrupt or truncated, never used for another cluster shape."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from obmm.testbed.builds.image import Image, ensure_image
from obmm.testbed.paths import results_dir
from obmm.testbed.topology import Topology
from obmm.testbed.vm import cluster as cl
from obmm.testbed.vm import snapshot
from obmm.testbed.vm.machine import Machine

# One worker runs this module (conftest.group): each test starts from the snapshot of this
# shape the one before it left.
# A shape of its own (the suites use 1024/256), so this test never disturbs their snapshots.
TOPOLOGY = Topology(nodes=1, memory_mib=512, pool_mib=128)
CLOCK_SLACK_S = 5.0


@pytest.fixture(scope="module")
def image() -> Image:
    return ensure_image()


def _start(image: Image, topology: Topology, logs: Path) -> cl.Cluster:
    return cl.Cluster.start(
        Machine(image, topology),
        name=f"snaptest-{time.monotonic_ns()}",
        logdir=logs,
        snapshot="auto",
    )


@pytest.fixture
def logs() -> Iterator[Path]:
    d = results_dir() / "qemu" / "snapshot-test"
    d.mkdir(parents=True, exist_ok=True)
    yield d


def _key_dir(c: cl.Cluster) -> Path:
    return snapshot.snapshots_dir() / c._snapshot_key(None).digest


def test_cold_boot_saves_and_the_next_cluster_is_restored_clean(image: Image, logs: Path) -> None:
    with _start(image, TOPOLOGY, logs) as first:
        snapshot.discard(snapshot.Snapshot(_key_dir(first), {}))
    # Now nothing is saved for this shape: this boot is cold and saves one.
    with _start(image, TOPOLOGY, logs) as cold:
        assert cold.restored_from is None
        saved = _key_dir(cold)
        assert (saved / snapshot.MANIFEST).is_file()
        with cold.connect(0) as conn:
            conn.run("echo old-run > /tmp/marker", timeout=60, check=True)
        cold_rundir = cold.rundir
    assert not cold_rundir.exists()
    start = time.monotonic()
    with _start(image, TOPOLOGY, logs) as warm:
        restore_s = time.monotonic() - start
        assert warm.restored_from == saved.name
        with warm.connect(0) as conn:
            # Nothing of the earlier run is visible; the clock is the host's.
            assert conn.run("cat /tmp/marker", timeout=60).exit_status != 0
            guest_now = float(conn.run("date +%s.%N", timeout=60, check=True).out)
            assert abs(guest_now - time.time()) < CLOCK_SLACK_S
            assert conn.run("echo ok", timeout=60).out == "ok\n"
        rundir, nodes = warm.rundir, list(warm.nodes)
    assert not rundir.exists()
    assert not any(n.alive() for n in nodes)
    print(f"restore to SSH: {restore_s:.1f} s")


@pytest.mark.parametrize("damage", ["corrupt-state", "truncated-ram"])
def test_damaged_snapshot_falls_back_to_a_cold_boot_with_a_message(
    image: Image, logs: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with _start(image, TOPOLOGY, logs) as c:
        saved = _key_dir(c)
    assert (saved / snapshot.MANIFEST).is_file()
    if damage == "corrupt-state":
        state = saved / "node0.state"
        data = bytearray(state.read_bytes())
        data[len(data) // 2 : len(data) // 2 + 64] = b"\xa5" * 64
        state.write_bytes(bytes(data))
        reason = "node0.state does not match its checksum"
    else:
        ram = saved / "node0.ram"
        with ram.open("r+b") as f:
            f.truncate(ram.stat().st_size // 2)
        reason = "node0.ram is"
    capsys.readouterr()
    with _start(image, TOPOLOGY, logs) as c:
        assert c.restored_from is None
        with c.connect(0) as conn:
            assert conn.run("echo ok", timeout=60).out == "ok\n"
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "snapshot not used" in out and reason in out, out
    # The bad snapshot was replaced by a good one from the cold boot.
    snap = snapshot.Snapshot.open(saved)
    snap.verify_states()


def test_another_cluster_shape_never_uses_the_snapshot(image: Image, logs: Path) -> None:
    with _start(image, TOPOLOGY, logs) as c:
        assert (_key_dir(c) / snapshot.MANIFEST).is_file()
    other = Topology(nodes=1, memory_mib=512, pool_mib=192)
    with _start(image, other, logs) as c:
        assert c.restored_from is None
        snapshot.discard(snapshot.Snapshot(_key_dir(c), {}))
