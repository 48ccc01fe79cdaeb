"""`obmm-testbed` subcommands for the QEMU testbed: up, down, status, ssh, cp, console, image.

A command that cannot do its job raises a TestbedError; `obmm.tools.cli.main` prints its one
line and exits 2.  `ssh` keeps ssh(1)'s and timeout(1)'s statuses for a lost guest and a
timed-out command.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from obmm.testbed import kbuild, numaview, qemu, snapshot
from obmm.testbed.cluster import (
    DEFAULT_NAME,
    ENV_NAME,
    Cluster,
    ClusterError,
    load_topology,
    stop_all_stale,
)
from obmm.testbed.image import DEFAULT_RECIPE, ensure_image, find_recipe, list_recipes
from obmm.testbed.ssh import CommandTimeout, SshError

log = logging.getLogger(__name__)

EXIT_GUEST_GONE = 255  # like ssh(1) when the connection dies


def register(sub: Any) -> None:
    """Add the testbed subcommands to the `obmm-testbed` parser's subparsers."""
    p = sub.add_parser("up", help="boot a cluster of QEMU nodes and wait for SSH")
    _name(p)
    p.add_argument("--nodes", type=int, help="number of nodes, 1..8 (default: the topology's)")
    p.add_argument(
        "--topology",
        default="single",
        help="name under qemu/topologies/ or a JSON file (default: single)",
    )
    p.add_argument("--memory", type=int, metavar="MIB", help="RAM per node (power of two)")
    p.add_argument("--pool", type=int, metavar="MIB", help="export pool at the top of RAM")
    p.add_argument(
        "--accel",
        choices=("auto", "kvm", "tcg"),
        help="accelerator (default: $OBMM_TESTBED_ACCEL or auto: KVM if a probe boots)",
    )
    p.add_argument("--recipe", default=DEFAULT_RECIPE, help="image recipe (default %(default)s)")
    p.add_argument(
        "--init",
        choices=qemu.INIT_MODES,
        help="node userland: fast (our small init, seconds) or systemd (real-host-like) "
        "(default: $OBMM_TESTBED_INIT or %(default)s)",
    )
    p.add_argument(
        "--kmod",
        action="store_true",
        help="also build kmod/*, copy the package and tests in, and load the modules",
    )
    p.add_argument("--driver", choices=kbuild.DRIVERS, help="with --kmod: " + kbuild.DRIVER_HELP)
    p.add_argument(
        "--cold",
        action="store_true",
        help="boot even if a snapshot of this cluster shape exists (and save none)",
    )
    p.add_argument("--timeout", type=float, help="seconds to wait for SSH on every node")
    p.add_argument("--log-dir", type=Path, help="console logs (default <cache>/logs/NAME)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="stop a cluster: every QEMU killed, run dir removed")
    _name(p)
    p.add_argument("--all", action="store_true", help="every cluster, and stale run dirs")
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("status", help="show clusters, nodes, ports, pids and logs")
    p.add_argument("--name", help="only this cluster")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "ssh",
        help="run a command on a node (or a shell without one)",
        usage="obmm-testbed ssh [--name NAME] [--timeout S] NODE [-- CMD [ARGS...]]",
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
    p.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"one of {', '.join(list_recipes())}")
    p.add_argument("--rebuild", action="store_true", help="build even if cached")
    p.set_defaults(func=cmd_image)

    p = sub.add_parser("snapshot", help="list or remove the saved cluster snapshots")
    p.add_argument("action", choices=("list", "clear"))
    p.set_defaults(func=cmd_snapshot)


def _name(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--name",
        default=os.environ.get(ENV_NAME, DEFAULT_NAME),
        help="cluster name (default: $OBMM_TESTBED_NAME or %(default)s)",
    )


def _node_index(text: str) -> int:
    digits = text.removeprefix("node")
    if not digits.isdigit():
        raise ClusterError(f"not a node: {text!r} (use 0, 1, ... or node0, node1, ...)")
    return int(digits)


def _topology(args: argparse.Namespace) -> qemu.Topology:
    topo = load_topology(args.topology)
    return qemu.Topology(
        nodes=args.nodes if args.nodes is not None else topo.nodes,
        memory_mib=args.memory if args.memory is not None else topo.memory_mib,
        pool_mib=args.pool if args.pool is not None else topo.pool_mib,
        cpus=topo.cpus,
        description=topo.description,
    )


def cmd_up(args: argparse.Namespace) -> int:
    from obmm.testbed import accel as accel_mod
    from obmm.testbed.paths import cache_dir

    start = time.monotonic()
    topology = _topology(args)
    image = ensure_image(find_recipe(args.recipe))
    accel = accel_mod.choose(args.accel, image.kernel, cache_dir())
    cluster = Cluster.start(
        image,
        topology,
        name=args.name,
        accel=accel,
        init=args.init,
        logdir=args.log_dir,
        detach=True,
        timeout=args.timeout,
        snapshot=snapshot.MODE_OFF if args.cold else None,
    )
    if args.kmod:
        _prepare(cluster, args.driver)
    print(
        f"cluster {cluster.name}: {topology.nodes} node(s) up in "
        f"{time.monotonic() - start:.0f} s ({cluster.accel}"
        + (f", restored from snapshot {cluster.restored_from})" if cluster.restored_from else ")")
    )
    _print_cluster(cluster)
    return 0


def _prepare(cluster: Cluster, driver: str | None = None) -> None:
    from obmm.testbed.paths import repo_root, results_dir
    from obmm.testbed.provision import build_guest_modules, module_load_order, prepare_nodes

    kos = module_load_order(build_guest_modules(cluster.image, results_dir() / "kmod", driver))
    prepare_nodes(cluster.connect, cluster.topology, repo_root(), kos)


def cmd_down(args: argparse.Namespace) -> int:
    if not args.all:
        Cluster.attach(args.name).stop()
        print(f"cluster {args.name}: down")
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


def _print_cluster(cluster: Cluster) -> None:
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
    mini.add_argument("--name", default=args.name)
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
                " ".join(command),
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
        cluster = Cluster.attach(args.name)
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
    cluster = Cluster.attach(args.name)
    index = _node_index(args.node)
    if index >= len(cluster.nodes):
        raise ClusterError(f"cluster {args.name} has no node{index}")
    print(cluster.nodes[index].console_tail(args.lines))
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    snapshot.mode()  # a bad $OBMM_TESTBED_SNAPSHOT is reported here too, not only at `up`
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
    image = ensure_image(find_recipe(args.recipe), rebuild=args.rebuild)
    print(
        f"{image.directory}  (kernel {image.kernel_release}, built "
        f"{image.manifest.get('built_at')} in {image.manifest.get('build_seconds')} s)"
    )
    return 0
