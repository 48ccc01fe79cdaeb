"""A boot that hangs with a silent console is booted again (no VM boots: stand-ins).

The debug kernel has hung on a loaded host after "Running RCU-tasks wait API self tests", its
console silent until the boot timeout; a second boot of the same cluster came up.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_cluster import make_image, start_with, use_run_root, write_fake_qemu

from obmm.testbed.builds.image import Image
from obmm.testbed.topology import Topology
from obmm.testbed.vm import cluster as cl
from obmm.testbed.vm.timeline import READY_LINE, ConsoleWatch, Timeline

HUNG = "[    1.299320] Running RCU-tasks wait API self tests\n"


def _waiter(console: Path, stall: float | None) -> tuple[SimpleNamespace, SimpleNamespace]:
    node = SimpleNamespace(
        name="node1",
        console_log=console,
        alive=lambda: True,
        console_tail=lambda lines=40: console.read_text(),
    )
    return SimpleNamespace(boot_stall=stall, check_alive=lambda: None), node


def test_a_console_silent_past_the_stall_limit_is_a_stalled_boot(tmp_path: Path) -> None:
    console = tmp_path / "node1.console.log"
    console.write_text(HUNG)
    me, node = _waiter(console, 0.3)
    watch = ConsoleWatch(console, Timeline(), 1)
    t0 = time.monotonic()
    with pytest.raises(cl.BootStalled, match="RCU-tasks wait API self tests"):
        cl.Cluster._wait_console(me, node, watch, t0 + 30)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 10


def test_a_console_that_keeps_printing_is_waited_for(tmp_path: Path) -> None:
    """Each line restarts the stall clock: a boot slower than the limit but never silent that
    long reaches its ready line."""
    console = tmp_path / "node1.console.log"
    console.write_text("")
    me, node = _waiter(console, 0.5)
    watch = ConsoleWatch(console, Timeline(), 1)

    def boot() -> None:
        for i in range(10):
            time.sleep(0.15)
            with console.open("a") as f:
                f.write(f"[    {i}.000000] step {i}\n")
        with console.open("a") as f:
            f.write(READY_LINE + "\n")

    t = threading.Thread(target=boot)
    t.start()
    try:
        assert cl.Cluster._wait_console(me, node, watch, time.monotonic() + 30)  # type: ignore[arg-type]
    finally:
        t.join()


def test_without_a_limit_only_the_deadline_ends_the_wait(tmp_path: Path) -> None:
    console = tmp_path / "node1.console.log"
    console.write_text(HUNG)
    me, node = _waiter(console, None)
    watch = ConsoleWatch(console, Timeline(), 1)
    assert not cl.Cluster._wait_console(me, node, watch, time.monotonic() + 0.3)  # type: ignore[arg-type]


@pytest.fixture
def fake_qemu(tmp_path: Path) -> str:
    return str(write_fake_qemu(tmp_path))


@pytest.fixture
def fake_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Image:
    use_run_root(tmp_path, monkeypatch)
    return make_image(tmp_path)


def test_a_stalled_boot_is_booted_again_once(
    fake_image: Image, fake_qemu: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    attempts: list[list[int]] = []

    def stalls_once(self: cl.Cluster, timeout: float, progress: object = None) -> None:
        attempts.append([n.pid for n in self.nodes])
        assert self.boot_stall == cl.BOOT_STALL_S * 2.0  # scaled like the boot timeout
        if len(attempts) == 1:
            raise cl.BootStalled("node1: no console output for 120 s while booting")

    monkeypatch.setattr(cl.Cluster, "wait_ssh", stalls_once)
    cluster = start_with(
        fake_qemu, fake_image, Topology(nodes=2), name="stall", logdir=tmp_path / "logs",
        snapshot="off", timeout_scale=2.0,
    )  # fmt: skip
    try:
        assert len(attempts) == 2
        for pid in attempts[0]:
            assert cl._pid_start_time(pid) is None  # the hung boot's QEMUs are gone
        assert [n.pid for n in cluster.nodes] == attempts[1]
    finally:
        cluster.stop()


def test_a_boot_that_stalls_again_fails_and_leaves_nothing(
    fake_image: Image, fake_qemu: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    attempts: list[list[int]] = []

    def always_stalls(self: cl.Cluster, timeout: float, progress: object = None) -> None:
        attempts.append([n.pid for n in self.nodes])
        raise cl.BootStalled("node1: no console output for 60 s while booting")

    monkeypatch.setattr(cl.Cluster, "wait_ssh", always_stalls)
    with pytest.raises(cl.BootStalled):
        start_with(
            fake_qemu, fake_image, Topology(nodes=2), name="stall2", logdir=tmp_path / "logs",
            snapshot="off",
        )  # fmt: skip
    assert len(attempts) == 1 + cl.BOOT_RETRIES
    for pids in attempts:
        for pid in pids:
            assert cl._pid_start_time(pid) is None
    assert not cl.rundir_for("stall2").exists()
