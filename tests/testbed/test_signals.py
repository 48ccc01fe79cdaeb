"""Nothing left behind, whatever stops an entry point: the whole matrix of

- entry points: `obmm-testbed up`, `obmm-testbed run`, the guest suite (pytest
  tests/qemu/guest.guestsuite), the cluster suite (pytest tests/cluster/...), the pytest plugin
  (a user project using obmm_nodes) and `python -m obmm.bench`;
- signal patterns: SIGTERM twice (coreutils `timeout`, a CI runner cancelling), SIGINT then
  SIGTERM (Ctrl-C, then a kill), SIGKILL (an OOM kill), sent to the whole process group;
- phases: at boot, during the work, during the teardown.

Each case runs the entry point as its own process with a run root and a TMPDIR of its own,
signals it at a point a line of its output names, and then checks: for an interrupt, exit
status 130 and one line (the suites: a non-zero status), no traceback; after at most one
further `obmm-testbed` command, no QEMU or hub of it runs and no run directory (RAM files,
sockets, pidfiles) or scratch directory of it is left.

The phases, each named by a line (no sleeps):
- boot: "ssh ports" (the QEMUs run, no node is ready yet);
- work: the entry's "ready: N node(s)" / "running on" line, then a line that says the work is
  under way (the command's own output, the test's name that pytest -v prints as it starts it,
  the bench's "building memprobe", which it reaches once its pair is up: the case runs it with
  no boot, restore, parallel-TCG or inner-loop samples, `--tcg-samples 0` among them);
- teardown: "stopping cluster NAME", the line Cluster.stop prints on the front end's progress
  as it begins (the work ends by itself: a command or test that returns at once).  For the
  interrupt patterns the case also checks that the teardown held the signals (its "waits for
  it" line), so a teardown that ended before the first signal fails the case instead of passing
  it vacuously.  A teardown that goes well is short, so each teardown case makes it wait for
  something: the SIGTERM to the network hub of the pair it runs is held by this test (ptrace),
  `down`'s QEMU is stopped.  The teardown lasts seconds and the signals land in it however
  slowly this test reacts.  A SIGKILL has no such witness: it lands after that line, within the
  teardown (which outlasts the reaction of this test by far: QMP quit, the QEMU's exit, the
  hub, the run directory) or, on a very slow machine, after it; either way nothing may be left.

`up` has no work or teardown phase of its own: it returns once the nodes are ready, leaving a
cluster owned by nobody.  Its "work" is not a phase of the matrix; its teardown is the `down`
that follows it, signalled while it stops the cluster (the next command after a SIGKILLed
`down` is a plain `status`, like every other case).

Every wait is for a line, bounded by a budget for work whose length depends on the machine
(booting, building), stretched by $OBMM_TESTBED_TIMEOUT_SCALE (`settings.scaled`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from obmm.testbed.paths import repo_root
from obmm.testbed.settings import scaled

#: The bound on reaching a phase's line (a boot, a pair brought up) or on an exit after the
#: signals: work of the machine's pace, so scaled (`scaled`) when called.
STEP_TIMEOUT_S = 300.0
#: Seconds between two signals of a pair: the second lands while the first's teardown runs.
BETWEEN_S = 0.3
#: How often the output is looked at for the line that names a phase.
POLL_S = 0.01


@dataclass
class Entry:
    """An entry point running in its own process, its output watched line by line."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    lines: list[str] = field(default_factory=list)
    partial: str = ""
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Entry:
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=self.cwd, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        """Lines as they come, and the line being written (pytest -v writes a test's name when
        it starts it, and the outcome on the same line when it ends)."""
        assert self.proc is not None and self.proc.stdout is not None
        fd, tail = self.proc.stdout.fileno(), b""
        while chunk := os.read(fd, 65536):
            *done, tail = (tail + chunk).split(b"\n")
            self.lines.extend(line.decode(errors="replace") for line in done)
            self.partial = tail.decode(errors="replace")
        if tail:
            self.lines.append(tail.decode(errors="replace"))
        self.partial = ""

    def stop(self) -> None:
        """Whatever is left of it, after a failed check (its QEMUs: the `place` fixture)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def wait_for(self, *texts: str, timeout: float = STEP_TIMEOUT_S) -> None:
        """Until a line holds each of `texts`, in this order (each after the previous one's)."""
        assert self.proc is not None
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        start = 0
        for text in texts:
            while (at := self._find(text, start)) is None:
                assert self.proc.poll() is None, f"ended before {text!r}:\n" + self.output()
                assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n" + self.output()
                time.sleep(POLL_S)
            start = at + 1

    def _find(self, text: str, start: int) -> int | None:
        lines = [*self.lines, self.partial]
        for i in range(start, len(lines)):
            if text in lines[i]:
                return i
        return None

    def signal(self, *signals: signal.Signals) -> None:
        """Signals to the whole process group, as `timeout` and CI runners send them."""
        assert self.proc is not None
        for i, sig in enumerate(signals):
            if i:
                time.sleep(BETWEEN_S)
            os.killpg(self.proc.pid, sig)

    def finish(self, timeout: float = STEP_TIMEOUT_S) -> int:
        assert self.proc is not None
        status = self.proc.wait(scaled(timeout))
        time.sleep(0.2)  # the reader has the last lines
        return status

    def output(self) -> str:
        return "\n".join([*self.lines[-60:], self.partial])


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


def _qemus_under(run_root: str, program: str = "") -> list[int]:
    pattern = f"{program}.*{run_root}" if program else run_root
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if int(p) != os.getpid()]


def _kill_qemus_under(run_root: Path) -> None:
    for pid in _qemus_under(str(run_root)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def assert_nothing_left(env: dict[str, str], *, after_next_command: bool = False) -> None:
    run_root, tmp = env["OBMM_TESTBED_RUN_ROOT"], Path(env["TMPDIR"])
    if after_next_command:
        subprocess.run(
            [sys.executable, "-m", "obmm.testbed.cli.main", "status"], env=env, capture_output=True,
            timeout=scaled(120), check=False,
        )  # fmt: skip
    deadline = time.monotonic() + scaled(15)
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
    return [sys.executable, "-m", "obmm.testbed.cli.main", *args]


# -- the matrix ----------------------------------------------------------------------------------

PATTERNS: dict[str, tuple[signal.Signals, ...]] = {
    "term_term": (signal.SIGTERM, signal.SIGTERM),
    "int_term": (signal.SIGINT, signal.SIGTERM),
    "kill": (signal.SIGKILL,),
}
PHASES = ("boot", "work", "teardown")
BOOT = ("ssh ports",)
TEARDOWN = ("stopping cluster",)


@dataclass(frozen=True)
class Case:
    """How one entry point is started for a phase, and how it says it was interrupted."""

    start: Callable[[str, dict[str, str], Path], Entry]
    marks: dict[str, tuple[str, ...]]
    #: The interrupted line's start (`<prog>: interrupted (signal N`); None: a suite (non-zero).
    prog: str | None


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", *args]


def _up(phase: str, env: dict[str, str], cwd: Path) -> Entry:
    up = _cli("up", "--nodes", "1", "--name", "sig-up")
    if phase == "teardown":  # `up` to the end, then its `down` is the entry signalled
        done = subprocess.run(up, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=scaled(STEP_TIMEOUT_S), check=False)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        # A stopped QEMU never answers the QMP quit: `down` waits out its bound (seconds)
        # before it signals, so the signals land while it stops (a 1-node stop that went well
        # could end before the first one, whose default action then killed the process).
        for pid in _qemus_under(env["OBMM_TESTBED_RUN_ROOT"], "qemu-system"):
            os.kill(pid, signal.SIGSTOP)
        return Entry(_cli("down", "--name", "sig-up"), env, cwd).start()
    return Entry(up, env, cwd).start()


def _run(phase: str, env: dict[str, str], cwd: Path) -> Entry:
    command = "echo the work runs; sleep 300" if phase == "work" else "true"
    nodes = "2" if phase == "teardown" else "1"  # a pair: its hub holds the teardown
    argv = _cli("run", "--nodes", nodes, "--dir", "none", "--", command)
    return _held(phase, Entry(argv, env, cwd).start())


GUEST_TESTS = {
    "work": "tests/guest/_selftest/test_hang.py::test_sleeps_long",
    "boot": "tests/guest/test_addr_query.py::test_last_byte",
    "teardown": "tests/guest/test_addr_query.py::test_last_byte",
}


def _guest_suite(phase: str, env: dict[str, str], cwd: Path) -> Entry:
    env = dict(env, OBMM_GUEST_PATHS=GUEST_TESTS[phase])
    if phase == "teardown":  # a pair: its hub holds the teardown
        env["OBMM_TESTBED_NODES"] = "2"
    return _held(phase, Entry(_pytest("tests/qemu/guest.guestsuite"), env, repo_root()).start())


CLUSTER_TESTS = {
    "work": "tests/cluster/test_xnode.py",
    "boot": "tests/cluster/test_xnode.py::test_nodes_reach_each_other_on_link_local_addresses",
    # One that uses no inter-node network (the handle exchange does): the case stops the hub.
    "teardown": "tests/cluster/test_xnode.py::test_kernel_log_guard_reports_a_warn_on_the_node"
    "_that_warned",
}


def _cluster_suite(phase: str, env: dict[str, str], cwd: Path) -> Entry:
    return _held(phase, Entry(_pytest(CLUSTER_TESTS[phase]), env, repo_root()).start())


def _plugin(phase: str, env: dict[str, str], cwd: Path) -> Entry:
    project = cwd / "proj"
    project.mkdir()
    command = "sleep 300" if phase == "work" else "true"
    (project / "test_user.py").write_text(
        "def test_user(obmm_nodes):\n"
        "    print('the work runs', flush=True)\n"
        f"    obmm_nodes[0].run({command!r}, timeout=600)\n"
    )
    nodes = "2" if phase == "teardown" else "1"  # a pair: its hub holds the teardown
    return _held(
        phase, Entry(_pytest("-s", "--obmm-nodes", nodes, str(project)), env, project).start()
    )


def _bench(phase: str, env: dict[str, str], cwd: Path) -> Entry:
    # Boot: the first boot sample's 1-node cluster; teardown: the first boot sample's pair
    # (below); the work: the data path measurements on the bench's pair, reached in the time
    # the pair takes to come up (no boot samples, no parallel-TCG cost: tearing it down is
    # what is proved, not the measurements).
    boots = {"boot": "1", "work": "", "teardown": "2"}[phase]
    return _held(phase, Entry([sys.executable, "-m", "obmm.bench", "--skip-cold-image",
                  "--boot-nodes", boots, "--boot-inits", "fast", "--boot-samples", "1",
                  "--tcg-samples", "0", "--inner-loop-samples", "0", "--no-plots",
                  "--out", str(cwd / "out")], env, cwd).start())  # fmt: skip


def _held(phase: str, entry: Entry) -> Entry:
    """For the teardown phase: trace the pair's network hub (ptrace) once it listens, long
    before the work ends, so that the SIGTERM the teardown sends it waits HOLD_S in this test
    before the hub gets it (the entries run a pair for this phase).

    The teardown waits for the hub to exit, so it lasts seconds and the signals sent after
    "stopping cluster" land in it.  Without this, a teardown that went well took a fraction
    of a second, and on a loaded machine it had ended before this test reacted to its line
    (the first signal then hit what came next: the bench's next sample, so no "waits for it"
    line).  Until then the hub forwards frames as always (a SIGSTOPped one made the QEMUs
    spin on their full sockets)."""
    if phase != "teardown":
        return entry
    assert entry.proc is not None
    run_root = entry.env["OBMM_TESTBED_RUN_ROOT"]
    deadline = time.monotonic() + scaled(STEP_TIMEOUT_S)
    while not list(Path(run_root).glob("*/hub.sock")):
        assert entry.proc.poll() is None, "ended before its hub listened:\n" + entry.output()
        assert time.monotonic() < deadline, "no hub socket:\n" + entry.output()
        time.sleep(POLL_S)
    hubs = _qemus_under(run_root, "obmm.testbed.vm.hub")
    assert len(hubs) == 1, f"hub processes under {run_root}: {hubs}"
    _hold_signals_of(hubs[0])
    return entry


#: How long the traced hub's SIGTERM or SIGINT waits (Cluster.stop waits TERM_TIMEOUT_S, 5 s).
HOLD_S = 3.0
PTRACE_CONT, PTRACE_SEIZE = 7, 0x4206
WALL = 0x40000000  # waitpid's __WALL: a traced process that is not a child


def _hold_signals_of(pid: int) -> None:
    """Trace `pid` from a thread of this process (the tracer; ptrace is per thread) that
    passes each signal on, SIGTERM and SIGINT after HOLD_S, until the process is gone."""
    seized = threading.Event()
    failed: list[int] = []

    def tracer() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        if libc.ptrace(PTRACE_SEIZE, pid, None, None) != 0:
            failed.append(ctypes.get_errno())
        seized.set()
        while not failed:
            try:
                _, status = os.waitpid(pid, WALL)
            except ChildProcessError:
                return
            if not os.WIFSTOPPED(status):
                return  # exited or killed
            sig = os.WSTOPSIG(status)
            if sig in (signal.SIGTERM, signal.SIGINT):
                time.sleep(HOLD_S)
            libc.ptrace(PTRACE_CONT, pid, None, ctypes.c_void_p(sig))

    threading.Thread(target=tracer, daemon=True).start()
    seized.wait()
    assert not failed, f"ptrace(PTRACE_SEIZE, {pid}): {os.strerror(failed[0])}"


CASES: dict[str, Case] = {
    "up": Case(_up, {"boot": BOOT, "teardown": TEARDOWN}, "obmm-testbed"),
    "run": Case(
        _run,
        {"boot": BOOT, "work": ("running on 1 node(s)", "the work runs"), "teardown": TEARDOWN},
        "obmm-testbed run",
    ),
    "guest_suite": Case(
        _guest_suite,
        {"boot": BOOT, "work": ("ready: 1 node(s)", "test_sleeps_long"), "teardown": TEARDOWN},
        None,
    ),
    "cluster_suite": Case(
        _cluster_suite,
        {"boot": BOOT, "work": ("ready: 2 node(s)", "test_xnode.py::"), "teardown": TEARDOWN},
        None,
    ),
    "plugin": Case(
        _plugin,
        {"boot": BOOT, "work": ("ready: 1 node(s)", "the work runs"), "teardown": TEARDOWN},
        None,
    ),
    "bench": Case(
        _bench,
        {"boot": BOOT, "work": ("ready: 2 node(s)", "building memprobe"), "teardown": TEARDOWN},
        "python -m obmm.bench",
    ),
}

MATRIX = [
    pytest.param(entry, pattern, phase, id=f"{entry}-{pattern}-{phase}")
    for entry, case in CASES.items()
    for pattern in PATTERNS
    for phase in PHASES
    if phase in case.marks  # `up` has no work phase (the module's docstring says why)
]


@pytest.mark.parametrize(("entry_name", "pattern", "phase"), MATRIX)
def test_nothing_left(
    entry_name: str, pattern: str, phase: str, place: dict[str, str], tmp_path: Path
) -> None:
    case = CASES[entry_name]
    signals = PATTERNS[pattern]
    entry = case.start(phase, place, tmp_path)
    try:
        entry.wait_for(*case.marks[phase])
        entry.signal(*signals)
        status = entry.finish()
    finally:
        entry.stop()
    if pattern == "kill":
        if phase != "teardown":  # the run directory outlives its SIGKILLed owner ...
            assert list(Path(place["OBMM_TESTBED_RUN_ROOT"]).iterdir()), entry.output()
        assert_nothing_left(place, after_next_command=True)  # ... until the next command
        return
    if case.prog is not None:
        _interrupted(entry, status, f"{case.prog}: interrupted (signal {signals[0].value}")
    else:
        assert status not in (0, -signals[0]), entry.output()
        assert "Traceback" not in entry.output(), entry.output()
    if phase == "teardown":  # the teardown was under way when the signals came: it held them
        assert any("waits for it" in line for line in entry.lines), entry.output()
    assert_nothing_left(place)
