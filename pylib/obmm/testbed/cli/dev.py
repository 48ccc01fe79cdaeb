"""`obmm-testbed dev`: the inner loop -- edit a module or a guest test, run the tests you name.

    obmm-testbed dev tests/guest/test_export.py::test_export_zeroed     # first call: boots
    $EDITOR kmod/obmm_emu/export.c
    obmm-testbed dev tests/guest/test_export.py::test_export_zeroed     # rebuild, reload, run

The first call brings a cluster up (:func:`obmm.testbed.session.bring_up`, name ``dev`` unless
told, one node unless told) and leaves it running, owned by nobody (``obmm-testbed down --name
dev`` ends it).  Every call then:

1. builds the modules (only what changed is compiled again:
   :func:`obmm.testbed.builds.kbuild.sync_sources`),
2. puts a fresh payload (package, guest tests, modules) on every node,
3. reloads the modules on every node if they (or ``--param``) changed since they were loaded,
4. runs the guest pytest on node 0 with the given arguments, its output on this terminal,

and exits with pytest's status.  The kernel-log guard of the guest suite applies (a WARN
during a test fails it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from obmm.testbed import settings as settings_mod
from obmm.testbed.node import OutputFn
from obmm.testbed.paths import results_dir
from obmm.testbed.progress import Progress
from obmm.testbed.session import Session, attach, bring_up
from obmm.testbed.settings import Settings, scaled
from obmm.testbed.vm.cluster import Cluster, ClusterError, rundir_for

DEFAULT_NAME = "dev"
#: In the cluster's run directory: what the modules loaded on the nodes were built from.
LOADED_RECORD = "dev-loaded.json"
DEFAULT_PATHS = ("tests/guest",)
TEST_TIMEOUT_S = 3600.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    settings_mod.add_arguments(
        p,
        [k.field for k in settings_mod.KNOBS],
        defaults_text={"name": DEFAULT_NAME, "topology": "single"},
    )
    p.add_argument(
        "pytest_args",
        nargs="*",
        metavar="ARG",
        help="what the guest pytest gets: test files or node ids under tests/guest, options "
        f"(after --); default {' '.join(DEFAULT_PATHS)}",
    )


def modules_digest(kos: Sequence[Path], params: Sequence[str]) -> str:
    h = hashlib.sha256()
    for ko in kos:
        h.update(ko.name.encode() + b"\0" + ko.read_bytes())
    h.update("\0".join(params).encode())
    return h.hexdigest()


def command(args: argparse.Namespace) -> int:
    settings = settings_mod.from_args(args).with_defaults(name=DEFAULT_NAME, topology="single")
    assert settings.name is not None
    progress = Progress(f"dev {settings.name}")
    t0 = time.monotonic()
    session = _session(settings, progress)
    try:
        # the guest suite's build: its tests may use the test-only parameters
        kos = session.refresh_payload(results_dir() / "kmod", test_hooks=True)
        t2 = time.monotonic()
        reloaded = _reload_if_changed(session, kos, settings.driver_params)
        t3 = time.monotonic()
        progress.line(
            f"build and payload {t2 - t0:.1f} s, "
            + (f"modules reloaded {t3 - t2:.1f} s" if reloaded else "modules unchanged")
        )
        status = _run_tests(session, list(args.pytest_args) or list(DEFAULT_PATHS))
        progress.line(f"pytest exit status {status}; whole loop {time.monotonic() - t0:.1f} s")
        return status
    finally:
        session.close_connections()


def _session(settings: Settings, progress: Progress) -> Session:
    """The running cluster of that name, or a new one left running."""
    assert settings.name is not None
    if (rundir_for(settings.name) / "state.json").exists():
        cluster = Cluster.attach(settings.name)
        if cluster.all_alive():
            return attach(settings, settings.name)
        raise ClusterError(
            f"cluster {settings.name}: a node is dead; `obmm-testbed down --name "
            f"{settings.name}` and run dev again"
        )
    progress.line(f"no cluster {settings.name} yet: bringing one up (it stays up)")
    session = bring_up(
        settings, purpose="dev", default_topology="single", detach=True, test_hooks=True
    )
    session.cluster.disown()
    _record(session, session.modules, settings.driver_params)
    return session


def _record(session: Session, kos: Sequence[Path], params: Sequence[str]) -> None:
    record = {"modules": modules_digest(kos, params)}
    (session.cluster.rundir / LOADED_RECORD).write_text(json.dumps(record) + "\n")


def _reload_if_changed(session: Session, kos: Sequence[Path], params: Sequence[str]) -> bool:
    """Unload and load the modules again on every node unless the loaded ones are these."""
    try:
        loaded = json.loads((session.cluster.rundir / LOADED_RECORD).read_text())["modules"]
    except (OSError, ValueError, KeyError):
        loaded = None
    if loaded == modules_digest(kos, params):
        return False
    session.reload_modules(kos, params)
    _record(session, kos, params)
    return True


def _run_tests(session: Session, pytest_args: list[str]) -> int:
    from obmm.testbed.suite.guest_suite import guest_pytest_human_command

    node = session.nodes[0]
    cmd = guest_pytest_human_command(
        pytest_args, node=0, nodes=len(session.nodes), topology=session.topology,
        driver=session.settings.driver, timeout_scale=session.settings.timeout_scale,
    )  # fmt: skip
    res = node.run(
        cmd,
        timeout=scaled(TEST_TIMEOUT_S, scale=session.settings.timeout_scale),
        bare=True,
        on_stdout=_writer(sys.stdout.buffer),
        on_stderr=_writer(sys.stderr.buffer),
    )
    return res.exit_status


def _writer(stream: object) -> OutputFn:
    def write(data: bytes) -> None:
        stream.write(data)  # type: ignore[attr-defined]
        stream.flush()  # type: ignore[attr-defined]

    return write
