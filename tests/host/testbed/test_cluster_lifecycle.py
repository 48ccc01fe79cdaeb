"""Cluster state, ports and cleanup, with stand-in processes instead of QEMU (no VM boots)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_cluster import make_image, start_with, use_run_root, write_fake_qemu

from obmm.testbed import arch
from obmm.testbed.builds.image import Image
from obmm.testbed.topology import Topology
from obmm.testbed.vm import cluster as cl
from obmm.testbed.vm import reaping
from obmm.testbed.vm.machine import Machine


@pytest.fixture
def run_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return use_run_root(tmp_path, monkeypatch)


@pytest.fixture
def fake_image(tmp_path: Path) -> Image:
    return make_image(tmp_path)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    # Stands in for a QEMU: a long-lived child that must be gone after stop().
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_ports_are_distinct_free_and_avoid_other_clusters() -> None:
    first = cl.allocate_ports(8)
    assert len(set(first)) == 8
    again = cl.allocate_ports(8, avoid=first)
    assert not set(first) & set(again)
    for port in again:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: binding succeeds


def test_run_dirs_are_per_name_on_the_run_root(run_root: Path) -> None:
    assert cl.rundir_for("a") == run_root / "obmm-testbed-a"
    assert cl.rundir_for("a") != cl.rundir_for("b")
    for bad in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(cl.ClusterError):
            cl.rundir_for(bad)


def test_default_run_root_is_tmpfs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OBMM_TESTBED_RUN_ROOT", raising=False)
    assert cl.run_root() == Path("/dev/shm")


def test_attach_to_a_missing_cluster_is_a_clear_error(run_root: Path) -> None:
    with pytest.raises(cl.ClusterError, match="no cluster named 'ghost'"):
        cl.Cluster.attach("ghost")


def _cluster_with(run_root: Path, image: Image, proc: subprocess.Popen[bytes], name: str
                  ) -> cl.Cluster:  # fmt: skip
    rundir = cl.rundir_for(name)
    rundir.mkdir(parents=True)
    (rundir / "node0.ram").write_bytes(b"\0" * 4096)
    node = cl.NodeProcess(
        index=0, ssh_port=cl.allocate_ports(1)[0], pid=proc.pid,
        pid_start=cl._pid_start_time(proc.pid), console_log=rundir / "c.log",
        qemu_log=rundir / "q.log", qmp_socket=rundir / "node0.qmp", overlay=rundir / "o.qcow2",
    )  # fmt: skip
    c = cl.Cluster(name=name, rundir=rundir, logdir=rundir, topology=Topology(),
                   accel="tcg", image=image, nodes=[node])  # fmt: skip
    c.save()
    return c


def test_state_is_discoverable_by_a_later_invocation(
    run_root: Path, fake_image: Image, sleeper: subprocess.Popen[bytes]
) -> None:
    c = _cluster_with(run_root, fake_image, sleeper, "x")
    again = cl.Cluster.attach("x")
    assert again.nodes[0].pid == sleeper.pid
    assert again.nodes[0].ssh_port == c.nodes[0].ssh_port
    assert again.nodes[0].alive()
    assert cl.Cluster.names() == ["x"]


def test_stop_kills_the_processes_and_removes_the_run_dir(
    run_root: Path, fake_image: Image, sleeper: subprocess.Popen[bytes]
) -> None:
    _cluster_with(run_root, fake_image, sleeper, "x")
    c = cl.Cluster.attach("x")  # as `down` does: no Popen handle, only the pid
    start = time.monotonic()
    c.stop()
    assert time.monotonic() - start < 15
    sleeper.wait(timeout=5)
    assert sleeper.returncode == -signal.SIGTERM
    assert not cl.rundir_for("x").exists()


def test_a_recycled_pid_is_not_mistaken_for_the_node(
    run_root: Path, fake_image: Image, sleeper: subprocess.Popen[bytes]
) -> None:
    c = _cluster_with(run_root, fake_image, sleeper, "x")
    node = c.nodes[0]
    node.pid_start = (node.pid_start or 0) + 1
    c.save()
    assert not cl.Cluster.attach("x").nodes[0].alive()


def test_starting_over_a_live_cluster_is_refused(
    run_root: Path, fake_image: Image, sleeper: subprocess.Popen[bytes]
) -> None:
    _cluster_with(run_root, fake_image, sleeper, "x")
    with pytest.raises(cl.ClusterError, match="already running"):
        cl.Cluster.start(Machine(fake_image, Topology()), name="x", wait=False)
    assert sleeper.poll() is None  # the running cluster was left alone


def test_stale_state_of_a_dead_cluster_is_reaped(
    run_root: Path, fake_image: Image, sleeper: subprocess.Popen[bytes]
) -> None:
    _cluster_with(run_root, fake_image, sleeper, "x")
    sleeper.kill()
    sleeper.wait()
    assert reaping.stop_all_stale() == ["x"]
    assert not cl.rundir_for("x").exists()


def test_qemu_that_fails_to_start_leaves_nothing_behind(
    run_root: Path, fake_image: Image, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    qemu_bin = "false"
    with pytest.raises(cl.ClusterError, match="QEMU failed to start"):
        start_with(qemu_bin, fake_image, Topology(nodes=2), name="y", logdir=tmp_path / "logs")
    assert not cl.rundir_for("y").exists()
    assert list(run_root.iterdir()) == []  # no lock or other file left on tmpfs
    assert (tmp_path / "logs" / "node0.qemu.log").read_text().startswith("$ false ")


def test_fast_boot_of_an_image_without_its_initramfs_says_what_to_use_and_leaves_nothing(
    run_root: Path, fake_image: Image, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    qemu_bin = "false"
    (fake_image.directory / "initrd-fast.img").unlink()
    with pytest.raises(cl.ClusterError, match="no fast-boot initramfs; use --init systemd"):
        start_with(qemu_bin, fake_image, Topology(nodes=2), name="z", logdir=tmp_path / "logs")
    assert list(run_root.iterdir()) == []
    # The distribution boot needs only what every image has.
    with pytest.raises(cl.ClusterError, match="QEMU failed to start"):
        start_with(
            qemu_bin,
            fake_image,
            Topology(nodes=1),
            name="z",
            init="systemd",
            logdir=tmp_path / "l",
        )
    systemd_argv = (tmp_path / "l" / "node0.qemu.log").read_text()
    assert "systemd.hostname=node0" in systemd_argv
    assert "-bios" not in systemd_argv  # the real-host-like boot keeps SeaBIOS


def test_fast_boot_uses_qboot_when_qemu_ships_it(
    run_root: Path, fake_image: Image, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    qemu_bin = "false"
    qboot = tmp_path / "qboot.rom"
    qboot.write_bytes(b"rom")
    # The fast boot's firmware is the architecture's (obmm.testbed.arch).
    x86 = dataclasses.replace(arch.X86_64, fast_firmware=str(qboot))
    monkeypatch.setitem(arch.ARCHS, "x86_64", x86)
    with pytest.raises(cl.ClusterError, match="QEMU failed to start"):
        start_with(qemu_bin, fake_image, Topology(nodes=1), name="q", logdir=tmp_path / "l")
    assert f"-bios {qboot} " in (tmp_path / "l" / "node0.qemu.log").read_text()
    qboot.unlink()
    with pytest.raises(cl.ClusterError, match="QEMU failed to start"):
        start_with(qemu_bin, fake_image, Topology(nodes=1), name="q", logdir=tmp_path / "m")
    assert "-bios" not in (tmp_path / "m" / "node0.qemu.log").read_text()


def test_interrupt_during_boot_kills_every_node_and_removes_files(
    run_root: Path, fake_image: Image, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    qemu_bin = str(write_fake_qemu(tmp_path))
    pids: list[int] = []

    def interrupted(self: cl.Cluster, timeout: float, progress: object = None) -> None:
        pids.extend(n.pid for n in self.nodes)
        raise KeyboardInterrupt

    monkeypatch.setattr(cl.Cluster, "wait_ssh", interrupted)
    with pytest.raises(KeyboardInterrupt):
        start_with(qemu_bin, fake_image, Topology(nodes=2), name="z", logdir=tmp_path / "logs")
    assert len(pids) == 2
    for pid in pids:
        assert cl._pid_start_time(pid) is None  # gone (or a reaped zombie)
    assert not cl.rundir_for("z").exists()
    assert list(run_root.iterdir()) == []


def test_boot_timeout_scales_with_nodes_under_tcg() -> None:
    one = cl.boot_timeout(Topology(nodes=1), "tcg")
    eight = cl.boot_timeout(Topology(nodes=8), "tcg")
    assert 60 <= one < eight
    assert cl.boot_timeout(Topology(nodes=1), "kvm") < one


def test_load_topology_by_name_or_path(tmp_path: Path) -> None:
    assert cl.load_topology("pair").nodes == 2
    spec = tmp_path / "three.json"
    spec.write_text('{"nodes": 3, "memory_mib": 512, "pool_mib": 64, "cpus": 1}')
    assert cl.load_topology(str(spec)).nodes == 3


def test_stop_does_not_hang_on_a_wedged_monitor(
    run_root: Path, fake_image: Image, sleeper: subprocess.Popen[bytes]
) -> None:
    c = _cluster_with(run_root, fake_image, sleeper, "w")
    # A monitor socket that accepts but never greets, like a SIGSTOPped QEMU's.
    mon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mon.bind(str(c.nodes[0].qmp_socket))
    mon.listen(1)
    try:
        start = time.monotonic()
        cl.Cluster.attach("w").stop()
        assert time.monotonic() - start < cl.QMP_QUIT_TIMEOUT_S + cl.TERM_TIMEOUT_S + 5
    finally:
        mon.close()
    sleeper.wait(timeout=5)
    assert not cl.rundir_for("w").exists()


def test_an_unknown_init_is_refused_before_anything_starts(
    run_root: Path, fake_image: Image
) -> None:
    with pytest.raises(cl.ClusterError, match="init must be one of fast, systemd, got 'runit'"):
        cl.Cluster.start(Machine(fake_image, Topology(), init="runit"), name="r")
    assert not run_root.exists() or list(run_root.iterdir()) == []


OWNER_SCRIPT = """\
import sys, time
from pathlib import Path
from obmm.testbed.topology import Topology
from obmm.testbed.vm import cluster as cl
from obmm.testbed.vm.machine import Machine
from obmm.testbed import arch
from obmm.testbed.builds.image import Image
image = Image.open(Path(sys.argv[1]))
detach = sys.argv[3] == "detach"
c = cl.Cluster.start(Machine(image, Topology(nodes=2), qemu_binary=sys.argv[5]),
                     name=sys.argv[2], detach=detach, wait=sys.argv[4] == "wait", timeout=600)
print(" ".join(str(n.pid) for n in c.nodes), c.hub_pid, flush=True)
time.sleep(600)
"""


def _owner(run_root: Path, image: Image, name: str, fake: Path, detach: str, wait: str
           ) -> subprocess.Popen[str]:  # fmt: skip
    env = {**os.environ, "OBMM_TESTBED_RUN_ROOT": str(run_root)}
    return subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, str(image.directory), name, detach, wait, str(fake)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def _gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while cl._pid_start_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return cl._pid_start_time(pid) is None


def test_a_killed_owners_cluster_is_removed_by_the_next_command_and_no_other(
    run_root: Path, fake_image: Image, tmp_path: Path
) -> None:
    """An owner SIGKILLed while its cluster runs (the `run` of the issue): its QEMUs and hub die
    with it, its run directory (RAM files: host memory) stays until the reaper, which leaves a
    live owner's cluster and one owned by nobody (`up`) alone."""
    fake = write_fake_qemu(tmp_path)
    owner = _owner(run_root, fake_image, "dead", fake, "own", "nowait")
    assert owner.stdout is not None
    *qemus, hub = (int(w) for w in owner.stdout.readline().split())
    mine = start_with(str(fake), fake_image, Topology(nodes=1), name="mine", wait=False)
    kept = start_with(str(fake), fake_image, Topology(nodes=1), name="kept", wait=False,
                      detach=True)  # fmt: skip
    kept.disown()
    try:
        owner.kill()
        owner.wait()
        assert all(_gone(pid) for pid in (*qemus, hub))  # they die with their owner
        assert cl.rundir_for("dead").is_dir()  # ... but the RAM files stay
        assert reaping.reap_dead_owners() == ["dead"]
        assert not cl.rundir_for("dead").exists()
        assert cl.rundir_for("mine").is_dir() and cl.rundir_for("kept").is_dir()
        assert reaping.reap_dead_owners() == []
    finally:
        mine.stop()
        cl.Cluster.attach("kept").stop()
    assert list(run_root.iterdir()) == []


def test_up_killed_while_booting_leaves_nothing_after_the_next_command(
    run_root: Path, fake_image: Image, tmp_path: Path
) -> None:
    """`up` owns its cluster until the nodes are ready (then nobody does): killed while it
    waits for SSH, its QEMUs (started to outlive it) are stopped by the reaper."""
    fake = write_fake_qemu(tmp_path)
    owner = _owner(run_root, fake_image, "booting", fake, "detach", "wait")
    try:
        state = cl.rundir_for("booting") / cl.STATE_FILE
        deadline = time.monotonic() + 30
        while not state.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pids = [n.pid for n in cl.Cluster.attach("booting").nodes]
    finally:
        owner.kill()
        owner.wait()
    assert not any(_gone(pid, 1.0) for pid in pids)  # detached: they outlived their owner
    assert reaping.reap_dead_owners() == ["booting"]
    assert all(_gone(pid) for pid in pids)
    assert list(run_root.iterdir()) == []


DOWN_SCRIPT = """\
import sys, time
from obmm.testbed.vm import cluster as cl
def stuck(self):  # the teardown under way when the SIGKILL comes
    print("stopping", flush=True)
    time.sleep(600)
cl.Cluster._stop = stuck
cl.Cluster.attach(sys.argv[1]).stop()
"""


def test_a_down_killed_while_it_stops_leaves_nothing_after_the_next_command(
    run_root: Path, fake_image: Image, tmp_path: Path
) -> None:
    """A cluster owned by nobody (`up`) becomes its stopper's: a `down` SIGKILLed during the
    teardown leaves its hub and run directory to the reaper, not until another `down`."""
    fake = write_fake_qemu(tmp_path)
    kept = start_with(str(fake), fake_image, Topology(nodes=2), name="kept", wait=False,
                      detach=True)  # fmt: skip
    kept.disown()
    pids = [n.pid for n in kept.nodes] + [kept.hub_pid]
    env = {**os.environ, "OBMM_TESTBED_RUN_ROOT": str(run_root)}
    down = subprocess.Popen([sys.executable, "-c", DOWN_SCRIPT, "kept"], stdout=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip
    try:
        assert down.stdout is not None and "stopping" in down.stdout.readline()
    finally:
        down.kill()
        down.wait()
    try:
        assert reaping.reap_dead_owners() == ["kept"]
        assert all(_gone(pid) for pid in pids if pid is not None)
        assert list(run_root.iterdir()) == []
    finally:
        if cl.rundir_for("kept").exists():
            cl.Cluster.attach("kept").stop()


def test_a_cluster_of_nobody_is_reaped_once_nothing_of_it_runs(
    run_root: Path, fake_image: Image, tmp_path: Path
) -> None:
    """An `up` cluster whose QEMUs and hub died (a host OOM kill), and a run directory from
    before owners were recorded (no owner file): only their RAM files are left, holding host
    memory, and the next command removes them; `gc` had said "nothing left behind"."""
    fake = write_fake_qemu(tmp_path)
    names = ("kept", "legacy")
    for name in names:
        cluster = start_with(str(fake), fake_image, Topology(nodes=2), name=name,
                             wait=False, detach=True)  # fmt: skip
        cluster.disown()
    (cl.rundir_for("legacy") / cl.OWNER_FILE).unlink()
    try:
        assert reaping.reap_dead_owners() == []  # both run: left alone
        for name in names:
            cluster = cl.Cluster.attach(name)
            for pid in [n.pid for n in cluster.nodes] + [cluster.hub_pid]:
                if pid is None:
                    continue  # one node: no hub
                os.kill(pid, signal.SIGKILL)
                assert _gone(pid)
        assert reaping.reap_dead_owners() == ["kept", "legacy"]
        assert list(run_root.iterdir()) == []
    finally:
        for name in names:
            if cl.rundir_for(name).exists():
                cl.Cluster.attach(name).stop()


def test_state_written_by_another_version_is_a_clear_error_and_never_stops_the_reaper(
    run_root: Path, fake_image: Image, sleeper: subprocess.Popen[bytes]
) -> None:
    """A cluster whose state names a topology key this version lacks (another version's `up`):
    `attach` says so and how to get rid of it; the reaper neither crashes on it (every command
    runs the reaper first) nor touches it while it has no dead owner."""
    _cluster_with(run_root, fake_image, sleeper, "newer")
    state_file = cl.rundir_for("newer") / cl.STATE_FILE
    state = json.loads(state_file.read_text())
    state["topology"]["from_the_future"] = 1
    state_file.write_text(json.dumps(state))
    with pytest.raises(cl.ClusterError, match="another obmm-testbed version") as info:
        cl.Cluster.attach("newer")
    assert str(cl.rundir_for("newer")) in str(info.value)
    assert reaping.reap_dead_owners() == []
    assert cl.rundir_for("newer").is_dir()
