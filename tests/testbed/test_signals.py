"""Nothing left behind, whatever stops an entry point: SIGTERM twice (coreutils `timeout`, a CI
runner cancelling), SIGINT then SIGTERM (Ctrl-C, then a kill), SIGKILL (an OOM kill), at boot,
during the work and during the teardown.

Each case runs an entry point as its own process with a run root and a TMPDIR of its own, signals
it at a point its output names, and then checks: exit status 130 and one line for an interrupt
(no traceback); after at most one further `obmm-testbed` command, no QEMU or hub of it runs and
no run directory (RAM files, sockets, pidfiles) or scratch directory of it is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from obmm.testbed.paths import repo_root

STEP_TIMEOUT_S = 300.0
#: Seconds between two signals of a pair: the second lands while the first's teardown runs.
BETWEEN_S = 0.3


@dataclass
class Entry:
    """An entry point running in its own process, its output watched line by line."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    lines: list[str] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None

    def start(self) -> Entry:
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=self.cwd, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = STEP_TIMEOUT_S) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, f"ended before {text!r}:\n" + self.output()
            assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n" + self.output()
            time.sleep(0.05)

    def signal(self, *signals: signal.Signals) -> None:
        """Signals to the whole process group, as `timeout` and CI runners send them."""
        assert self.proc is not None
        for i, sig in enumerate(signals):
            if i:
                time.sleep(BETWEEN_S)
            os.killpg(self.proc.pid, sig)

    def finish(self, timeout: float = STEP_TIMEOUT_S) -> int:
        assert self.proc is not None
        status = self.proc.wait(timeout)
        time.sleep(0.2)  # the reader has the last lines
        return status

    def output(self) -> str:
        return "\n".join(self.lines[-60:])


@pytest.fixture
def place(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A run root (tmpfs, short for unix sockets) and a TMPDIR of this case's own."""
    run_root = Path("/dev/shm") / f"obmm-sig-{uuid.uuid4().hex[:8]}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        OBMM_TESTBED_RUN_ROOT=str(run_root), TMPDIR=str(tmp), PYTHONUNBUFFERED="1",
    )  # fmt: skip
    yield env
    _kill_qemus_under(run_root)  # only if a check below failed
    subprocess.run(["rm", "-rf", str(run_root)], check=False)


def _qemus_under(run_root: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", run_root], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if int(p) != os.getpid()]


def _kill_qemus_under(run_root: Path) -> None:
    for pid in _qemus_under(str(run_root)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def assert_nothing_left(env: dict[str, str], *, after_next_command: bool = False) -> None:
    run_root, tmp = env["OBMM_TESTBED_RUN_ROOT"], Path(env["TMPDIR"])
    if after_next_command:
        subprocess.run(
            [sys.executable, "-m", "obmm.tools.cli", "status"], env=env, capture_output=True,
            timeout=120, check=False,
        )  # fmt: skip
    deadline = time.monotonic() + 15
    while _qemus_under(run_root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _qemus_under(run_root) == [], "QEMU or hub processes left"
    left = list(Path(run_root).iterdir()) if Path(run_root).exists() else []
    assert left == [], f"run directories left: {left}"
    assert list(tmp.glob("obmm-*")) == [], f"scratch left: {list(tmp.glob('obmm-*'))}"


def _interrupted(entry: Entry, status: int, last: str) -> None:
    assert status == 130, entry.output()
    assert "Traceback" not in entry.output(), entry.output()
    assert any(last in line for line in entry.lines[-5:]), entry.output()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "obmm.tools.cli", *args]


# -- obmm-testbed run ----------------------------------------------------------------------------


def test_run_sigterm_twice_during_the_work(place: dict[str, str], tmp_path: Path) -> None:
    entry = Entry(_cli("run", "--nodes", "1", "--dir", "none", "--", "sleep 300"), place,
                  tmp_path).start()  # fmt: skip
    entry.wait_for("running on 1 node(s)")
    entry.signal(signal.SIGTERM, signal.SIGTERM)
    status = entry.finish()
    _interrupted(entry, status, "obmm-testbed run: interrupted (signal 15); the cluster is stopped")
    assert_nothing_left(place)


def test_run_sigint_then_sigterm_at_boot(place: dict[str, str], tmp_path: Path) -> None:
    entry = Entry(_cli("run", "--nodes", "2", "--dir", "none", "--", "true"), place,
                  tmp_path).start()  # fmt: skip
    entry.wait_for("ssh ports")  # the QEMUs run; no node is ready yet
    entry.signal(signal.SIGINT, signal.SIGTERM)
    status = entry.finish()
    _interrupted(entry, status, "obmm-testbed run: interrupted")
    assert_nothing_left(place)


def test_run_sigkill_during_the_work_is_reaped_by_the_next_command(
    place: dict[str, str], tmp_path: Path
) -> None:
    """The issue's case: `run` SIGKILLed; its RAM file (host memory) stayed until `down`."""
    entry = Entry(_cli("run", "--nodes", "1", "--dir", "none", "--", "sleep 300"), place,
                  tmp_path).start()  # fmt: skip
    entry.wait_for("running on 1 node(s)")
    entry.signal(signal.SIGKILL)
    entry.finish()
    assert list(Path(place["OBMM_TESTBED_RUN_ROOT"]).iterdir())  # left until the next command
    assert_nothing_left(place, after_next_command=True)


# -- obmm-testbed up -----------------------------------------------------------------------------


def test_up_sigterm_twice_while_it_boots(place: dict[str, str], tmp_path: Path) -> None:
    entry = Entry(_cli("up", "--nodes", "2", "--name", "sig-up", "--snapshot", "off"), place,
                  tmp_path).start()  # fmt: skip
    entry.wait_for("ssh ports")
    entry.signal(signal.SIGTERM, signal.SIGTERM)
    status = entry.finish()
    _interrupted(entry, status, "obmm-testbed: interrupted (signal 15)")
    assert_nothing_left(place)


def test_up_sigkill_while_it_boots_is_reaped_by_the_next_command(
    place: dict[str, str], tmp_path: Path
) -> None:
    entry = Entry(_cli("up", "--nodes", "1", "--name", "sig-upk", "--snapshot", "off"), place,
                  tmp_path).start()  # fmt: skip
    entry.wait_for("ssh ports")
    entry.signal(signal.SIGKILL)
    entry.finish()
    assert_nothing_left(place, after_next_command=True)


# -- the suites and the plugin -------------------------------------------------------------------


def test_guest_suite_sigterm_twice_during_a_test(place: dict[str, str], tmp_path: Path) -> None:
    env = dict(place, OBMM_GUEST_PATHS="tests/guest/_selftest/test_hang.py::test_sleeps_long")
    entry = Entry([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                   "tests/qemu/guest.guestsuite"], env, repo_root()).start()  # fmt: skip
    entry.wait_for("ready: 1 node(s)")
    time.sleep(3)  # the guest test runs
    entry.signal(signal.SIGTERM, signal.SIGTERM)
    status = entry.finish()
    assert status != 0 and "Traceback" not in entry.output(), entry.output()
    assert_nothing_left(place)


def test_cluster_suite_sigint_then_sigterm_during_a_test(
    place: dict[str, str], tmp_path: Path
) -> None:
    entry = Entry([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                   "tests/cluster/test_xnode.py"], place, repo_root()).start()  # fmt: skip
    entry.wait_for("ready: 2 node(s)")
    time.sleep(3)
    entry.signal(signal.SIGINT, signal.SIGTERM)
    status = entry.finish()
    assert status != 0 and "Traceback" not in entry.output(), entry.output()
    assert_nothing_left(place)


def test_pytest_plugin_sigkill_during_a_test_is_reaped_by_the_next_command(
    place: dict[str, str], tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "test_slow.py").write_text(
        "def test_slow(obmm_nodes):\n    obmm_nodes[0].run('sleep 300', timeout=600)\n"
    )
    entry = Entry([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s",
                   "--obmm-nodes", "1", str(project)], place, project).start()  # fmt: skip
    entry.wait_for("ready: 1 node(s)")
    time.sleep(2)
    entry.signal(signal.SIGKILL)
    entry.finish()
    assert_nothing_left(place, after_next_command=True)


# -- the bench -----------------------------------------------------------------------------------


def test_bench_sigterm_twice_during_its_teardown(place: dict[str, str], tmp_path: Path) -> None:
    """The issue's case: the bench under `timeout` printed a traceback from the QMP quit of its
    teardown and left its nodes and /dev/shm/obmm-testbed-bench-* running."""
    entry = Entry([sys.executable, "-m", "obmm.bench", "--skip-cold-image", "--boot-nodes", "1",
                   "--boot-inits", "fast", "--boot-samples", "1", "--no-plots", "--out",
                   str(tmp_path / "out")], place, tmp_path).start()  # fmt: skip
    entry.wait_for("boot 1 node(s), init fast")
    entry.wait_for("ssh ready")
    entry.signal(signal.SIGTERM, signal.SIGTERM)
    status = entry.finish()
    _interrupted(entry, status, "python -m obmm.bench: interrupted (signal 15)")
    assert_nothing_left(place)
