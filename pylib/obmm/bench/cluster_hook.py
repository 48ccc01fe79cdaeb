"""`obmm-testbed bench` on a QEMU cluster: the testbed-speed figures and the guest figures.

Steps, each timed: a cold image build into a throw-away cache (unless skipped), the cached
image lookup, boot-to-SSH of 1, 2, 4 and 8 nodes with the fast init and with systemd
(interleaved, several samples each), then on a pair
with a 1 GiB export pool per node (``qemu/topologies/bench-pair.json``) the data-path, Engram
and control-path figures of `obmm.bench.runner.run_cluster_bench`.  Every cluster it boots is
stopped again, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from obmm.bench.results import Environment, Figure, Run
from obmm.bench.runner import (
    GUEST_PYTHON,
    BenchConfig,
    callables_for,
    make_testbed_figure,
    run_cluster_bench,
)
from obmm.bench.suite_timing import SUITES, run_once, suite_figures

if TYPE_CHECKING:
    from obmm.testbed.image import Image

BOOT_SIZES = {1: "single", 2: "pair", 4: "quad"}  # the test suites' topologies
BENCH_TOPOLOGY = "bench-pair"
QEMU_TEST_TIMINGS = Path("results") / "qemu-test-timings.json"


def _qemu_test_figures(timings: Path) -> list[Figure]:
    """`make qemu-test` wall times recorded by earlier runs (`record_qemu_test`), if any."""
    try:
        doc = json.loads(timings.read_text())
    except (OSError, ValueError):
        return []
    figures = []
    for kind in ("cold", "warm"):
        entry = doc.get(kind)
        if entry:
            figures.append(
                make_testbed_figure(
                    f"testbed.qemu_test.{kind}",
                    [float(entry["seconds"])],
                    baseline=None if kind == "cold" else "testbed.qemu_test.cold",
                    note=f"recorded by make qemu-test at {entry['finished']}, not in this run",
                )
            )
    return figures


def _green(junit: Path) -> bool:
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return False
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return not (suite is None or int(suite.get("failures", "0")) or int(suite.get("errors", "0")))


def record_qemu_test(junit: Path, seconds: float, image_built: bool, out: Path) -> None:
    """Remember one green `make qemu-test` wall time as cold (image built) or warm."""
    if not _green(junit):
        return
    try:
        doc = json.loads(out.read_text())
    except (OSError, ValueError):
        doc = {}
    doc["cold" if image_built else "warm"] = {
        "seconds": round(seconds, 1),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")


def image_built_since(start_epoch: float) -> bool:
    """Whether the cached default image was built at or after `start_epoch` (a cold run)."""
    from obmm.testbed.image import ensure_image

    built_at = ensure_image().manifest.get("built_at", "")
    try:
        built = time.mktime(time.strptime(built_at, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    except ValueError:
        return False
    return built >= start_epoch - 1


def main(argv: list[str] | None = None) -> int:
    """`python -m obmm.bench.cluster_hook record START_EPOCH JUNIT...` (from `make qemu-test`)."""
    p = argparse.ArgumentParser(prog="python -m obmm.bench.cluster_hook")
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="remember a green make qemu-test's wall time")
    rec.add_argument("start_epoch", type=float)
    rec.add_argument("junit", type=Path, nargs="+")
    rec.add_argument("--out", type=Path, default=QEMU_TEST_TIMINGS)
    args = p.parse_args(argv)
    seconds = time.time() - args.start_epoch
    built = image_built_since(args.start_epoch)
    for junit in args.junit:
        if not _green(junit):
            print(f"qemu-test timing not recorded: {junit} is not green")
            return 0
    record_qemu_test(args.junit[0], seconds, built, args.out)
    print(f"qemu-test took {seconds:.0f} s ({'cold' if built else 'warm'}), recorded in {args.out}")
    return 0


def boot_figure_name(init: str, nodes: int) -> str:
    return f"testbed.boot_to_ssh.{init}.{nodes}node{'s' if nodes > 1 else ''}"


def boot_figures(
    image: Image,
    accel: str,
    sizes: list[int],
    inits: list[str],
    samples: int,
    say: Callable[[str], None],
) -> list[Figure]:
    """Boot-to-SSH of each cluster size with each init, `samples` times, interleaved.

    The boots of one size alternate between the inits (fast, systemd, fast, ...) so that a
    drift of the machine's speed hits both alike; the fast boot's baseline is the systemd boot
    of the same size, so the summary shows their ratio.
    """
    from obmm.testbed.cluster import Cluster, load_topology

    figures = []
    for nodes in sizes:
        topology = load_topology(BOOT_SIZES.get(nodes, "pair")).with_nodes(nodes)
        times: dict[str, list[float]] = {init: [] for init in inits}
        for k in range(samples):
            for init in inits:
                say(f"boot {nodes} node(s), init {init}, sample {k + 1}/{samples}")
                start = time.monotonic()
                # snapshot off: a cold boot is what this figure is.
                with Cluster.start(
                    image, topology, name=f"bench-{nodes}", accel=accel, init=init, snapshot="off"
                ):
                    times[init].append(time.monotonic() - start)
        for init in inits:
            base = "systemd" if init != "systemd" and "systemd" in inits else None
            figures.append(
                make_testbed_figure(
                    boot_figure_name(init, nodes),
                    times[init],
                    baseline=boot_figure_name(base, nodes) if base else None,
                    note=f"{topology.memory_mib} MiB per node, {accel}",
                )
            )
    return figures


def restore_figure_name(nodes: int) -> str:
    return f"testbed.restore_to_ssh.{nodes}node{'s' if nodes > 1 else ''}"


def restore_figures(
    image: Image, accel: str, sizes: list[int], samples: int, say: Callable[[str], None]
) -> list[Figure]:
    """Snapshot restore to SSH of each cluster size (fast init), `samples` times.

    The first start of a size makes sure a snapshot exists (a cold boot that saves one, not
    counted); its baseline is the cold fast boot of the same size.
    """
    from obmm.testbed.cluster import Cluster, load_topology

    figures = []
    for nodes in sizes:
        topology = load_topology(BOOT_SIZES.get(nodes, "pair")).with_nodes(nodes)
        with Cluster.start(image, topology, name=f"bench-{nodes}", accel=accel, init="fast"):
            pass
        times = []
        for k in range(samples):
            say(f"restore {nodes} node(s) from a snapshot, sample {k + 1}/{samples}")
            start = time.monotonic()
            with Cluster.start(
                image, topology, name=f"bench-{nodes}", accel=accel, init="fast"
            ) as cluster:
                times.append(time.monotonic() - start)
                if cluster.restored_from is None:
                    raise RuntimeError(f"{nodes} node(s): booted cold, no snapshot restored")
        figures.append(
            make_testbed_figure(
                restore_figure_name(nodes),
                times,
                baseline=boot_figure_name("fast", nodes),
                note=f"{topology.memory_mib} MiB per node, {accel}",
            )
        )
    return figures


#: What each node runs for the parallel-TCG cost: a slice of the guest suite (Python, ioctls,
#: mappings: the suites' own mix), on both nodes of a pair at once.
TCG_WORKLOAD = (
    "cd /opt/obmm-testbed && PYTHONPATH=pylib python3 -m pytest -q -p no:cacheprovider "
    "tests/guest/test_export.py tests/guest/test_shmdev.py"
)
TCG_VARIANTS = ("tcg", "tcg-serial")  # obmm.testbed.qemu.ACCEL_TCG_SERIAL


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tcg_figure_name(accel: str, what: str) -> str:
    return f"testbed.{accel.replace('-', '_')}.{what}"


def _tcg_sample(image: Image, accel: str, kos: list[Path]) -> tuple[float, float]:
    """TCG_WORKLOAD on both nodes of a pair started with `accel`: (wall s, QEMU CPU s)."""
    from obmm.testbed.cluster import Cluster, load_topology
    from obmm.testbed.parallel import on_each
    from obmm.testbed.paths import repo_root
    from obmm.testbed.provision import prepare_node

    topology = load_topology("pair")
    with Cluster.start(image, topology, name="bench-tcg", accel=accel) as cluster:
        conns = {i: cluster.connect(i) for i in range(topology.nodes)}
        try:
            nodes = list(conns)
            on_each(nodes, lambda i: prepare_node(conns[i], i, topology, repo_root(), kos))
            pids = [n.pid for n in cluster.nodes]
            before = sum(_cpu_seconds(p) for p in pids)
            start = time.monotonic()
            on_each(nodes, lambda i: conns[i].run(TCG_WORKLOAD, timeout=1800, check=True))
            return time.monotonic() - start, sum(_cpu_seconds(p) for p in pids) - before
        finally:
            for conn in conns.values():
                conn.close()


def tcg_parallel_figures(image: Image, samples: int, say: Callable[[str], None]) -> list[Figure]:
    """What parallel TCG (cross-node atomics; obmm.testbed.qemu.TCG_ACCEL) costs.

    A pair runs TCG_WORKLOAD on both nodes at once, booted (or restored) with parallel TCG and
    with serial TCG as before, interleaved (parallel, serial, parallel, ...) so a drift of the
    machine's speed hits both alike.  Figures: the workload's wall time and the host CPU
    seconds both QEMUs spent in it, each with the serial run as its baseline.
    """
    from obmm.testbed.paths import results_dir
    from obmm.testbed.provision import build_guest_modules, module_load_order

    kos = module_load_order(build_guest_modules(image, results_dir() / "kmod"))
    wall: dict[str, list[float]] = {a: [] for a in TCG_VARIANTS}
    cpu: dict[str, list[float]] = {a: [] for a in TCG_VARIANTS}
    for k in range(samples):
        for accel in TCG_VARIANTS:
            say(f"parallel TCG cost: {accel}, sample {k + 1}/{samples}")
            seconds, cpu_s = _tcg_sample(image, accel, kos)
            wall[accel].append(seconds)
            cpu[accel].append(cpu_s)
    note = "pair, both nodes run tests/guest/test_export.py and test_shmdev.py at once"
    figures = []
    for what, values in (("workload_wall", wall), ("qemu_cpu", cpu)):
        for accel in TCG_VARIANTS:
            base = None if accel == "tcg-serial" else tcg_figure_name("tcg-serial", what)
            figures.append(
                make_testbed_figure(
                    tcg_figure_name(accel, what), values[accel], baseline=base, note=note
                )
            )
    return figures


def cluster_bench(args: argparse.Namespace, config: BenchConfig) -> Run:
    from obmm.testbed import accel as accel_mod
    from obmm.testbed.cluster import Cluster, load_topology
    from obmm.testbed.image import ensure_image, find_recipe
    from obmm.testbed.paths import cache_dir, repo_root, results_dir
    from obmm.testbed.progress import Progress
    from obmm.testbed.provision import build_guest_modules, module_load_order, prepare_node

    progress = Progress("bench")
    say = progress.line
    testbed: list[Figure] = []
    recipe = find_recipe()

    if not getattr(args, "skip_cold_image", False):
        scratch = Path(tempfile.mkdtemp(prefix="obmm-bench-cache-"))
        try:
            say("cold image build into a throw-away cache")
            start = time.monotonic()
            ensure_image(recipe, cache=scratch, progress=progress)
            testbed.append(
                make_testbed_figure("testbed.image_build.cold", [time.monotonic() - start])
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    start = time.monotonic()
    image = ensure_image(recipe, progress=progress)
    cached = time.monotonic() - start
    testbed.append(
        make_testbed_figure(
            "testbed.image_build.cached",
            [cached],
            baseline="testbed.image_build.cold" if testbed else None,
        )
    )
    accel = accel_mod.choose(getattr(args, "accel", None), image.kernel, cache_dir())
    env = Environment.collect_host(accelerator=accel, node_count=2)

    suites = [s for s in str(getattr(args, "suites", "") or "").split(",") if s]
    if suites:
        from obmm.testbed.paths import ENV_CACHE

        testbed += suite_figures(
            suites,
            int(getattr(args, "suite_samples", 3)),
            repo_root(),
            results_dir() / "bench-suites",
            say,
            lambda suite, checkout, logdir: run_once(suite, checkout, logdir, ENV_CACHE),
        )
    if getattr(args, "suites_only", False):
        run = Run(env=env)
        run.add(testbed)
        return run

    boot_nodes = [int(n) for n in str(getattr(args, "boot_nodes", "1,2,4,8")).split(",") if n]
    inits = [i for i in str(getattr(args, "boot_inits", "fast,systemd")).split(",") if i]
    samples = int(getattr(args, "boot_samples", 3))
    testbed += boot_figures(image, accel, sorted(set(boot_nodes)), inits, samples, say)
    testbed += restore_figures(image, accel, sorted(set(boot_nodes)), samples, say)
    tcg_samples = int(getattr(args, "tcg_samples", 3))
    if accel == "tcg" and tcg_samples:
        testbed += tcg_parallel_figures(image, tcg_samples, say)
    # The measurements get their own pair with a 1 GiB export pool per node (the test topology
    # has 256 MiB), so the control path reaches the 1 GiB size.
    topology = load_topology(BENCH_TOPOLOGY)
    say(f"booting the benchmark pair ({BENCH_TOPOLOGY}: {topology.pool_mib} MiB pool per node)")
    with Cluster.start(image, topology, name="bench-data", accel=accel) as cluster:
        kos = module_load_order(build_guest_modules(image, results_dir() / "kmod"))
        conns = {i: cluster.connect(i) for i in range(topology.nodes)}
        try:
            for i, conn in conns.items():
                prepare_node(conn, i, topology, repo_root(), kos)
            run_fn, copy_fn = callables_for(dict(conns))
            config.python = GUEST_PYTHON
            run = run_cluster_bench(run_fn, copy_fn, topology.nodes, env, config, say=say)
        finally:
            for conn in conns.values():
                conn.close()
    measured = {f.name for f in testbed}
    recorded = [f for f in _qemu_test_figures(QEMU_TEST_TIMINGS) if f.name not in measured]
    run.add(testbed + recorded)
    return run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--skip-cold-image",
        action="store_true",
        help="do not time a cold image build (saves about 1.5 minutes)",
    )
    p.add_argument(
        "--boot-nodes",
        default="1,2,4,8",
        help="cluster sizes whose boot-to-SSH time is measured (default 1,2,4,8)",
    )
    p.add_argument(
        "--boot-inits",
        default="fast,systemd",
        help="node inits to boot each size with, interleaved (default fast,systemd)",
    )
    p.add_argument(
        "--boot-samples",
        type=int,
        default=3,
        help="boots per size and init (default 3; min/median/max in the summary)",
    )
    p.add_argument(
        "--suites",
        default="",
        help="also time whole suites, comma separated, interleaved: "
        + ", ".join(SUITES)
        + " (minutes each: off by default)",
    )
    p.add_argument(
        "--suite-samples", type=int, default=3, help="runs per suite with --suites (default 3)"
    )
    p.add_argument(
        "--suites-only",
        action="store_true",
        help="with --suites: only the image lookup and the suite timings, no boots or data path",
    )
    p.add_argument(
        "--tcg-samples",
        type=int,
        default=3,
        help="runs of the parallel-TCG cost workload per variant under TCG (default 3; 0: skip)",
    )
    p.add_argument("--accel", choices=("auto", "tcg", "kvm"), default=None)


if __name__ == "__main__":
    import sys

    sys.exit(main())
