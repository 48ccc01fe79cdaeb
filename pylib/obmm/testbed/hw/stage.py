"""The hardware stage: the guest suite on each UB host, the cluster suite across them, over SSH.

``make hw-test HW_HOSTS=user@host1,user@host2`` (or ``HW_CONFIG=file``; keys in
:mod:`obmm.testbed.hw.config`) runs ``python -m obmm.testbed.hw.stage``:

1. **Pre-flight** (:mod:`obmm.testbed.hw.preflight`) of every host in parallel; the first failing
   check of a host ends the stage within seconds with its reason (exit status 2).
2. **Guest suite** on each host in turn: a host-side pytest (``-p obmm.testbed.suite.pytest_qemu -p
   obmm.testbed.hw.pytest_plugin tests/qemu/guest.guestsuite``) copies the package and
   ``tests/guest``
   (plus, if the host lacks pytest, a pure-Python pytest archive) to a fresh temp directory on
   the host, runs the guest pytest there with ``OBMM_TARGET=hardware`` and streams each result
   back as its own host test item (the QEMU stage's runner and reporting).  Nothing is built or
   loaded: the host's own driver is under test.  Tests marked ``emulator_only`` are skipped by
   the guest conftest with the reason, which the report and the junit XML show.
3. **Cluster suite** (``tests/cluster``, host-side) across the hosts when there are at least
   two: its conftest finds them through ``$OBMM_HW_CONFIG_JSON`` (:class:`HwCluster`), copies
   the package to a per-run directory on each, skips ``emulator_only`` tests with the reason.
   ``results/hw/cluster/`` gets ``junit.xml``, ``skipped.txt`` and each host's kernel log.
   ``--suite guest|cluster`` runs one of the two suites only.
4. **Collection**: ``results/hw/<host>/`` gets ``junit.xml`` (host view, one case per guest
   test), ``guest-junit.xml``, ``guest-pytest.log``, ``preflight.txt``, ``dmesg.txt`` (whole
   ring buffer) and ``dmesg-run.txt`` (since this run's marker), ``skipped.txt``;
   ``results/hw/summary.json`` has every host's counts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from obmm import envvars
from obmm.testbed import provision
from obmm.testbed.errors import require_package
from obmm.testbed.hw.config import ConfigError, HwConfig, HwHost, load
from obmm.testbed.hw.preflight import (
    HwConnection,
    ShippedDeps,
    connect,
    format_reports,
    preflight,
)
from obmm.testbed.paths import repo_root, results_dir
from obmm.testbed.remote import RemoteNode
from obmm.testbed.settings import scaled
from obmm.testbed.ssh import Connection, SshError
from obmm.testbed.suite import guest_suite as runner
from obmm.testbed.vm.cluster import ClusterError

log = logging.getLogger(__name__)

SUITE_FILE = "tests/qemu/guest.guestsuite"
KMSG_MARKER = "obmm-hw-test: begin"
EXIT_PREFLIGHT = 2
EMULATOR_ONLY_REASON = "emulator_only"
TESTBED_FABRIC_REASON = "testbed_fabric"


# -- the host-side session (used by pytest_qemu's items through obmm.testbed.hw.pytest_plugin) -----


class HwSession:
    """One hardware host standing where pytest_qemu expects a booted QEMU cluster.

    Duck-types :class:`obmm.testbed.suite.guest_suite.GuestSession`
    (``boot``, ``collect``, ``start``, ``connect``, ``close``) so
    :mod:`obmm.testbed.suite.pytest_qemu` turns each test run on the host into a host test item
    exactly as for a guest.
    """

    def __init__(
        self,
        config: HwConfig,
        index: int,
        *,
        results: Path,
        ship_tar: Path | None = None,
        run_id: str = "",
    ) -> None:
        self.config = config
        self.index = index
        self.host = config.hosts[index]
        self.name = self.host.spec
        self.results = results
        self.logdir = results
        self.ship_tar = ship_tar
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.workdir: PurePosixPath | None = None
        self.boot_error: BaseException | None = None
        self.runs: list[HwRun] = []

    def connect(self, node: int = 0) -> Connection:
        return connect(self.host, self.config)

    def boot(self) -> None:
        """Copy the package, the tests and (if needed) the pytest archive to a temp dir."""
        if self.workdir is not None:
            return
        if self.boot_error is not None:
            raise runner.RunnerError(f"{self.name}: preparation failed earlier: {self.boot_error}")
        try:
            self._prepare()
        except BaseException as exc:
            self.boot_error = exc
            raise

    def _prepare(self) -> None:
        self.results.mkdir(parents=True, exist_ok=True)
        payload = provision.payload_tar(repo_root())
        with self.connect() as conn:
            parent = self.config.remote_tmp
            made = conn.run(f"mktemp -d {runner._q(parent)}/obmm-hw.XXXXXX", timeout=60, check=True)
            workdir = PurePosixPath(made.out.strip())
            conn.run(f"tar -xzf - -C {workdir}", timeout=300, check=True, stdin=payload)
            if self.ship_tar is not None:
                conn.run(
                    f"mkdir -p {workdir}/pydeps && tar -xzf - -C {workdir}/pydeps",
                    timeout=300,
                    check=True,
                    stdin=self.ship_tar.read_bytes(),
                )
            # Marks where this run's kernel messages start (dmesg-run.txt); root only.
            conn.run(
                f"echo '{KMSG_MARKER} {self.run_id}' > /dev/kmsg 2>/dev/null; true", timeout=30
            )
        self.workdir = workdir
        log.info("%s: suite copied to %s", self.name, workdir)

    def pytest_command(self, args: Sequence[str], junit: str | None = None) -> str:
        assert self.workdir is not None
        root = self.workdir
        pythonpath = f"{root}/pylib" + (f":{root}/pydeps" if self.ship_tar is not None else "")
        env = {
            "PYTHONPATH": pythonpath,
            "PYTHONDONTWRITEBYTECODE": "1",
            envvars.EVENT_FD.name: str(runner.EVENT_FD),
            envvars.TARGET.name: "hardware",
            envvars.NODE_ID.name: str(self.index),
            envvars.NODE_COUNT.name: str(len(self.config.hosts)),
        }
        if self.config.decoder:
            env[envvars.DECODER.name] = self.config.decoder
        return runner.pytest_shell_command(root, env, args, junit=junit, python=self.config.python)

    def collect(
        self, paths: Sequence[str], ignore: Sequence[str] = (), node: int = 0
    ) -> runner.EventParser:
        self.boot()
        args = ["--collect-only", "-q", *[f"--ignore={p}" for p in ignore], *paths]
        with self.connect() as conn:
            return runner.collect_over(
                conn, self.pytest_command(args), f"{self.name}:", timeout=600
            )

    def start(
        self,
        nodeids: Sequence[str],
        *,
        node: int = 0,
        junit: str | None = None,
        suite_timeout: float = 4 * 3600.0,
    ) -> HwRun:
        self.boot()
        assert self.workdir is not None
        run = HwRun(
            self,
            list(nodeids),
            junit=f"{self.workdir}/results/guest-junit.xml",
            suite_timeout=suite_timeout,
        )
        self.runs.append(run)
        return run

    def close(self) -> None:
        """Fetch the guest junit, remove the temp dir (HW_KEEP=1 keeps it)."""
        for run in self.runs:
            if not run.done.is_set():
                run.abort()
        if self.workdir is None:
            return
        try:
            with self.connect() as conn:
                junit = f"{self.workdir}/results/guest-junit.xml"
                if conn.run(f"test -f {junit}", timeout=30).ok:
                    conn.get(junit, self.results / "guest-junit.xml")
                if envvars.HW_KEEP.get() != "1":
                    conn.run(f"rm -rf {self.workdir}", timeout=120)
        except SshError as exc:
            log.warning("%s: cleanup failed: %s", self.name, exc)
        self.workdir = None


class HwRun(runner.GuestRun):
    """One guest pytest on a hardware host; GuestRun's waiting, minus QEMU liveness."""

    def __init__(
        self, session: HwSession, nodeids: list[str], *, junit: str, suite_timeout: float
    ) -> None:
        self.hw = session
        self.nodeids = nodeids
        self.node = session.index
        self.parser = runner.EventParser()
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.stderr_log = session.results / "guest-pytest.log"
        self.conn = session.connect()
        self.exit_status: int | None = None
        self.fatal: BaseException | None = None
        cmd = session.pytest_command(nodeids, junit=junit)
        self.thread = threading.Thread(
            target=self._run, args=(cmd, suite_timeout), name="hw-pytest", daemon=True
        )
        self.thread.start()

    def _dead(self) -> None:
        return None  # no QEMU to watch: a silent host is found by the ping

    def _ping(self) -> None:
        try:
            with self.hw.connect() as conn:
                # This machine's load slows the answer as it does a guest's (settings.scaled).
                conn.run("true", timeout=scaled(runner.PING_TIMEOUT_S))
        except SshError as exc:
            raise runner.GuestUnresponsive(f"{self.hw.name} stopped answering ({exc})") from exc


# -- the cluster suite's view of the hosts --------------------------------------------------


class HostNode(RemoteNode):
    """A UB host as a node of the cluster suite (the :class:`~obmm.testbed.node.Node`
    interface over the stage's SSH settings)."""

    def __init__(self, index: int, host: HwHost, config: HwConfig) -> None:
        super().__init__(index, f"node{index}", addr=config.fabric_addr(index))
        self.host = host
        self.config = config
        self.set_env(node_env_for(config, index))

    def connect(self, timeout: float | None = None, *, node_only: bool = True) -> HwConnection:
        return connect(self.host, self.config)

    def alive(self) -> bool:
        return True  # no process to watch: a host that stops answering fails its SSH calls

    def console_tail(self) -> str:
        return f"({self.host.spec} is a hardware host: no console here; see its kernel log)"

    def console_since(self, marker: str) -> str:
        return ""


def node_env_for(config: HwConfig, index: int) -> dict[str, str]:
    """Environment of the suite's processes on host `index`: its node number (what handles
    carry and decoders resolve), the target, and the decoder hook."""
    env = {envvars.NODE_ID.name: str(index), envvars.TARGET.name: "hardware"}
    if config.decoder:
        env[envvars.DECODER.name] = config.decoder
    return env


@dataclass
class HwCluster:
    """The hosts as ``tests/cluster`` sees a cluster: ``nodes`` (:class:`HostNode`) and a name.

    ``tests/cluster/conftest.py`` builds it with :func:`cluster_from_env` when
    ``$OBMM_HW_CONFIG_JSON`` is set; each node's connections honour the key, agent and
    known_hosts settings of the stage.
    """

    config: HwConfig
    nodes: list[HostNode] = field(default_factory=list)
    name: str = "hardware"

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes = [HostNode(i, h, self.config) for i, h in enumerate(self.config.hosts)]

    def node_env(self, index: int) -> dict[str, str]:
        return node_env_for(self.config, index)

    def stop(self) -> None:
        for node in self.nodes:
            node.close()


def cluster_from_env() -> HwCluster | None:
    text = envvars.HW_CONFIG_JSON.raw()
    return HwCluster(HwConfig.from_json(text)) if text else None


# -- results --------------------------------------------------------------------------------


@dataclass
class JunitSummary:
    counts: dict[str, int]
    skipped: dict[str, str]  # test -> reason
    failed: list[str]

    @classmethod
    def read(cls, path: Path) -> JunitSummary:
        counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        skipped: dict[str, str] = {}
        failed: list[str] = []
        for case in ET.parse(path).getroot().iter("testcase"):
            name = case.get("name", "")
            test = f"{case.get('classname', '')}::{name}"
            if case.find("skipped") is not None:
                counts["skipped"] += 1
                skipped[test] = case.find("skipped").get("message", "")  # type: ignore[union-attr]
            elif case.find("failure") is not None:
                counts["failed"] += 1
                failed.append(test)
            elif case.find("error") is not None:
                counts["error"] += 1
                failed.append(test)
            else:
                counts["passed"] += 1
        return cls(counts, skipped, failed)


def collect_kernel_log(host: HwHost, config: HwConfig, outdir: Path, run_id: str) -> str:
    """dmesg of the host into outdir; returns a one-line verdict from obmm.tools.logscan."""
    from obmm.tools import logscan

    try:
        with connect(host, config) as conn:
            res = conn.run("dmesg 2>&1 || cat /var/log/kern.log", timeout=120)
    except SshError as exc:
        return f"kernel log not collected: {exc}"
    text = res.out
    (outdir / "dmesg.txt").write_text(text)
    cut = text.rfind(f"{KMSG_MARKER} {run_id}")
    since = text[text.find("\n", cut) + 1 :] if cut >= 0 else text
    (outdir / "dmesg-run.txt").write_text(since)
    reports = logscan.scan(since)
    if not reports:
        return "kernel log: clean during the run"
    (outdir / "kernel-reports.txt").write_text(logscan.format_reports(reports) + "\n")
    return f"kernel log: {len(reports)} report(s) during the run (kernel-reports.txt)"


def run_guest_suite(
    config: HwConfig,
    index: int,
    outdir: Path,
    *,
    ship_tar: Path | None,
    run_id: str,
    pytest_args: Sequence[str] = (),
) -> int:
    """One host: a host pytest whose items are the host's guest tests.  Returns its exit code."""
    env = dict(os.environ)
    env.update(
        {
            envvars.HW_CONFIG_JSON.name: config.to_json(),
            envvars.HW_HOST_INDEX.name: str(index),
            envvars.HW_RESULTS.name: str(outdir),
            envvars.HW_RUN_ID.name: run_id,
        }
    )
    if ship_tar is not None:
        env[envvars.HW_SHIP_DEPS_TAR.name] = str(ship_tar)
    else:
        env.pop(envvars.HW_SHIP_DEPS_TAR.name, None)
    plugins = ("-p", "obmm.testbed.suite.pytest_qemu", "-p", "obmm.testbed.hw.pytest_plugin")
    suite = f"hw-{config.hosts[index].label}"
    return _host_pytest([*plugins, *pytest_args, SUITE_FILE], outdir, suite, env)


def _host_pytest(args: Sequence[str], outdir: Path, suite: str, env: dict[str, str]) -> int:
    """pytest on this machine in the repository, junit into outdir; its exit code."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs",
            f"--junitxml={outdir / 'junit.xml'}", "-o", "junit_logging=all",
            "-o", f"junit_suite_name={suite}", *args]  # fmt: skip
    return subprocess.run(argv, cwd=repo_root(), env=env, check=False).returncode


def run_cluster_suite(
    config: HwConfig, outdir: Path, *, run_id: str, pytest_args: Sequence[str] = ()
) -> int:
    """The host-side cluster suite in hardware mode (its conftest reads ``$OBMM_HW_CONFIG_JSON``;
    it skips the ``emulator_only`` tests with the reason).  Returns pytest's exit code."""
    env = {
        **os.environ,
        envvars.HW_CONFIG_JSON.name: config.to_json(),
        envvars.HW_RUN_ID.name: run_id,
    }
    for var in (envvars.ATTACH.name, envvars.NAME.name):
        env.pop(var, None)  # the hosts are the nodes; nothing is booted or attached
    return _host_pytest([*pytest_args, "tests/cluster"], outdir, "hw-cluster", env)


def report_junit(junit: Path, outdir: Path, who: str) -> dict[str, Any]:
    """Counts, failures and skips (also into skipped.txt) of one junit file; prints one line."""
    js = JunitSummary.read(junit)
    (outdir / "skipped.txt").write_text(
        "".join(f"{t}: {why}\n" for t, why in sorted(js.skipped.items()))
    )
    emu = sum(1 for why in js.skipped.values() if EMULATOR_ONLY_REASON in why)
    fabric = sum(1 for why in js.skipped.values() if TESTBED_FABRIC_REASON in why)
    print(
        f"hw: {who}: "
        + ", ".join(f"{v} {k}" for k, v in js.counts.items())
        + f" ({emu} skipped as emulator_only, {fabric} as testbed_fabric, listed in "
        + f"{outdir / 'skipped.txt'})",
        flush=True,
    )
    return {"counts": js.counts, "failed": js.failed, "skipped": js.skipped}


def qemu_stand_in(name: str, workdir: Path) -> dict[str, Any]:
    """Config values that point the stage at a running QEMU cluster, as if it were hardware.

    Its nodes' SSH forwards become the hosts, the testbed's key the identity, and the host key
    recorded in the image manifest the only entry of a known_hosts file (strict policy).
    """
    from obmm.testbed.vm.cluster import Cluster

    cluster = Cluster.attach(name)
    workdir.mkdir(parents=True, exist_ok=True)
    known = workdir / f"known_hosts.{name}"
    lines = [f"[127.0.0.1]:{n.ssh_port} {cluster.image.host_key}\n" for n in cluster.nodes]
    known.write_text("".join(lines))
    return {
        "hosts": [f"root@127.0.0.1:{n.ssh_port}" for n in cluster.nodes],
        "fabric_addrs": [cluster.fabric_ip(i) for i in range(len(cluster.nodes))],
        "ssh_key": str(cluster.image.ssh_key),
        "known_hosts": str(known),
        "host_key_policy": "strict",
    }


DESCRIPTION = "Run the guest suite on each UB host (and the cluster suite across them)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `obmm-testbed hw-test` / `hw-preflight` (and of ``python -m`` on this
    module)."""
    parser.add_argument("--hosts", help="user@host[:port],... (default $HW_HOSTS)")
    parser.add_argument("--config", help="config file (default $HW_CONFIG)")
    parser.add_argument("--key", dest="ssh_key", help="SSH private key (default $HW_SSH_KEY)")
    parser.add_argument("--known-hosts", dest="known_hosts")
    parser.add_argument("--host-key-policy", dest="host_key_policy")
    parser.add_argument("--python", help="interpreter on the hosts (default python3)")
    parser.add_argument("--device", help="OBMM device on the hosts (default /dev/obmm)")
    parser.add_argument("--ship-deps", dest="ship_deps", choices=("auto", "always", "never"))
    parser.add_argument("--decoder", help="OBMM_DECODER spec for the hosts")
    parser.add_argument(
        "--connect-timeout", dest="connect_timeout", help="seconds per SSH login (default 10)"
    )
    parser.add_argument("--results", type=Path, default=results_dir() / "hw", help="results dir")
    parser.add_argument(
        "--qemu",
        metavar="NAME",
        default=envvars.HW_QEMU.raw(),
        help="use the running QEMU cluster NAME as the hardware (default $HW_QEMU)",
    )
    parser.add_argument("--preflight-only", action="store_true")
    parser.add_argument(
        "--suite",
        choices=("all", "guest", "cluster"),
        default="all",
        help="which suites: the guest suite on each host, the cluster suite across them, or "
        "both (default)",
    )
    parser.add_argument("--no-cluster", action="store_true", help="same as --suite guest")
    parser.add_argument("pytest_args", nargs="*", help="extra host pytest arguments (after --)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m obmm.testbed.hw.stage", description=DESCRIPTION
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="hw: %(message)s")
    try:
        return command(args)
    except (ConfigError, ClusterError) as exc:
        print(f"hw: configuration error: {exc}", file=sys.stderr)
        return EXIT_PREFLIGHT


def command(args: argparse.Namespace) -> int:
    """Pre-flight, then the suites; the exit status of the stage.  A configuration that cannot
    be used raises ConfigError (or ClusterError for a missing --qemu stand-in)."""
    require_package("pytest")  # the suites run under pytest on this machine
    env = dict(os.environ)
    if args.config:
        env[envvars.HW_CONFIG.name] = args.config
    overrides: dict[str, Any] = {
        k: getattr(args, k)
        for k in (
            "hosts",
            "ssh_key",
            "known_hosts",
            "host_key_policy",
            "python",
            "device",
            "ship_deps",
            "decoder",
            "connect_timeout",
        )
    }
    if args.qemu:
        base = qemu_stand_in(args.qemu, args.results)
        overrides = {**base, **{k: v for k, v in overrides.items() if v}}
    if args.suite == "guest" or args.no_cluster:
        overrides["cluster"] = "off"  # also spares the cross-node pre-flight checks
    config = load(env, overrides)
    results: Path = args.results
    results.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(
        f"hw: pre-flight of {len(config.hosts)} host(s): "
        + ", ".join(h.spec for h in config.hosts),
        flush=True,
    )
    shipped = ShippedDeps.collect()
    reports = preflight(config, shipped)
    text = format_reports(reports)
    print(text, flush=True)
    for rep in reports:
        hostdir = results / rep.host.label
        hostdir.mkdir(parents=True, exist_ok=True)
        (hostdir / "preflight.txt").write_text("\n".join(rep.lines()) + "\n")
    failed = [r for r in reports if not r.ok]
    if failed:
        for r in failed:
            print(f"hw: pre-flight FAILED: {r.failure}", file=sys.stderr)
        print(f"hw: stopped after {time.monotonic() - started:.1f} s", file=sys.stderr)
        return EXIT_PREFLIGHT
    if args.preflight_only:
        return 0
    ship_tar: Path | None = None
    if args.suite != "cluster" and any(r.ship_deps for r in reports):  # guest suite only
        ship_tar = results / "pydeps.tar.gz"
        ship_tar.write_bytes(shipped.tarball())
        print(f"hw: shipping pytest to hosts without it: {shipped.summary()}", flush=True)
    run_id = uuid.uuid4().hex[:12]
    summary: dict[str, Any] = {"run_id": run_id, "hosts": {}}
    status = 0
    if args.suite in ("all", "guest"):
        for i, rep in enumerate(reports):
            hostdir = results / rep.host.label
            print(f"hw: ===== guest suite on {rep.host.spec} ({rep.module}) =====", flush=True)
            t = time.monotonic()
            rc = run_guest_suite(
                config,
                i,
                hostdir,
                ship_tar=ship_tar if rep.ship_deps else None,
                run_id=run_id,
                pytest_args=args.pytest_args,
            )
            verdict = collect_kernel_log(rep.host, config, hostdir, run_id)
            entry: dict[str, Any] = {"exit": rc, "module": rep.module, "kernel_log": verdict}
            junit = hostdir / "junit.xml"
            if junit.is_file():
                entry.update(report_junit(junit, hostdir, f"{rep.host.spec} guest suite"))
            print(f"hw: {rep.host.spec}: {verdict}", flush=True)
            entry["seconds"] = round(time.monotonic() - t, 1)
            summary["hosts"][rep.host.spec] = entry
            status = status or (1 if rc else 0)
    cluster_wanted = args.suite in ("all", "cluster") and config.cluster != "off"
    if cluster_wanted and len(config.hosts) < 2:
        if args.suite == "cluster":
            print("hw: the cluster suite needs at least two hosts", file=sys.stderr)
            status = 1
    elif cluster_wanted:
        print("hw: ===== cluster suite across the hosts =====", flush=True)
        cdir = results / "cluster"
        cdir.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        rc = run_cluster_suite(config, cdir, run_id=run_id, pytest_args=args.pytest_args)
        centry: dict[str, Any] = {"exit": rc, "kernel_logs": {}}
        if (cdir / "junit.xml").is_file():
            centry.update(report_junit(cdir / "junit.xml", cdir, "cluster suite"))
        for host in config.hosts:
            hdir = cdir / host.label
            hdir.mkdir(parents=True, exist_ok=True)
            verdict = collect_kernel_log(host, config, hdir, run_id)
            centry["kernel_logs"][host.spec] = verdict
            print(f"hw: cluster suite, {host.spec}: {verdict}", flush=True)
        centry["seconds"] = round(time.monotonic() - t, 1)
        summary["cluster"] = centry
        status = status or (1 if rc else 0)
    (results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"hw: done in {time.monotonic() - started:.0f} s: "
        + ("PASSED" if status == 0 else "FAILED")
        + f"; results in {results}"
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
