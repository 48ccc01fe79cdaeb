"""The guest suite: pytest run inside a node, each result streamed back as it happens.

The nodes come up through :func:`obmm.testbed.session.bring_up` (or attach to a running
cluster, ``$OBMM_TESTBED_ATTACH``); this module only runs tests in them.

Design (why it is shaped like this):

* The guest runs pytest **once** for the whole selection (a pytest start costs seconds under
  TCG), with :mod:`obmm.testbed.suite.guest_plugin` writing one JSON event per line to a
  dedicated fd that the SSH command maps to its stdout; pytest's own terminal output goes to
  stderr.  The host therefore learns each result the moment it exists and always knows which
  test is running.
* The host waits for each result with the QEMU pids watched: if a node's QEMU exits (panic with
  ``panic=-1 -no-reboot``, crash, kill), the test that was running fails at once with the tail of
  the console, and the tests after it fail as not run.  A guest that stops producing events is
  pinged over a fresh SSH connection; no answer is a failure too.  Nothing waits for a global
  timeout.
* The host pytest side (:class:`GuestSuiteFile`, :class:`GuestItem`) turns every guest test into
  a host test item with the guest's nodeid, outcome, traceback and captured output, so
  ``--junitxml`` on the host lists each guest test.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Protocol

from obmm import envvars
from obmm.testbed.errors import TestbedError
from obmm.testbed.progress import Progress
from obmm.testbed.remote import GUEST_ROOT
from obmm.testbed.session import Session, attach, bring_up
from obmm.testbed.settings import Settings, scaled
from obmm.testbed.ssh import CommandTimeout, Connection, GuestGone, SshError
from obmm.testbed.topology import Topology
from obmm.testbed.vm.cluster import Cluster, NodeDied

log = logging.getLogger(__name__)

EVENT_FD = 3
# A guest silent this long is pinged; the ping must answer within PING_TIMEOUT_S.
PING_AFTER_S = 30.0
PING_TIMEOUT_S = 20.0
DEFAULT_TEST_TIMEOUT_S = 900.0
GRACE_AFTER_EOF_S = 5.0
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "error", "not run")


class RunnerError(TestbedError, RuntimeError):
    """The guest suite could not be prepared or run."""


class GuestUnresponsive(GuestGone):
    """The guest's QEMU runs but the guest no longer answers."""


@dataclass
class GuestTestResult:
    """The merged outcome of one guest test (setup, call and teardown)."""

    nodeid: str
    outcome: str = "passed"
    longrepr: str = ""
    sections: list[tuple[str, str]] = field(default_factory=list)
    duration: float = 0.0
    reason: str = ""

    def add_phase(self, event: dict[str, Any]) -> None:
        when = str(event.get("when"))
        outcome = str(event.get("outcome"))
        self.duration += float(event.get("duration") or 0.0)
        for title, text in event.get("sections") or []:
            if (title, text) not in self.sections:
                self.sections.append((str(title), str(text)))
        longrepr = str(event.get("longrepr") or "")
        wasxfail = event.get("wasxfail")
        if outcome == "failed":
            # A failure in any phase fails the test; setup failures are errors, like pytest.
            self.outcome = "error" if when == "setup" else "failed"
            header = "" if when == "call" else f"[{when}] "
            self.longrepr = (self.longrepr + "\n" if self.longrepr else "") + header + longrepr
        elif outcome == "skipped" and self.outcome == "passed":
            if wasxfail is not None:
                self.outcome, self.reason = "xfailed", str(wasxfail)
            else:
                self.outcome, self.reason = "skipped", longrepr
        elif outcome == "passed" and when == "call" and wasxfail is not None:
            self.outcome, self.reason = "xpassed", str(wasxfail)


class EventParser:
    """Turns the guest plugin's JSON lines into results (feed it raw bytes as they come)."""

    def __init__(self) -> None:
        self._buf = b""
        self.collected: list[str] = []
        self.markers: dict[str, list[str]] = {}  # nodeid -> marker names (collected event)
        self.collect_errors: dict[str, str] = {}
        self.results: dict[str, GuestTestResult] = {}
        self.finished: set[str] = set()
        self.current: str | None = None
        self.session_exit: int | None = None
        self.last_event = time.monotonic()
        self.garbage: list[str] = []

    def feed(self, data: bytes) -> None:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            self.feed_line(raw.decode(errors="replace"))

    def feed_line(self, line: str) -> None:
        line = line.strip()
        if not line:
            return
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            self.garbage.append(line)
            return
        if not isinstance(event, dict):
            self.garbage.append(line)
            return
        self.last_event = time.monotonic()
        kind = event.get("event")
        nodeid = str(event.get("nodeid", ""))
        if kind == "collected":
            self.collected = [str(n) for n in event.get("nodeids", [])]
            markers = event.get("markers") or {}
            self.markers = {str(k): [str(m) for m in v] for k, v in markers.items()}
        elif kind == "collect_error":
            self.collect_errors[nodeid] = str(event.get("longrepr", ""))
        elif kind == "start":
            self.current = nodeid
            self.results.setdefault(nodeid, GuestTestResult(nodeid))
        elif kind == "report":
            self.results.setdefault(nodeid, GuestTestResult(nodeid)).add_phase(event)
        elif kind == "finish":
            self.finished.add(nodeid)
            if self.current == nodeid:
                self.current = None
        elif kind == "session_finish":
            self.session_exit = int(event.get("exitstatus", -1))


def guest_env(
    *, node: int, nodes: int, topology: Topology, driver: str = "emu", timeout_scale: float = 1.0
) -> dict[str, str]:
    """The guest suite's environment on node `node`; the guest's bounds on work of variable
    length scale as the harness's (`timeout_scale`)."""
    return {
        "PYTHONPATH": str(GUEST_ROOT / "pylib"),
        "PYTHONDONTWRITEBYTECODE": "1",
        envvars.NODE_ID.name: str(node),
        envvars.NODE_COUNT.name: str(nodes),
        envvars.POOL_BASE.name: str(topology.pool_base),
        envvars.POOL_SIZE.name: str(topology.pool_size),
        envvars.TARGET.name: "qemu",
        envvars.NODE_DRIVER.name: driver,
        envvars.TIMEOUT_SCALE.name: f"{timeout_scale:g}",
    }


def guest_pytest_command(
    args: Sequence[str],
    *,
    node: int,
    nodes: int,
    topology: Topology,
    junit: str | None = None,
    driver: str = "emu",
    timeout_scale: float = 1.0,
) -> str:
    """The shell command that runs pytest in a guest with the event stream on stdout."""
    env = guest_env(
        node=node, nodes=nodes, topology=topology, driver=driver, timeout_scale=timeout_scale
    )
    env[envvars.EVENT_FD.name] = str(EVENT_FD)
    return pytest_shell_command(GUEST_ROOT, env, args, junit=junit)


def guest_pytest_human_command(
    args: Sequence[str],
    *,
    node: int,
    nodes: int,
    topology: Topology,
    driver: str = "emu",
    timeout_scale: float = 1.0,
) -> str:
    """pytest in a guest for a person at a terminal (`obmm-testbed dev`): the suite's
    environment, its output as pytest prints it, no event stream."""
    env = guest_env(
        node=node, nodes=nodes, topology=topology, driver=driver, timeout_scale=timeout_scale
    )
    env_s = " ".join(f"{k}={_q(v)}" for k, v in env.items())
    argv = ["python3", "-m", "pytest", "-p", "no:cacheprovider", *args]
    return f"cd {GUEST_ROOT} && env {env_s} {' '.join(_q(a) for a in argv)}"


def pytest_shell_command(
    root: str | PurePath,
    env: dict[str, str],
    args: Sequence[str],
    *,
    junit: str | None = None,
    python: str = "python3",
) -> str:
    """Run pytest in `root` on a node with the guest plugin's event stream on stdout."""
    argv = [
        python,
        "-m",
        "pytest",
        "-p",
        "obmm.testbed.suite.guest_plugin",
        "-p",
        "no:cacheprovider",
    ]
    argv += ["-v", "-rA"]
    if junit:
        argv.append(f"--junitxml={junit}")
    argv += list(args)
    env_s = " ".join(f"{k}={_q(v)}" for k, v in env.items())
    # fd 3 -> the SSH stdout (events only); pytest's stdout -> SSH stderr (human log).
    return f"cd {root} && env {env_s} {' '.join(_q(a) for a in argv)} {EVENT_FD}>&1 1>&2"


def guest_file(nodeid: str) -> str:
    """The file part of a guest node id (`tests/guest/test_x.py::test_y` -> the path)."""
    return nodeid.split("::", 1)[0]


def split_by_file(
    nodeids: Sequence[str], parts: int, weights: dict[str, float] | None = None
) -> list[list[str]]:
    """`nodeids` shared out over `parts` groups, heaviest piece first onto the lightest group.

    A piece is a file's tests (they stay together and in order), or, for a file heavier than a
    group's fair share, a contiguous run of its tests of about that share (the suites' tests are
    independent: selecting any of them by node id is supported).  A test's weight is
    `weights[nodeid]` (the guest seconds it took last time), else its file's `weights[file]`
    spread over its tests, else 1.  Each group keeps the selection's order; empty groups are
    dropped."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    known = weights or {}
    files: dict[str, list[str]] = {}
    for nodeid in nodeids:
        files.setdefault(guest_file(nodeid), []).append(nodeid)

    def weight(nodeid: str) -> float:
        if nodeid in known:
            return float(known[nodeid])
        name = guest_file(nodeid)
        return float(known[name]) / len(files[name]) if name in known else 1.0

    share = sum(weight(n) for n in nodeids) / parts
    pieces: list[list[str]] = []
    for tests in files.values():
        total = sum(weight(n) for n in tests)
        cuts = max(1, min(len(tests), math.ceil(total / share - 1e-9))) if share > 0 else 1
        piece: list[str] = []
        done, made = 0.0, 0
        for nodeid in tests:
            # A run ends before the test whose middle is past its share of the file.
            if piece and made < cuts - 1 and done + weight(nodeid) / 2 > total * (made + 1) / cuts:
                pieces.append(piece)
                piece, made = [], made + 1
            piece.append(nodeid)
            done += weight(nodeid)
        if piece:
            pieces.append(piece)
    loads = [0.0] * parts
    owner: dict[str, int] = {}
    for piece in sorted(pieces, key=lambda p: (-sum(weight(n) for n in p), p[0])):
        k = min(range(parts), key=lambda i: (loads[i], i))
        owner.update(dict.fromkeys(piece, k))
        loads[k] += sum(weight(n) for n in piece)
    groups: list[list[str]] = [[] for _ in range(parts)]
    for nodeid in nodeids:
        groups[owner[nodeid]].append(nodeid)
    return [g for g in groups if g]


def durations_by_test(results: Sequence[GuestTestResult]) -> dict[str, float]:
    """Guest seconds per test (what :func:`split_by_file` weighs the next run with)."""
    return {r.nodeid: round(r.duration, 3) for r in results}


def _q(s: str) -> str:
    if s and all(c.isalnum() or c in "-_./=:,+@%" for c in s):
        return s
    return "'" + s.replace("'", "'\\''") + "'"


class SuiteSession(Protocol):
    """Where the guest suite runs: the QEMU :class:`GuestSession` or the hardware stage's
    ``HwSession`` (:mod:`obmm.testbed.suite.pytest_qemu` drives either)."""

    def boot(self) -> object: ...

    def connect(self, node: int = 0) -> Connection: ...

    def collect(
        self, paths: Sequence[str], ignore: Sequence[str] = (), node: int = 0
    ) -> EventParser: ...

    def start(
        self,
        nodeids: Sequence[str],
        *,
        node: int = 0,
        junit: str | None = None,
        suite_timeout: float = ...,
    ) -> GuestRun: ...

    def close(self) -> None: ...


class GuestSession:
    """The nodes a suite runs on (brought up on first use) and the means to run guest pytest.

    `settings` must name the cluster; `attach` (a cluster name) uses a running cluster
    instead, with a fresh payload and its modules as they are."""

    def __init__(
        self,
        settings: Settings,
        *,
        logdir: Path,
        results: Path,
        purpose: str = "qemu",
        default_topology: str = "single",
        attach: str | None = None,
    ) -> None:
        self.settings = settings
        self.name = settings.name or ""
        self.logdir = logdir
        self.results = results
        self.purpose = purpose
        self.default_topology = default_topology
        self.attach_to = attach
        self.session: Session | None = None
        self.boot_error: BaseException | None = None
        # collect() results by (paths, ignore, node): a guest collection is a Python start-up.
        self._collections: dict[tuple[tuple[str, ...], tuple[str, ...], int], EventParser] = {}

    @property
    def cluster(self) -> Cluster | None:
        return self.session.cluster if self.session is not None else None

    @property
    def topology(self) -> Topology:
        return self.boot().topology

    @property
    def timings(self) -> dict[str, float]:
        return self.session.timings if self.session is not None else {}

    # -- set-up -----------------------------------------------------------------------------

    def boot(self) -> Session:
        """Everything before the first test (:func:`obmm.testbed.session.bring_up`)."""
        if self.session is not None:
            return self.session
        if self.boot_error is not None:
            raise RunnerError(f"the cluster failed to start earlier: {self.boot_error}")
        try:
            if self.attach_to:
                self.session = attach(self.settings, self.attach_to)
                self.session.refresh_payload(self.results / "kmod", test_hooks=True)
            else:
                self.session = bring_up(
                    self.settings,
                    purpose=self.purpose,
                    default_topology=self.default_topology,
                    logdir=self.logdir,
                    progress=Progress(f"{self.purpose} {self.name}"),
                    test_hooks=True,
                )
        except BaseException as exc:
            self.boot_error = exc
            self.close()
            raise
        return self.session

    def close(self) -> None:
        self._collections.clear()
        if self.session is not None:
            session, self.session = self.session, None
            session.stop()

    # -- running ----------------------------------------------------------------------------

    def connect(self, node: int = 0) -> Connection:
        return self.boot().nodes[node].connect()

    def collect(
        self, paths: Sequence[str], ignore: Sequence[str] = (), node: int = 0
    ) -> EventParser:
        """The guest's view of which tests exist (and which files failed to import), with their
        markers; collected once per (paths, ignore, node) for the life of the cluster."""
        session = self.boot()
        key = (tuple(paths), tuple(ignore), node)
        cached = self._collections.get(key)
        if cached is not None:
            return cached
        args = ["--collect-only", "-q", *[f"--ignore={p}" for p in ignore], *paths]
        cmd = guest_pytest_command(
            args,
            node=node,
            nodes=session.topology.nodes,
            topology=session.topology,
            driver=session.settings.driver,
            timeout_scale=session.settings.timeout_scale,
        )
        with session.nodes[node].connect() as conn:
            parser = collect_over(conn, cmd, "guest", timeout=300)
        self._collections[key] = parser
        return parser

    def start(
        self,
        nodeids: Sequence[str],
        *,
        node: int = 0,
        junit: str | None = None,
        suite_timeout: float = 4 * 3600.0,
        ping_after_s: float = PING_AFTER_S,
        ping_timeout_s: float = PING_TIMEOUT_S,
    ) -> GuestRun:
        """Start guest pytest on `nodeids`.  A guest silent for `ping_after_s` is pinged and
        declared unresponsive if the ping takes longer than `ping_timeout_s` (the runner's
        self-test shortens both so that a frozen guest is found in seconds)."""
        return GuestRun(
            self,
            list(nodeids),
            node=node,
            junit=junit,
            suite_timeout=suite_timeout,
            ping_after_s=ping_after_s,
            ping_timeout_s=ping_timeout_s,
        )


def collect_over(conn: Connection, cmd: str, who: str, *, timeout: float) -> EventParser:
    """Run a `pytest --collect-only` command on a node; the tests it reported."""
    parser = EventParser()
    result = conn.run(cmd, timeout=timeout, on_stdout=parser.feed)
    if parser.session_exit is None:
        raise RunnerError(
            f"{who} pytest collection did not run (exit {result.exit_status}):"
            f"\n{result.err[-3000:]}"
        )
    return parser


class GuestRun:
    """One guest pytest invocation running in a background thread; results as they come."""

    # Liveness timers (see GuestSession.start); class defaults for subclasses with their own
    # __init__ (the hardware stage's run).
    ping_after_s: float = PING_AFTER_S
    ping_timeout_s: float = PING_TIMEOUT_S
    timeout_scale: float = 1.0

    def __init__(
        self,
        session: GuestSession,
        nodeids: list[str],
        *,
        node: int,
        junit: str | None,
        suite_timeout: float,
        ping_after_s: float = PING_AFTER_S,
        ping_timeout_s: float = PING_TIMEOUT_S,
    ) -> None:
        self.session = session
        self.ping_after_s = ping_after_s
        self.ping_timeout_s = ping_timeout_s
        booted = session.boot()
        self.timeout_scale = booted.settings.timeout_scale
        self.cluster = booted.cluster
        self.nodeids = nodeids
        self.node = node
        self.parser = EventParser()
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.stderr_log = session.logdir / f"node{node}.guest-pytest.log"
        self.conn = booted.nodes[node].connect()
        cmd = guest_pytest_command(
            nodeids,
            node=node,
            nodes=booted.topology.nodes,
            topology=booted.topology,
            junit=junit,
            driver=booted.settings.driver,
            timeout_scale=booted.settings.timeout_scale,
        )
        self.exit_status: int | None = None
        self.fatal: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(cmd, suite_timeout), name="guest-pytest", daemon=True
        )
        self.thread.start()

    def _feed(self, data: bytes) -> None:
        with self.lock:
            self.parser.feed(data)

    def _run(self, cmd: str, timeout: float) -> None:
        try:
            with self.stderr_log.open("ab") as human:

                def on_stderr(data: bytes) -> None:
                    human.write(data)
                    human.flush()

                result = self.conn.run(
                    cmd, timeout=timeout, on_stdout=self._feed, on_stderr=on_stderr
                )
                self.exit_status = result.exit_status
        except BaseException as exc:  # handed to the waiting test items
            self.error = exc
        finally:
            self.done.set()

    def abort(self) -> None:
        self.conn.close()
        self.thread.join(timeout=10)

    def _dead(self) -> NodeDied | None:
        for n in self.cluster.nodes:
            if not n.alive():
                return NodeDied(n.index, n.returncode(), n.console_tail())
        return None

    def _wait_dead(self, seconds: float) -> NodeDied | None:
        deadline = time.monotonic() + seconds
        while True:
            with self.lock:
                if self.parser.session_exit is not None:
                    return None  # pytest finished normally: the guest is not dying
            dead = self._dead()
            if dead is not None or time.monotonic() >= deadline:
                return dead
            time.sleep(0.1)

    def _ping(self) -> None:
        # An answer takes longer from a slower kernel or on a busy machine: scaled as the waits.
        limit = scaled(self.ping_timeout_s, scale=self.timeout_scale)
        conn = Connection(
            self.cluster.target(self.node), alive=self.cluster.all_alive, name=f"node{self.node}"
        )
        try:
            conn.connect(time.monotonic() + limit)
            conn.run("true", timeout=limit)
        except SshError as exc:
            dead = self._dead()
            if dead is not None:
                raise dead from exc
            node = self.cluster.nodes[self.node]
            raise GuestUnresponsive(
                f"node{self.node} stopped answering ({exc}); last console lines:\n"
                + node.console_tail()
            ) from exc
        finally:
            conn.close()

    def wait(self, nodeid: str, timeout: float = DEFAULT_TEST_TIMEOUT_S) -> GuestTestResult:
        """The result of `nodeid`; raises GuestGone (with the console tail) if the guest died."""
        with self.lock:
            if nodeid in self.parser.finished:
                return self.parser.results[nodeid]
        if self.fatal is not None:
            # An earlier test ended this run (hung guest, overrun): fail at once, no new waits.
            dead = self._dead()
            raise dead if dead is not None else RunnerError(f"not run: {self.fatal}")
        try:
            return self._wait(nodeid, timeout)
        except (GuestGone, CommandTimeout) as exc:
            self.fatal = exc
            raise

    def _wait(self, nodeid: str, timeout: float) -> GuestTestResult:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if nodeid in self.parser.finished:
                    return self.parser.results[nodeid]
                current = self.parser.current
                silent = time.monotonic() - self.parser.last_event
            dead = self._dead()
            if dead is not None:
                self.abort()
                raise dead
            if self.done.is_set():
                # The SSH session can end a moment before QEMU has finished exiting.
                dead = self._wait_dead(GRACE_AFTER_EOF_S)
                if dead is not None:
                    raise dead
                with self.lock:
                    if nodeid in self.parser.finished:
                        return self.parser.results[nodeid]
                    partial = self.parser.results.get(nodeid)
                err = self.error
                if err is not None and not isinstance(err, CommandTimeout):
                    dead = self._dead()
                    raise dead if dead is not None else err
                tail = (
                    self.stderr_log.read_text(errors="replace")[-3000:]
                    if self.stderr_log.exists()
                    else ""
                )
                raise RunnerError(
                    f"guest pytest ended (exit {self.exit_status}, {err or 'no error'}) without a "
                    f"result for {nodeid}"
                    + (f"; partial: {partial.outcome}" if partial else "")
                    + f"\nguest pytest output:\n{tail}"
                )
            if time.monotonic() > deadline:
                self.abort()
                raise CommandTimeout(
                    f"{nodeid}: no result after {timeout:.0f} s (running: "
                    f"{current}); guest pytest aborted"
                )
            if silent > self.ping_after_s:
                try:
                    self._ping()
                except GuestUnresponsive:
                    self.abort()
                    raise
                with self.lock:
                    self.parser.last_event = time.monotonic()
            self.done.wait(0.25)

    def results_in_order(self) -> Iterator[GuestTestResult]:
        for nodeid in self.nodeids:
            yield self.wait(nodeid)
