"""Self-tests of the guest runner against a real guest: splats and deaths are reported right.

They drive deliberately failing guest tests (tests/guest/_selftest/, inside tests/guest so the
guest's kernel-log check applies; the guest suites ignore it) and assert on the results.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from obmm.testbed.provision import GUEST_SELFTEST
from obmm.testbed.settings import scaled
from obmm.testbed.ssh import GuestGone
from obmm.testbed.suite.guest_suite import (
    GuestSession,
    GuestUnresponsive,
)
from obmm.testbed.vm.cluster import NodeDied

#: Bounds on how fast a failure is reported: seconds of this machine's pace, so `scaled`.
PANIC_BUDGET_S = 60.0
# The frozen-guest test's liveness timers: seconds, not the suite's 30 s + 20 s defaults.
HANG_PING_AFTER_S = 3.0
HANG_PING_TIMEOUT_S = 5.0


def test_ssh_passes_exit_status_and_both_streams(guest_session: GuestSession) -> None:
    with guest_session.connect(0) as conn:
        result = conn.run("echo out; echo err >&2; exit 7", timeout=60)
    assert (result.exit_status, result.out, result.err) == (7, "out\n", "err\n")


def test_ssh_large_output_on_both_streams_does_not_deadlock(guest_session: GuestSession) -> None:
    # 8 MiB per stream: far past paramiko's 2 MiB window, so an undrained stream would block.
    with guest_session.connect(0) as conn:
        result = conn.run(
            "head -c 8388608 /dev/zero | tr '\\0' o; head -c 8388608 /dev/zero | tr '\\0' e >&2",
            timeout=300,
        )
    assert result.exit_status == 0
    assert len(result.stdout) == len(result.stderr) == 8 << 20
    assert set(result.stdout) == {ord("o")} and set(result.stderr) == {ord("e")}


def test_ssh_deadline_is_enforced(guest_session: GuestSession) -> None:
    from obmm.testbed.ssh import CommandTimeout

    with guest_session.connect(0) as conn:
        start = time.monotonic()
        with pytest.raises(CommandTimeout):
            conn.run("echo started; sleep 600", timeout=3)
        assert time.monotonic() - start < scaled(10)
        # The connection is still usable after a timed-out command.
        assert conn.run("echo again", timeout=60).out == "again\n"


def test_guest_warn_fails_that_test_with_the_warn_text(guest_session: GuestSession) -> None:
    warn = f"{GUEST_SELFTEST}/test_warn.py::test_triggers_warn"
    clean = f"{GUEST_SELFTEST}/test_warn.py::test_after_warn_is_clean"
    run = guest_session.start([warn, clean])
    warned = run.wait(warn, timeout=scaled(600))
    assert warned.outcome in ("failed", "error"), warned
    assert "WARN requested by test" in warned.longrepr, warned.longrepr
    after = run.wait(clean, timeout=scaled(600))
    assert after.outcome == "passed", after.longrepr


@pytest.mark.destroys_cluster
def test_guest_that_stops_answering_fails_fast(guest_session: GuestSession) -> None:
    hang = f"{GUEST_SELFTEST}/test_hang.py::test_sleeps_long"
    cluster = guest_session.boot().cluster
    run = guest_session.start(
        [hang], ping_after_s=HANG_PING_AFTER_S, ping_timeout_s=HANG_PING_TIMEOUT_S
    )
    deadline = time.monotonic() + scaled(300)
    while run.parser.current != hang:
        assert time.monotonic() < deadline, "the guest test never started"
        time.sleep(0.2)
    qemu_pid = cluster.nodes[0].pid
    os.kill(qemu_pid, signal.SIGSTOP)  # QEMU alive, guest frozen: no panic, no exit
    try:
        start = time.monotonic()
        with pytest.raises(GuestUnresponsive, match="stopped answering"):
            run.wait(hang, timeout=900)
        assert time.monotonic() - start < HANG_PING_AFTER_S + HANG_PING_TIMEOUT_S + scaled(15)
        # Teardown copes with a frozen QEMU (its monitor never answers) in bounded time.
        start = time.monotonic()
        guest_session.close()
        assert time.monotonic() - start < scaled(20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(qemu_pid, signal.SIGKILL)
    assert not cluster.rundir.exists()
    assert not any(node.alive() for node in cluster.nodes)


@pytest.mark.destroys_cluster
def test_guest_panic_ends_the_run_fast_with_the_console_tail(guest_session: GuestSession) -> None:
    panic = f"{GUEST_SELFTEST}/test_panic.py::test_triggers_panic"
    never = f"{GUEST_SELFTEST}/test_panic.py::test_never_runs"
    cluster = guest_session.boot().cluster  # a fresh one if an earlier test destroyed the last
    run = guest_session.start([panic, never])
    start = time.monotonic()
    with pytest.raises(NodeDied) as died:
        run.wait(panic, timeout=scaled(600))
    elapsed = time.monotonic() - start
    assert elapsed < scaled(PANIC_BUDGET_S)
    assert "Kernel panic" in died.value.console_tail
    assert "panic requested by test" in str(died.value)
    with pytest.raises(GuestGone):
        run.wait(never, timeout=30)
    # Tearing down a cluster with a dead node leaves nothing behind.
    rundir = cluster.rundir
    guest_session.close()
    assert not rundir.exists()
    assert not any(node.alive() for node in cluster.nodes)


def test_copy_a_tree_in_and_a_file_out(guest_session: GuestSession, tmp_path: Path) -> None:
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    (src / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "sub" / "run.sh").chmod(0o755)
    with guest_session.connect(0) as conn:
        conn.run("rm -rf /tmp/copied && mkdir /tmp/copied", timeout=60, check=True)
        conn.put(src, "/tmp/copied")  # into an existing directory, like cp -r
        assert conn.run("cat /tmp/copied/tree/a.txt", timeout=60).out == "alpha\n"
        assert conn.run("/tmp/copied/tree/sub/run.sh", timeout=60).out == "ran\n"
        conn.run("hostname > /tmp/copied/hostname", timeout=60, check=True)
        conn.get("/tmp/copied/hostname", tmp_path / "hostname")
    assert (tmp_path / "hostname").read_text() == "node0\n"


def test_cli_finds_the_cluster_and_passes_exit_status_through(
    guest_session: GuestSession, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from obmm.testbed.cli import main as cli

    name = guest_session.boot().name
    assert cli.main(["status", "--name", name]) == 0
    assert "node0: running" in capfd.readouterr().out
    assert cli.main(["ssh", "0", "--name", name, "--", "echo", "hi;", "exit", "9"]) == 9
    assert capfd.readouterr().out == "hi\n"
    (tmp_path / "f").write_text("payload\n")
    assert cli.main(["cp", "--name", name, str(tmp_path / "f"), "node0:/tmp/f"]) == 0
    assert cli.main(["ssh", "--name", name, "node0", "--", "cat", "/tmp/f"]) == 0
    assert capfd.readouterr().out == "payload\n"
