"""The inter-node guest network: hub forwarding, QEMU wiring, and the hub's life cycle.

No VM boots: fake node sockets stand in for QEMU's dgram netdevs, and a shell script for QEMU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_cluster import make_image, start_with, use_run_root, write_fake_qemu

from obmm.testbed.builds.image import Image
from obmm.testbed.topology import MAX_NODES, Topology
from obmm.testbed.vm import cluster as cl
from obmm.testbed.vm import hub as hub_mod
from obmm.testbed.vm import qemu, reaping

MAC = [bytes([0x52, 0x54, 0, 0x4F, 0, i]) for i in range(3)]
BROADCAST = b"\xff" * 6


def frame(dst: bytes, src: bytes, payload: bytes = b"x" * 50) -> bytes:
    return dst + src + b"\x08\x00" + payload


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path can be longer.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="obmm-net-") as d:
        yield Path(d)


class FakeNode:
    def __init__(self, rundir: Path, index: int) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(qemu.net_socket(rundir, index)))
        self.sock.settimeout(0.5)
        self.hub = str(qemu.hub_socket(rundir))

    def send(self, data: bytes) -> None:
        self.sock.sendto(data, self.hub)

    def recv(self) -> bytes | None:
        try:
            return self.sock.recv(65536)
        except socket.timeout:
            return None


def test_hub_broadcasts_then_forwards_learned_unicast_only_to_its_owner(short_dir: Path) -> None:
    hub = hub_mod.Hub(short_dir, 3)
    nodes = [FakeNode(short_dir, i) for i in range(3)]
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            if not hub.forward_one():
                time.sleep(0.005)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        arp = frame(BROADCAST, MAC[0])
        nodes[0].send(arp)
        assert nodes[1].recv() == arp and nodes[2].recv() == arp
        assert nodes[0].recv() is None  # never echoed to the sender
        reply = frame(MAC[0], MAC[1])
        nodes[1].send(reply)
        assert nodes[0].recv() == reply
        assert nodes[2].recv() is None  # learned: unicast goes to its owner only
        unknown = frame(MAC[2], MAC[0])  # node 2 has not spoken yet: flooded
        nodes[0].send(unknown)
        assert nodes[1].recv() == unknown and nodes[2].recv() == unknown
    finally:
        stop.set()
        t.join(timeout=5)
        hub.close()
    assert not qemu.hub_socket(short_dir).exists()


def test_hub_drops_frames_for_absent_nodes_and_from_strangers(short_dir: Path) -> None:
    hub = hub_mod.Hub(short_dir, 2)
    try:
        node0 = FakeNode(short_dir, 0)  # node 1 never started: its socket does not exist
        node0.send(frame(BROADCAST, MAC[0]))
        assert hub.forward_one()
        assert hub.dropped == 1 and hub.forwarded == 0
        stranger = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        stranger.bind(str(short_dir / "stranger"))
        stranger.sendto(frame(BROADCAST, MAC[2]), str(qemu.hub_socket(short_dir)))
        assert hub.forward_one()
        assert hub.dropped == 2
        stranger.close()
    finally:
        hub.close()


def _start_hub(rundir: Path, nodes: int = 2) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "obmm.testbed.vm.hub", str(rundir), str(nodes)])
    deadline = time.monotonic() + 15
    while not qemu.hub_socket(rundir).exists():
        assert proc.poll() is None and time.monotonic() < deadline, "hub did not start"
        time.sleep(0.05)
    return proc


def test_hub_process_exits_when_its_run_directory_goes(short_dir: Path) -> None:
    rundir = short_dir / "run"
    rundir.mkdir()
    proc = _start_hub(rundir)
    try:
        for p in rundir.iterdir():
            p.unlink()
        rundir.rmdir()
        assert proc.wait(timeout=hub_mod.WATCH_INTERVAL_S + 5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_hub_process_exits_on_sigterm_and_removes_its_socket(short_dir: Path) -> None:
    proc = _start_hub(short_dir)
    proc.terminate()
    assert proc.wait(timeout=5) == 0
    assert not qemu.hub_socket(short_dir).exists()


# -- QEMU wiring -------------------------------------------------------------------------------

RUN = Path("/dev/shm/obmm-testbed-t")


def _launch(index: int) -> qemu.NodeLaunch:
    return qemu.NodeLaunch(
        index=index, ssh_port=40022, rundir=RUN, overlay=RUN / "o.qcow2",
        console_log=Path("/logs/c.log"), qmp_socket=RUN / "q.qmp", pidfile=RUN / "p.pid",
        kernel=Path("/k"), initrd=Path("/i"),
    )  # fmt: skip


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_multi_node_clusters_get_a_nic_on_the_hub_over_unix_sockets_only() -> None:
    argv = qemu.build_argv(Topology(nodes=3), _launch(2))
    netdevs = _pairs(argv, "-netdev")
    assert (
        f"dgram,id=fabric,local.type=unix,local.path={RUN}/node2.net,"
        f"remote.type=unix,remote.path={RUN}/hub.sock"
    ) in netdevs
    assert "virtio-net-pci,netdev=fabric,mac=52:54:00:4f:00:02,bus=pcie.0,addr=0x04" in _pairs(
        argv, "-device"
    )
    # Host side: the SSH forward on loopback and unix sockets; no other address, no multicast.
    for nd in netdevs:
        assert nd.startswith("dgram,") or "hostfwd=tcp:127.0.0.1:" in nd
        assert "inet" not in nd and "mcast" not in nd and "udp" not in nd


def test_a_single_node_has_no_inter_node_nic() -> None:
    argv = qemu.build_argv(Topology(nodes=1), _launch(0))
    assert not any("fabric" in a for a in argv)


def test_guest_addresses_are_link_local_and_distinct() -> None:
    addrs = [qemu.fabric_ip(i) for i in range(MAX_NODES)]
    assert len(set(addrs)) == MAX_NODES
    assert all(a.startswith("169.254.") for a in addrs)
    assert qemu.fabric_ip(0) == "169.254.100.10" and qemu.fabric_ip(1) == "169.254.100.11"
    cmd = qemu.fabric_net_command(1)
    assert "52:54:00:4f:00:01" in cmd and "169.254.100.11/16" in cmd


# -- life cycle with the cluster ----------------------------------------------------------------


@pytest.fixture
def run_root(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return use_run_root(short_dir, monkeypatch)


@pytest.fixture
def fake_image(short_dir: Path) -> Image:
    return make_image(short_dir)


@pytest.fixture
def fake_qemu(short_dir: Path) -> str:
    return str(write_fake_qemu(short_dir))


def _gone(pid: int) -> bool:
    return cl._pid_start_time(pid) is None


def test_hub_starts_with_a_multi_node_cluster_and_stops_with_it(
    run_root: Path, fake_image: Image, fake_qemu: str, short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(cl.Cluster, "wait_ssh", lambda self, timeout, progress=None: None)
    c = start_with(fake_qemu, fake_image, Topology(nodes=2), name="n", logdir=short_dir / "l")
    try:
        state = json.loads(c.state_file.read_text())
        assert state["hub_pid"] == c.hub_pid and c.hub_alive()
        assert qemu.hub_socket(c.rundir).exists()
        again = cl.Cluster.attach("n")  # `down` from another process finds the hub too
        assert again.hub_alive()
    finally:
        hub_pid = c.hub_pid
        cl.Cluster.attach("n").stop()
    assert hub_pid is not None
    deadline = time.monotonic() + 5
    while not _gone(hub_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    c.stop()  # reaps the hub child of this process
    assert _gone(hub_pid)
    assert not c.rundir.exists()
    assert list(run_root.iterdir()) == []


def test_a_single_node_cluster_runs_no_hub(
    run_root: Path, fake_image: Image, fake_qemu: str, short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(cl.Cluster, "wait_ssh", lambda self, timeout, progress=None: None)
    with start_with(fake_qemu, fake_image, Topology(nodes=1), name="s",
                          logdir=short_dir / "l") as c:  # fmt: skip
        assert c.hub_pid is None
    assert not c.rundir.exists()


def test_interrupt_during_boot_stops_the_hub_too(
    run_root: Path, fake_image: Image, fake_qemu: str, short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    seen: list[int] = []

    def interrupted(self: cl.Cluster, timeout: float, progress: object = None) -> None:
        assert self.hub_pid is not None
        seen.append(self.hub_pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(cl.Cluster, "wait_ssh", interrupted)
    with pytest.raises(KeyboardInterrupt):
        start_with(fake_qemu, fake_image, Topology(nodes=2), name="i", logdir=short_dir / "l")
    assert seen and _gone(seen[0])
    assert list(run_root.iterdir()) == []


def test_hub_dies_with_its_owner(short_dir: Path) -> None:
    # A non-detached cluster's hub gets PR_SET_PDEATHSIG: SIGKILL of the owner ends it.
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from obmm.testbed.topology import Topology\n"
        "from obmm.testbed.vm import cluster as cl\n"
        f"d = Path({str(short_dir)!r})\n"
        "c = cl.Cluster(name='o', rundir=d, logdir=d,"
        " topology=Topology(nodes=2), accel='tcg', image=None)  # type: ignore\n"
        "c._start_hub(detach=False)\n"
        "print(c.hub_pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert owner.stdout is not None
        hub_pid = int(owner.stdout.readline())
        assert not _gone(hub_pid)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 5
        while not _gone(hub_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(hub_pid)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_down_all_reaps_a_hub_whose_nodes_died(
    run_root: Path, fake_image: Image, fake_qemu: str, short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(cl.Cluster, "wait_ssh", lambda self, timeout, progress=None: None)
    c = start_with(fake_qemu, fake_image, Topology(nodes=2), name="d", logdir=short_dir / "l")
    try:
        for node in c.nodes:
            os.kill(node.pid, 9)
            assert node.popen is not None
            node.popen.wait()
        assert c.hub_alive()
        assert reaping.stop_all_stale() == ["d"]
        assert c.hub_popen is not None
        c.hub_popen.wait(timeout=10)
        assert not c.hub_alive()
        assert not c.rundir.exists()
    finally:
        c.stop()
