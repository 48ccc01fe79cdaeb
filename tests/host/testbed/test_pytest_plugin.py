"""The pytest plugin for other projects, without a VM: registered, inert, its node API.

Nodes are local shells (local_remote.LocalRemoteNode), so the command lines the plugin sends
to a guest (setsid process groups, pidfiles, the deadline kill) run here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from local_remote import LocalRemoteNode

from obmm.testbed.remote import ProcessTimeout
from obmm.testbed.ssh import CommandTimeout
from obmm.testbed.usercluster import ObmmState


def _pytest(tmp: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp / "test_user.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["OBMM_TESTBED_RUN_ROOT"] = str(tmp / "shm")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, str(tmp)],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_plugin_is_a_pytest11_entry_point() -> None:
    (ep,) = [e for e in entry_points(group="pytest11") if e.name == "obmm_testbed"]
    assert ep.value == "obmm.testbed.pytest_cluster"


def test_a_suite_that_does_not_use_it_runs_as_before(tmp_path: Path) -> None:
    proc = _pytest(tmp_path, "def test_plain():\n    assert True\n", "-v")
    assert proc.returncode == 0, proc.stdout
    assert "1 passed" in proc.stdout
    assert not (tmp_path / "shm").exists()  # no cluster was started


def test_its_fixtures_and_marker_are_offered(tmp_path: Path) -> None:
    proc = _pytest(tmp_path, "def test_plain():\n    pass\n", "--fixtures")
    for name in ("obmm_cluster", "obmm_nodes", "obmm_testbed"):
        assert name in proc.stdout
    proc = _pytest(tmp_path, "def test_plain():\n    pass\n", "--markers")
    assert "@pytest.mark.obmm_cluster(nodes=2" in proc.stdout


def test_a_bad_marker_argument_is_reported_before_anything_boots(tmp_path: Path) -> None:
    body = (
        "import pytest\n@pytest.mark.obmm_cluster(nodez=2)\ndef test_x(obmm_cluster):\n    pass\n"
    )
    proc = _pytest(tmp_path, body)
    assert proc.returncode == 1
    assert "unknown argument(s) nodez" in proc.stdout
    assert not (tmp_path / "shm").exists()


def test_the_leak_check_compares_regions_devices_and_the_pool() -> None:
    before = ObmmState.parse("pool 0x0\npool 0x0\n")
    after = ObmmState.parse(
        "region obmm_shmdev3 export\ndev obmm_shmdev3\npool 0x200000\npool 0x0\n"
    )
    assert before.leaks_since(before) == ""
    assert after.regions == {3: "export"} and after.devs == {3}
    assert after.leaks_since(before) == (
        "regions export 3; device nodes /dev/obmm_shmdev3; pool used 0x0 -> 0x200000"
    )


def _node(tmp: Path) -> LocalRemoteNode:
    return LocalRemoteNode(0, {"OBMM_NODE_ID": "0", "OBMM_NODE_ADDR": "127.0.0.1"}, str(tmp))


def test_run_gives_the_status_both_streams_and_the_environment(tmp_path: Path) -> None:
    node = _node(tmp_path)
    res = node.run('echo "id $OBMM_NODE_ID in $PWD"; echo oops >&2; exit 3', env={"X": "1"})
    assert (res.exit_status, res.out, res.err) == (3, f"id 0 in {tmp_path}\n", "oops\n")
    assert node.addr == "127.0.0.1"


def test_run_kills_the_command_at_its_deadline(tmp_path: Path) -> None:
    node = _node(tmp_path)
    with pytest.raises(CommandTimeout, match="stopped at its 1 s deadline"):
        node.run(f"sleep 300 & echo $! > {tmp_path}/pid; wait", timeout=1)
    pid = int((tmp_path / "pid").read_text())
    # SIGKILL is sent before run() returns; on a loaded host the process takes a moment to die.
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Running or sleeping (not gone, not a zombie, not dying)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_background_process_gets_ready_and_is_stopped(tmp_path: Path) -> None:
    node = _node(tmp_path)
    # The trap before the ready line: a stop right after it finds the trap set.
    proc = node.start("trap 'echo bye; exit 0' TERM; echo listening; while :; do sleep 0.1; done",
                      name="svc", ready_line="listening")  # fmt: skip
    assert proc.running and "listening" in proc.stdout
    assert proc.stop() == 0 and "bye" in proc.stdout
    done = node.start("echo done", name="quick")
    assert done.wait(30) == 0
    with pytest.raises(ProcessTimeout, match=r"ended .* before it was ready"):
        node.start("exit 4", name="broken", ready_line="never")
    assert node.stop_all() == []  # nothing left running
