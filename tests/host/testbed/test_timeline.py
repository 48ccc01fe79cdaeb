"""The start's timeline: console steps on the host's clock, the guest clock's zero, the state
file round trip and what `up -v` / `status` print."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from obmm.testbed.vm import cluster as cluster_mod
from obmm.testbed.vm import timeline as tl


class Clock:
    """A timeline whose `now` the test sets."""

    def __init__(self, timeline: tl.Timeline) -> None:
        self.t = 0.0
        timeline.now = lambda: self.t  # type: ignore[method-assign]


def _console(tmp_path: Path) -> Path:
    return tmp_path / "node0.console.log"


def test_console_steps_get_the_host_time_they_were_first_seen(tmp_path: Path) -> None:
    path = _console(tmp_path)
    timeline = tl.Timeline()
    clock = Clock(timeline)
    watch = tl.ConsoleWatch(path, timeline, 0)
    watch.poll()  # no file yet: nothing
    assert timeline.nodes == {}
    clock.t = 1.0
    path.write_bytes(b"Probing EDD (edd=off to disable)... ok\r\n")
    watch.poll()
    clock.t = 3.0
    with path.open("ab") as f:  # held in the log buffer, printed at the console's start
        f.write(b"[    0.000000] Linux version 6.1.0\r\n[    0.050000] Kernel command line: x\r\n")
        f.write(b"[    0.900000] late line\r\n[    2.000000] Run /init as init ")
    watch.poll()
    clock.t = 3.5
    with path.open("ab") as f:  # the rest of a line arrives in the next read
        f.write(b"process\r\n[    2.400000] obmm-init: starting sshd\r\n")
    watch.poll()
    clock.t = 6.0
    with path.open("ab") as f:
        f.write(
            b"[    4.950000] obmm-init: sshd listening\r\n[    5.0] obmm-init: sshd listening\n"
        )
    watch.poll()
    steps = timeline.nodes[0]
    assert steps["console"] == 1.0
    # The guest clock's zero: the smallest seen - printed, over the lines with a time.
    assert steps["kernel"] == pytest.approx(6.0 - 5.0)
    assert steps["init"] == 3.5 and steps["userland"] == 3.5 and steps["sshd"] == 6.0
    assert timeline.guest[0] == {"init": 2.0, "userland": 2.4, "sshd": 4.95}
    assert watch.seen("sshd")


def test_a_console_read_after_the_fact_gives_guest_times_only(tmp_path: Path) -> None:
    path = _console(tmp_path)
    path.write_bytes(b"[    3.400000] Run /init as init process\n")
    timeline = tl.Timeline()
    tl.ConsoleWatch(path, timeline, 1).poll(live=False)
    assert timeline.guest == {1: {"init": 3.4}}
    assert timeline.nodes.get(1, {}) == {}


def test_the_first_mark_of_a_step_stands_and_the_state_round_trip_keeps_all() -> None:
    timeline = tl.Timeline(kind="restore")
    clock = Clock(timeline)
    clock.t = 0.5
    timeline.mark("bring_up")
    timeline.mark("qemu", 0)
    clock.t = 0.9
    timeline.mark("qemu", 0)  # again: ignored
    timeline.mark("login", 0)
    timeline.mark_cpu("node0", 1.234)
    timeline.mark_cpu("node1", None)
    assert timeline.nodes == {0: {"qemu": 0.5, "login": 0.9}}
    assert timeline.phases(0) == [("qemu", 0.5), ("login", 0.4)]
    back = tl.Timeline.from_dict(timeline.to_dict())
    assert back is not None
    assert back.to_dict() == timeline.to_dict()
    assert tl.Timeline.from_dict(None) is None
    lines = back.format()
    assert lines[0].startswith("timeline of the restore")
    assert lines[1] == "  command: bring_up 0.50"
    assert lines[2] == "  node0: qemu 0.50  login 0.90  (QEMU CPU 1.23)"


def test_format_orders_steps_as_they_happen_in_a_start_and_shows_guest_times() -> None:
    timeline = tl.Timeline(
        kind="boot",
        cluster={"ready": 9.0, "bring_up": 0.4, "returned": 9.1},
        nodes={0: {"sshd": 7.0, "qemu": 0.6, "init": 4.0}},
        guest={0: {"init": 3.4, "sshd": 6.4}},
        cpu={"command": 0.8},
    )
    assert timeline.format()[1:] == [
        "  command: bring_up 0.40  ready 9.00  returned 9.10  (CPU 0.80)",
        "  node0: qemu 0.60  init 4.00 [3.40]  sshd 7.00 [6.40]",
    ]


def test_the_process_start_is_before_now_and_cpu_seconds_of_a_gone_pid_is_none() -> None:
    start = tl.process_start()
    assert start <= time.monotonic()
    assert time.monotonic() - start < 3600
    own = tl.cpu_seconds(__import__("os").getpid())
    assert own is not None and own >= 0
    assert tl.cpu_seconds(2**22 + 12345) is None


def test_a_port_counts_as_bound_once_something_listens_on_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert not cluster_mod._listening(port)
        s.listen()
        assert cluster_mod._listening(port)
