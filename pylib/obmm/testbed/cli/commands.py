"""`obmm-testbed` subcommands of the testbed, all registered here: up, down, status, ssh, cp,
console, image, dev, numa; kmod, kmod-matrix, fuzz-diff, hw-test, hw-preflight, run,
patch-check, doctor.

A command that cannot do its job raises a TestbedError; `obmm.testbed.cli.main.main` prints its one
line and exits 2.  `ssh` keeps ssh(1)'s and timeout(1)'s statuses for a lost guest and a
timed-out command.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from obmm.testbed import settings as settings_mod
from obmm.testbed.builds.image import DEFAULT_RECIPE, find_recipe, list_recipes
from obmm.testbed.builds.kernels import guest_image
from obmm.testbed.cli import dev, doctor, kmod, numaview, run
from obmm.testbed.hw import stage as hwstage
from obmm.testbed.settings import Settings
from obmm.testbed.ssh import EXIT_GUEST_GONE, CommandTimeout, SshError
from obmm.testbed.stages import fuzzdiff, matrix, patchstage
from obmm.testbed.vm import ownership, qemu, snapshot
from obmm.testbed.vm.cluster import (
    DEFAULT_NAME,
    Cluster,
    ClusterError,
)
from obmm.testbed.vm.reaping import reap_dead_owners, stop_all_stale

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    """Add the testbed's verbs to the `obmm-testbed` parser's subparsers: the one registry of
    them (main adds the tools' and the bench's).  A verb's module keeps its options
    (`add_arguments`) and its `command`; ``python -m`` on the module runs the same command."""
    p = sub.add_parser("up", help="boot a cluster of QEMU nodes and wait for SSH")
    settings_mod.add_arguments(p, defaults_text={"topology": "single", "name": DEFAULT_NAME})
    p.add_argument(
        "--kmod",
        action="store_true",
        help="also build kmod/*, copy the package and tests in, and load the modules "
        "(with any --param)",
    )
    p.add_argument(
        "--cold", action="store_true", help="boot even if a snapshot fits (--snapshot off)"
    )
    p.add_argument("--log-dir", type=Path, help="console logs (default <cache>/logs/NAME)")
    p.add_argument(
        "-v",
        "--timeline",
        action="store_true",
        help="print where the seconds went: each node's steps from QEMU's start to the first "
        "login, on the host's clock from the command's start (`status` prints it too)",
    )
    p.set_defaults(func=cmd_up)

    p = sub.add_parser(
        "dev",
        help="the inner loop: rebuild what changed, reload the modules, run the guest tests "
        "you name on a cluster kept up between calls",
        description=dev.__doc__.split("\n\n", 1)[0] if dev.__doc__ else None,
    )
    dev.add_arguments(p)
    p.set_defaults(func=dev.command)

    p = sub.add_parser("down", help="stop a cluster: every QEMU killed, run dir removed")
    _name(p)
    p.add_argument("--all", action="store_true", help="every cluster, and stale run dirs")
    p.set_defaults(func=cmd_down)

    p = sub.add_parser(
        "gc",
        help="remove what clusters and scratch directories whose owner died left behind "
        "(every command does this first; this says what it removed)",
    )
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("status", help="show clusters, nodes, ports, pids and logs")
    p.add_argument("--name", help="only this cluster")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "ssh",
        help="run a command on a node (or a shell without one)",
        usage="obmm-testbed ssh [--name NAME] [--timeout S] NODE [-- CMD [ARGS...]]",
        description="The words after -- are joined with spaces into one shell command, as "
        "ssh(1) does.",
    )
    _name(p)
    p.add_argument("--timeout", type=float, default=24 * 3600.0, help="command deadline (s)")
    # REMAINDER, split by hand at `--`: argparse cannot mix options after NODE with a command.
    p.add_argument("rest", nargs=argparse.REMAINDER, help="NODE [-- CMD [ARGS...]]")
    p.set_defaults(func=cmd_ssh)

    p = sub.add_parser("numa", help="show each node's NUMA nodes and borrowed (NUMA_REMOTE) memory")
    numaview.add_arguments(p)
    p.set_defaults(func=numaview.command)

    p = sub.add_parser("cp", help="copy files: SRC NODE:DST or NODE:SRC DST")
    _name(p)
    p.add_argument("src")
    p.add_argument("dst")
    p.set_defaults(func=cmd_cp)

    p = sub.add_parser("console", help="print the tail of a node's serial console log")
    _name(p)
    p.add_argument("node")
    p.add_argument("-n", "--lines", type=int, default=40)
    p.set_defaults(func=cmd_console)

    p = sub.add_parser("image", help="build (if needed) the guest image and print its path")
    settings_mod.add_arguments(
        p,
        ["recipe", "kernel", "arch"],
        defaults_text={"recipe": f"{DEFAULT_RECIPE}; one of " + ", ".join(list_recipes())},
    )
    p.add_argument("--rebuild", action="store_true", help="build even if cached")
    p.set_defaults(func=cmd_image)

    p = sub.add_parser("snapshot", help="list or remove the saved cluster snapshots")
    p.add_argument("action", choices=("list", "clear"))
    p.set_defaults(func=cmd_snapshot)

    # Stages that build or test outside a booted cluster, run (a cluster of its own for your
    # code) and doctor (can this host run it).
    p = sub.add_parser("kmod", help="build kmod/* against the guest kernel and pre-flight them")
    kmod.add_arguments(p)
    p.set_defaults(func=kmod.command)

    p = sub.add_parser("kmod-matrix", help="build kmod/* against every kernel of the matrix")
    matrix.add_arguments(p)
    p.set_defaults(func=matrix.command)

    p = sub.add_parser("fuzz-diff", help=fuzzdiff.DESCRIPTION)
    fuzzdiff.add_arguments(p)
    p.set_defaults(func=fuzzdiff.command)

    p = sub.add_parser("hw-test", help="the guest and cluster suites on real UB hosts over SSH")
    hwstage.add_arguments(p)
    p.set_defaults(func=hwstage.command)

    p = sub.add_parser("hw-preflight", help="only the hardware stage's pre-flight checks")
    hwstage.add_arguments(p)
    p.set_defaults(func=hwstage.command, preflight_only=True)

    p = sub.add_parser(
        "run",
        help="boot a cluster, copy a directory in, run commands on every node, tear down",
        usage="obmm-testbed run [--nodes N] [--node N=CMD]... [--service N --ready-port P | "
        "--ready-line TEXT] [--dir PATH] [--dest PATH] [--timeout S] [--keep] [-- CMD...]",
    )
    run.add_arguments(p)
    p.set_defaults(func=run.command)

    patchstage.register(sub)

    p = sub.add_parser(
        "doctor", help="check the host: QEMU, compiler, KVM, memory, /dev/shm, cache"
    )
    doctor.add_arguments(p)
    p.set_defaults(func=doctor.command)


def _name(p: argparse.ArgumentParser) -> None:
    settings_mod.add_arguments(p, ["name"], defaults_text={"name": DEFAULT_NAME})
    p.set_defaults(cluster_name=cluster_name)


def cluster_name(args: argparse.Namespace) -> str:
    """The cluster a command acts on: --name, else $OBMM_TESTBED_NAME, else `default`."""
    return settings_mod.from_args(args).with_defaults(name=DEFAULT_NAME).name or DEFAULT_NAME


def _node_index(text: str) -> int:
    digits = text.removeprefix("node")
    if not digits.isdigit():
        raise ClusterError(f"not a node: {text!r} (use 0, 1, ... or node0, node1, ...)")
    return int(digits)


def cmd_up(args: argparse.Namespace) -> int:
    from obmm.testbed.session import bring_up
    from obmm.testbed.vm.timeline import Timeline

    timeline = Timeline.since_process_start()
    settings = settings_mod.from_args(args).with_defaults(topology="single", name=DEFAULT_NAME)
    if args.cold:
        settings = settings.replace(snapshot="off")
    if settings.driver_params and not args.kmod:
        raise ClusterError(
            "--param / --coherence: module parameters need --kmod (the modules are not loaded)"
        )
    session = bring_up(
        settings,
        purpose="up",
        load_modules=args.kmod,
        detach=True,
        logdir=args.log_dir,
        timeline=timeline,
    )
    cluster = session.cluster
    session.close_connections()
    timeline.mark("returned")
    timeline.mark_command_cpu()
    cluster.disown()  # saves the state, the timeline with it
    print(
        f"cluster {cluster.name}: {cluster.topology.nodes} node(s) up in "
        f"{timeline.cluster['returned']:.1f} s ({cluster.accel}"
        + (f", restored from snapshot {cluster.restored_from})" if cluster.restored_from else ")")
    )
    _print_cluster(cluster, timeline=args.timeline or args.verbose)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    if not args.all:
        Cluster.attach(cluster_name(args)).stop()
        print(f"cluster {cluster_name(args)}: down")
        return 0
    for name in Cluster.names():
        try:
            cluster = Cluster.attach(name)
        except ClusterError:
            continue  # half-gone: stop_all_stale below removes what is left of it
        cluster.stop()
        print(f"cluster {name}: down")
    for name in stop_all_stale():
        print(f"cluster {name}: stale state removed")
    return 0


def _print_cluster(cluster: Cluster, *, timeline: bool = True) -> None:
    t = cluster.topology
    print(
        f"cluster {cluster.name}: {t.nodes} node(s), {t.memory_mib} MiB each "
        f"(pool {t.pool_mib} MiB), accel {cluster.accel}, init {cluster.init}, "
        f"run dir {cluster.rundir}"
    )
    for n in cluster.nodes:
        state = "running" if n.alive() else "DEAD"
        fabric = f"  net {qemu.fabric_ip(n.index)}" if t.nodes > 1 else ""
        print(
            f"  node{n.index}: {state:7} pid {n.pid:<7} ssh 127.0.0.1:{n.ssh_port}{fabric}  "
            f"console {n.console_log}"
        )
    if t.nodes > 1:
        hub = "running" if cluster.hub_alive() else "DEAD"
        print(f"  network hub: {hub} pid {cluster.hub_pid} (unix sockets in {cluster.rundir})")
    if timeline and cluster.timeline.cluster:
        for line in cluster.timeline.format():
            print(f"  {line}")


def cmd_gc(args: argparse.Namespace) -> int:
    names = reap_dead_owners()
    scratch = ownership.reap_scratch()
    for name in names:
        print(f"cluster {name}: no live owner; stopped and removed")
    for path in scratch:
        print(f"scratch {path}: its owner died; removed")
    if not names and not scratch:
        print("nothing left behind by a dead owner")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if args.name:
        cluster = Cluster.attach(args.name)
        _print_cluster(cluster)
        return 0 if cluster.all_alive() else 1
    names = Cluster.names()
    if not names:
        print("no clusters")
        return 0
    status = 0
    for name in names:
        try:
            cluster = Cluster.attach(name)
        except ClusterError as exc:
            print(f"cluster {name}: {exc}")
            status = 1
            continue
        _print_cluster(cluster)
        if not cluster.all_alive():
            status = 1
    return status


def split_ssh_args(args: argparse.Namespace) -> tuple[str, str, float, list[str]]:
    """(name, node, timeout, command) from `ssh`'s arguments; options may follow NODE."""
    rest = list(args.rest)
    if "--" in rest:
        cut = rest.index("--")
        head, command = rest[:cut], rest[cut + 1 :]
    else:
        head, command = rest[:1], rest[1:]  # `ssh 0 uname -a`
    mini = argparse.ArgumentParser(prog="obmm-testbed ssh", add_help=False)
    mini.add_argument("node")
    mini.add_argument("--name", default=cluster_name(args))
    mini.add_argument("--timeout", type=float, default=args.timeout)
    parsed = mini.parse_args(head)
    return parsed.name, parsed.node, parsed.timeout, command


def cmd_ssh(args: argparse.Namespace) -> int:
    try:
        name, node_arg, timeout, command = split_ssh_args(args)
    except SystemExit:
        return 2
    try:
        cluster = Cluster.attach(name)
        index = _node_index(node_arg)
        if index >= len(cluster.nodes):
            raise ClusterError(f"cluster {name} has no node{index}")
        if not command:
            return _interactive(cluster, index)
        with cluster.connect(index) as conn:
            result = conn.run(
                " ".join(command),  # as ssh(1) joins the words of a remote command
                timeout=timeout,
                on_stdout=_writer(sys.stdout.buffer),
                on_stderr=_writer(sys.stderr.buffer),
            )
    except CommandTimeout as exc:
        log.error("%s", exc)
        return 124  # like timeout(1)
    except SshError as exc:
        dead = [n for n in cluster.nodes if not n.alive()]
        log.error("%s", exc)
        for dead_node in dead:
            log.error(
                "%s console (%s), last lines:\n%s",
                dead_node.name,
                dead_node.console_log,
                dead_node.console_tail(),
            )
        return EXIT_GUEST_GONE
    return result.exit_status if result.exit_status >= 0 else EXIT_GUEST_GONE


def _writer(stream: BinaryIO) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return write


def _interactive(cluster: Cluster, index: int) -> int:
    if shutil.which("ssh") is None:
        raise ClusterError("no ssh client for an interactive shell; pass a command after --")
    target = cluster.target(index)
    known = cluster.rundir / "known_hosts"
    if target.host_key:
        known.write_text(f"[127.0.0.1]:{target.port} {target.host_key}\n")
    argv = [
        "ssh",
        "-i",
        str(target.key_file),
        "-p",
        str(target.port),
        "-o",
        f"UserKnownHostsFile={known}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "IdentitiesOnly=yes",
        f"{target.user}@127.0.0.1",
    ]
    os.execvp(argv[0], argv)


def cmd_cp(args: argparse.Namespace) -> int:
    try:
        cluster = Cluster.attach(cluster_name(args))
        if ":" in args.dst and not Path(args.dst).exists():
            node_s, _, remote = args.dst.partition(":")
            with cluster.connect(_node_index(node_s)) as conn:
                conn.put(Path(args.src), remote or ".")
        elif ":" in args.src:
            node_s, _, remote = args.src.partition(":")
            with cluster.connect(_node_index(node_s)) as conn:
                conn.get(remote, Path(args.dst))
        else:
            raise ClusterError("one of SRC and DST must be NODE:PATH")
    except OSError as exc:  # a local path that is not there, or cannot be written
        raise ClusterError(f"cp: {exc}") from exc
    return 0


def cmd_console(args: argparse.Namespace) -> int:
    cluster = Cluster.attach(cluster_name(args))
    index = _node_index(args.node)
    if index >= len(cluster.nodes):
        raise ClusterError(f"cluster {cluster_name(args)} has no node{index}")
    print(cluster.nodes[index].console_tail(args.lines))
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    Settings.from_env()  # a bad $OBMM_TESTBED_* setting is reported here too, not only at `up`
    if args.action == "clear":
        print(f"{snapshot.clear()} snapshot(s) removed from {snapshot.snapshots_dir()}")
        return 0
    snaps = snapshot.list_all()
    if not snaps:
        print(f"no snapshots in {snapshot.snapshots_dir()}")
        return 0
    for snap in snaps:
        key = snap.manifest["key"]
        topo = key["topology"]
        print(
            f"{snap.digest}  {topo['nodes']} node(s) x {topo['memory_mib']} MiB "
            f"(pool {topo['pool_mib']}), init {key['init']}, {key['accel']}, "
            f"{key['qemu'].get('version', '?')}; {snap.size >> 20} MiB, "
            f"saved {snap.manifest.get('created', '?')}"
        )
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    settings = settings_mod.from_args(args)
    image = guest_image(
        find_recipe(settings.recipe),
        rebuild=args.rebuild,
        kernel=settings.kernel,
        arch=settings.arch,
    )
    print(
        f"{image.directory}  (kernel {image.kernel_release}, built "
        f"{image.manifest.get('built_at')} in {image.manifest.get('build_seconds')} s)"
    )
    return 0
