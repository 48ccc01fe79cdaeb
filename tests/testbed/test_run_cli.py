"""`obmm-testbed run` end to end, as a user outside the checkout runs it.

The wheel is built and installed into a fresh venv (tests/host/wheel_venv.py); in a fresh
directory holding only a two-file C exporter/client pair (run_pair/: uapi/ub/obmm.h and the
examples/c handle helper, found through $OBMM_CFLAGS), one `obmm-testbed run` line boots 2 nodes,
builds both programs in the guests, starts the exporter on node 0 as a service (ready when it
prints "listening on"), then the client on node 1, which reads the exporter's pattern through the
fabric.  Exit 0, and nothing is left: no QEMU, no run directory, no console logs, no temp files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "host"))
from wheel_venv import CHECKOUT, block_pytest, build_wheel, install

from obmm.testbed.paths import cache_dir, run_root
from obmm.testbed.settings import scaled
from obmm.testbed.vm.cluster import RUN_PREFIX

# One worker runs this module (conftest.group): the last check of the first test is that no
# `obmm-testbed run` scratch directory is left in /tmp, which the third one makes.
pytestmark = pytest.mark.slow
PAIR = Path(__file__).resolve().parent / "run_pair"


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_a_c_pair_runs_across_two_nodes_in_one_line(tmp_path: Path, wheel: Path) -> None:
    bin_dir = install(wheel, tmp_path / "venv")
    work = tmp_path / "my-obmm-code"
    work.mkdir()
    for name in ("exporter.c", "client.c"):
        shutil.copy(PAIR / name, work / name)
    assert CHECKOUT not in work.parents
    name = f"runtest-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.pop("OBMM_TESTBED_ROOT", None)
    env["OBMM_TESTBED_RESULTS"] = str(tmp_path / "results")  # the module build
    argv = [
        str(bin_dir / "obmm-testbed"), "run", "--nodes", "2", "--name", name, "--timeout", "240",
        "--node", "0=cc $OBMM_CFLAGS -Wall -Werror -o exporter exporter.c && exec ./exporter",
        "--node", "1=cc $OBMM_CFLAGS -Wall -Werror -o client client.c && ./client",
        "--service", "0", "--ready-line", "listening on",
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(
        argv, cwd=work, env=env, capture_output=True, text=True, timeout=scaled(600), check=False
    )
    wall = time.monotonic() - start
    print(f"obmm-testbed run: {wall:.1f} s\n{proc.stdout}\n{proc.stderr}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert "[node0] exporter: mem_id " in out and "listening on 169.254.100.10:7000" in out
    assert "[node1] client: handle from 169.254.100.10: node 0 mem_id" in out
    assert (
        "[node1] client: read node 0's pattern through the fabric: 524288 words, 0 wrong, "
        "first 0xc0de0000 last 0xc0d9ffff" in out
    )
    assert "[node0] exporter: unexported" in out  # stopped with SIGTERM, it cleaned up
    assert "[obmm-testbed] node0: service ready" in proc.stderr
    assert " copied " in proc.stderr and "kernel report" not in proc.stderr
    # Nothing left behind.
    rundir = run_root() / f"{RUN_PREFIX}{name}"
    assert not rundir.exists()
    assert _processes_mentioning(str(rundir)) == []
    assert not (cache_dir() / "logs" / name).exists()
    assert sorted(p.name for p in work.iterdir()) == ["client.c", "exporter.c"]
    assert not list(Path("/tmp").glob("obmm-run-*"))


def test_an_argument_vector_and_a_parameter_reach_the_nodes_from_a_wheel_without_pytest(
    tmp_path: Path, wheel: Path
) -> None:
    """The issue's new user: a wheel without the test extra still has `run`; the words after
    `--` arrive as an argument vector (`sh -c '... && ...'` is not cut at its first space), and
    `--param` reaches the driver module's parameters."""
    bin_dir = install(wheel, tmp_path / "venv")
    block_pytest(bin_dir.parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.pop("OBMM_TESTBED_ROOT", None)
    env["OBMM_TESTBED_RESULTS"] = str(tmp_path / "results")
    script = (
        "test -c /dev/obmm && for m in /sys/module/obmm*/parameters/ubc_index; do "
        'echo "ubc_index=$(cat $m)"; done && echo ok'
    )
    proc = subprocess.run(
        [str(bin_dir / "obmm-testbed"), "run", "--nodes", "2", "--dir", "none",
         "--param", "ubc_index=1", "--", "sh", "-c", script],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(600), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    for node in (0, 1):
        assert f"[node{node}] ok\n" in proc.stdout, proc.stdout
        assert f"[node{node}] ubc_index=1\n" in proc.stdout, proc.stdout


def test_a_hanging_command_is_stopped_at_its_deadline_and_the_cluster_torn_down(
    tmp_path: Path,
) -> None:
    name = f"runhang-{os.getpid()}"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "obmm.testbed.cli.main", "run", "--nodes", "1", "--name", name,
         "--dir", "none", "--timeout", "5", "--", "echo started; sleep 600"],
        capture_output=True, text=True, timeout=scaled(400), check=False,
    )  # fmt: skip
    assert proc.returncode == 124, proc.stderr[-3000:]
    assert "[node0] started" in proc.stdout
    assert "node0: stopped at the 5 s deadline" in proc.stderr
    rundir = run_root() / f"{RUN_PREFIX}{name}"
    assert not rundir.exists() and _processes_mentioning(str(rundir)) == []
    assert time.monotonic() - start < scaled(300)
