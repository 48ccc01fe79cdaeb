"""Host pytest plugin: every guest test becomes a host test item with its own result.

A ``*.guestsuite`` file (JSON: ``{"paths": [...], "ignore": [...], "node": 0}``) under a host test
directory is collected by booting the cluster (once per host session), asking the guest's pytest
which tests exist, and yielding one :class:`GuestItem` per guest test, nested like the guest's
node ids.  The first item that runs starts one guest pytest for all selected items; each item then
waits for its own result (see :mod:`obmm.testbed.suite.guest_suite`).

Configuration is the testbed's settings (:mod:`obmm.testbed.settings`: ``OBMM_TESTBED_*``,
e.g. ``OBMM_TESTBED_TOPOLOGY``, default ``single``; the name defaults to ``qemu-test-<pid>``
so runs never collide), plus the suite's own variables (:mod:`obmm.envvars`, group ``suite``):
``OBMM_GUEST_PATHS`` (guest tests to run instead of the suite's), ``OBMM_GUEST_TEST_TIMEOUT``,
``OBMM_TESTBED_ATTACH`` (run on a cluster that is up instead of booting one) and
``OBMM_GUEST_SHARDS``: with N > 1 the suite's files are shared out over N single-node clusters
that run at once (one guest pytest each, one vCPU each: a lone TCG guest keeps one core busy),
weighed by the seconds each test took last time (``results/guest-durations.json``).  The extra
clusters boot while the first one collects; results still come in the host's order, into the
one junit file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from obmm import envvars
from obmm.testbed.parallel import on_each
from obmm.testbed.paths import repo_root, results_dir
from obmm.testbed.settings import Settings, scaled
from obmm.testbed.ssh import GuestGone
from obmm.testbed.suite import durations
from obmm.testbed.suite.guest_suite import (
    GuestRun,
    GuestSession,
    GuestTestResult,
    SuiteSession,
    durations_by_test,
    split_by_file,
)
from obmm.testbed.vm.cluster import NodeDied
from obmm.tools import interrupts

# A GuestSession, or the hardware stage's HwSession (obmm.testbed.hw.pytest_plugin).
SESSION_KEY = pytest.StashKey[SuiteSession]()
#: The guest run of each selected guest node id (one run per shard).
RUNS_KEY = pytest.StashKey[dict[str, GuestRun]]()
#: The extra shards' sessions (OBMM_GUEST_SHARDS > 1) and the thread booting them.
SHARDS_KEY = pytest.StashKey["Shards"]()
DURATIONS_FILE = "guest-durations.json"


def session_for(config: pytest.Config) -> SuiteSession:
    """The one guest session of this host pytest run (created on first use, booted lazily)."""
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        settings = Settings.from_env().with_defaults(name=f"qemu-test-{os.getpid()}")
        assert settings.name is not None
        results = results_dir()
        session = GuestSession(
            settings,
            logdir=results / "qemu" / settings.name,
            results=results,
            purpose="qemu",
            default_topology="single",
            attach=envvars.ATTACH.get(),
        )
        config.stash[SESSION_KEY] = session
        _point_latest(results / "qemu" / "latest", session.logdir)
    return session


class Shards:
    """The guest suite's extra single-node clusters (`OBMM_GUEST_SHARDS` - 1 of them), each a
    GuestSession named after the first with a suffix; booted one after the other in a thread
    (the first session built the modules already) while the first collects.  The thread lives
    until they are stopped: a non-detached QEMU dies with the thread that started it
    (PR_SET_PDEATHSIG is per thread)."""

    def __init__(self, main: GuestSession, count: int) -> None:
        self.sessions = [
            GuestSession(
                main.settings.replace(name=f"{main.name}-{k}"),
                logdir=main.logdir.with_name(f"{main.logdir.name}-{k}"),
                results=main.results,
                purpose=main.purpose,
                default_topology=main.default_topology,
            )
            for k in range(1, count)
        ]
        self.error: BaseException | None = None
        self.booted = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._boot, name="guest-shards", daemon=True)

    def _boot(self) -> None:
        try:
            for session in self.sessions:
                session.boot()
        except BaseException as exc:  # raised where the runs start
            self.error = exc
        finally:
            self.booted.set()
        self.stopped.wait()

    def ready(self) -> list[GuestSession]:
        self.booted.wait()
        if self.error is not None:
            raise self.error
        return self.sessions

    def close(self) -> None:
        self.booted.wait()
        try:
            on_each(self.sessions, lambda s: s.close())
        finally:
            self.stopped.set()
            self.thread.join()


def shard_count(session: SuiteSession) -> int:
    """How many clusters share the guest suite: 1 for the hardware stage or an attached one."""
    if not isinstance(session, GuestSession) or session.attach_to:
        return 1
    return max(1, int(envvars.GUEST_SHARDS.get()))


def _save_durations(results: Path, runs: dict[str, GuestRun]) -> None:
    done = [r.parser.results[n] for r in set(runs.values()) for n in r.parser.finished]
    durations.save(results / DURATIONS_FILE, durations_by_test(done))


def _point_latest(link: Path, target: Path) -> None:
    """results/qemu/latest -> this run's log directory (console logs, guest pytest output)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".latest-{os.getpid()}")
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)
        os.symlink(target.name, tmp)
        os.replace(tmp, link)


@contextlib.contextmanager
def uncaptured(config: pytest.Config) -> Iterator[None]:
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        yield
        return
    with capman.global_and_fixture_disabled():
        yield


class GuestTestFailed(Exception):
    def __init__(self, result: GuestTestResult) -> None:
        super().__init__(result.nodeid)
        self.result = result


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "destroys_cluster: runs last; leaves the cluster dead")
    # SIGTERM (CI cancelling a job) unwinds like Ctrl-C, so the cluster is torn down.
    interrupts.install_sigterm_unwinds()


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        try:
            shards = config.stash.get(SHARDS_KEY, None)
            if shards is not None:
                shards.close()
            session.close()
        except KeyboardInterrupt as exc:
            # A signal the stop held until it was done: pytest's report is out and nothing
            # would catch it here (a traceback, status 0); one line and 130 instead.
            print(f"pytest: interrupted ({exc}); the cluster is stopped", file=sys.stderr)
            interrupts.exiting()
            raise SystemExit(interrupts.EXIT_INTERRUPTED) from None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests that kill the guest go last, whatever file they are in.
    items.sort(key=lambda item: item.get_closest_marker("destroys_cluster") is not None)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".guestsuite":
        suite: GuestSuiteFile = GuestSuiteFile.from_parent(parent, path=file_path)
        return suite
    return None


class GuestSuiteFile(pytest.File):
    """A host-side stand-in for a guest test directory."""

    def spec(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.path.read_text())
        override = envvars.GUEST_PATHS.get()
        if override:
            data["paths"] = list(override)
            data["ignore"] = []
        return data

    def collect(self) -> Iterator[pytest.Item | pytest.Collector]:
        spec = self.spec()
        session = session_for(self.config)
        with uncaptured(self.config):
            session.boot()  # minutes on a cold cache: let its progress reach the terminal
        shards = shard_count(session)
        if shards > 1 and isinstance(session, GuestSession) and SHARDS_KEY not in self.config.stash:
            self.config.stash[SHARDS_KEY] = Shards(session, shards)
            self.config.stash[SHARDS_KEY].thread.start()
        parser = session.collect(spec["paths"], spec.get("ignore", []), node=spec.get("node", 0))
        for nodeid, longrepr in parser.collect_errors.items():
            yield GuestCollectError.from_parent(
                self, name=nodeid or "collection", longrepr=longrepr
            )
        tree: dict[str, Any] = {}
        for nodeid in parser.collected:
            node = tree
            for part in nodeid.split("::")[:-1]:
                node = node.setdefault(part, {})
            node[nodeid.split("::")[-1]] = nodeid
        yield from _build(self, tree, self)


def _build(
    parent: pytest.Collector, tree: dict[str, Any], suite: GuestSuiteFile
) -> Iterator[pytest.Item | pytest.Collector]:
    for name, sub in tree.items():
        if isinstance(sub, str):
            yield GuestItem.from_parent(parent, name=name, guest_nodeid=sub, suite=suite)
        else:
            yield GuestCollector.from_parent(parent, name=name, tree=sub, suite=suite)


class GuestCollector(pytest.Collector):
    """A guest test file or class."""

    def __init__(self, *, tree: dict[str, Any], suite: GuestSuiteFile, **kw: Any) -> None:
        super().__init__(**kw)
        self.tree = tree
        self.suite = suite

    def collect(self) -> Iterator[pytest.Item | pytest.Collector]:
        yield from _build(self, self.tree, self.suite)


class GuestCollectError(pytest.Item):
    """A guest test file that failed to import: a failing host item, not a silent gap."""

    def __init__(self, *, longrepr: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.longrepr = longrepr

    def runtest(self) -> None:
        raise GuestTestFailed(GuestTestResult(self.name, "error", self.longrepr))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        return f"guest collection error in {self.name}:\n{self.longrepr}"

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"guest collect: {self.name}"


class GuestItem(pytest.Item):
    """One guest test, reported on the host with the guest's outcome and output."""

    def __init__(self, *, guest_nodeid: str, suite: GuestSuiteFile, **kw: Any) -> None:
        super().__init__(**kw)
        self.guest_nodeid = guest_nodeid
        self.suite = suite

    def _run(self) -> GuestRun:
        runs = self.suite.stash.get(RUNS_KEY, None)
        if runs is None:
            selected = [
                i.guest_nodeid
                for i in self.session.items
                if isinstance(i, GuestItem) and i.suite is self.suite
            ]
            sessions = [session_for(self.config)]
            shards = self.config.stash.get(SHARDS_KEY, None)
            if shards is not None:
                with uncaptured(self.config):
                    sessions += shards.ready()
            spec = self.suite.spec()
            junit = "/opt/obmm-testbed/results/guest-junit.xml"
            results = results_dir()
            runs = {}
            weights = durations.load(results / DURATIONS_FILE)
            for session, group in zip(sessions, split_by_file(selected, len(sessions), weights)):
                run = session.start(group, node=spec.get("node", 0), junit=junit)
                runs.update(dict.fromkeys(group, run))
            self.suite.stash[RUNS_KEY] = runs
            self.config.add_cleanup(lambda: _save_durations(results, runs))
        return runs[self.guest_nodeid]

    def runtest(self) -> None:
        run = self._run()
        timeout = scaled(
            float(envvars.GUEST_TEST_TIMEOUT.get()), scale=_timeout_scale(session_for(self.config))
        )
        with run.lock:
            running_before = run.parser.current
        try:
            result = run.wait(self.guest_nodeid, timeout=timeout)
        except NodeDied as exc:
            with run.lock:
                was_running = run.parser.current
            if was_running not in (None, self.guest_nodeid) or (
                running_before is not None and running_before != self.guest_nodeid
            ):
                node = exc.node
                raise GuestGone(
                    f"not run: node{node} died during {was_running or running_before}; see that "
                    f"test's failure for the console tail"
                ) from exc
            raise
        for title, text in result.sections:
            # Map to the host's stdout/stderr/log sections so -rA and junit show them.
            key = "stdout"
            if title.startswith("Captured stderr"):
                key = "stderr"
            elif title.startswith("Captured log"):
                key = "log"
            self.add_report_section("call", key, f"--- guest: {title} ---\n{text}")
        if result.outcome in ("failed", "error"):
            raise GuestTestFailed(result)
        if result.outcome == "skipped":
            # Reported at the guest test's name, not at this line.
            raise pytest.skip.Exception(
                result.reason or "skipped in the guest", _use_item_location=True
            )
        if result.outcome == "xfailed":
            pytest.xfail(result.reason)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        exc = excinfo.value
        if isinstance(exc, GuestTestFailed):
            return f"guest test {exc.result.nodeid}: {exc.result.outcome}\n{exc.result.longrepr}"
        if isinstance(exc, GuestGone):
            return f"guest test {self.guest_nodeid}: {exc}"
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        # Line 0, not None: pytest asserts a line for skips reported at the item's location.
        return self.path, 0, f"guest: {self.guest_nodeid}"


@pytest.fixture(scope="session")
def guest_session(request: pytest.FixtureRequest) -> GuestSession:
    """The booted, prepared cluster of this run (shared with the generated guest items)."""
    session = session_for(request.config)
    if not isinstance(session, GuestSession):
        raise pytest.UsageError("guest_session is the QEMU testbed's; this run's nodes are hosts")
    with uncaptured(request.config):
        session.boot()
    return session


def _timeout_scale(session: SuiteSession) -> float:
    settings = getattr(session, "settings", None)
    return settings.timeout_scale if isinstance(settings, Settings) else 1.0


def source_root() -> Path:
    return repo_root()
