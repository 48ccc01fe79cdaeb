"""`obmm-testbed bench` on a QEMU cluster: the testbed-speed figures and the guest figures.

Steps, each timed: a cold image build into a throw-away cache (unless skipped), the cached
image lookup, boot-to-SSH of 1, 2, 4 and 8 nodes with the fast init and with systemd
(interleaved, several samples each), then on a pair
with a 1 GiB export pool per node (``qemu/topologies/bench-pair.json``) the data-path, Engram
and control-path figures of `obmm.bench.measure.run_cluster_bench`.  Every cluster it boots is
stopped again, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from obmm import envvars
from obmm.bench import archs as archs_mod
from obmm.bench.measure import (
    GUEST_PYTHON,
    STRICT_SUFFIX,
    BenchConfig,
    BenchError,
    SayFn,
    make_testbed_figure,
    run_cluster_bench,
    run_scheme7_bench,
    run_strict_figures,
)
from obmm.bench.results import HOST_PAGES_KEY, Environment, Figure, Run
from obmm.bench.suite_timing import SUITES, run_once, suite_figures
from obmm.testbed import settings as settings_mod
from obmm.testbed.vm.timeline import CLUSTER_STEPS, NODE_STEPS, Timeline

if TYPE_CHECKING:
    from obmm.testbed.builds.image import Recipe
    from obmm.testbed.node import Node
    from obmm.testbed.progress import Progress
    from obmm.testbed.session import Session
    from obmm.testbed.settings import Settings

    BenchFn = Callable[[Sequence[Node], Environment, BenchConfig, SayFn], Run]

log = logging.getLogger(__name__)

BOOT_SIZES = {1: "single", 2: "pair", 4: "quad"}  # the test suites' topologies
BENCH_TOPOLOGY = "bench-pair"
#: The testbed settings the bench takes as flags (the others from the environment).
FIELDS = ("accel", "recipe", "kernel", "qemu")
QEMU_TEST_TIMINGS = Path("results") / "qemu-test-timings.json"
#: The last `make test`'s stage summary (obmm.testbed.stages.stage_summary writes it).
STAGE_SUMMARY = Path("results") / "stage-summary.json"


def _stage_figures(summary: Path) -> list[Figure]:
    """Each stage's wall time (baseline: its CPU floor) and CPU floor from the last `make test`'s
    stage summary, if there is one; the whole run as ``total``."""
    try:
        doc = json.loads(summary.read_text())
        stages = [*doc["stages"], doc["total"]]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(summary.stat().st_mtime))
    except (OSError, ValueError, KeyError, TypeError):
        return []
    note = f"recorded by make test at {stamp}, not in this run"
    figures = []
    for stage in stages:
        key = re.sub(r"[^A-Za-z0-9_]+", "_", str(stage["name"])).strip("_")
        floor = f"testbed.make_test.{key}.floor"
        figures.append(make_testbed_figure(floor, [float(stage["floor_s"])], note=note))
        figures.append(
            make_testbed_figure(
                f"testbed.make_test.{key}.wall", [float(stage["wall_s"])], baseline=floor,
                note=note,
            )
        )  # fmt: skip
    return figures


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
    from obmm.testbed.builds.image import ensure_image

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


@dataclass
class UpSample:
    """One `obmm-testbed up` as a user runs it."""

    #: Seconds around the command, from its start to its return.
    wall: float
    timeline: Timeline
    restored_from: str | None
    #: The 1-minute load average when it started (the machine is shared).
    load: float


def up_argv(settings: Settings) -> list[str]:
    """`obmm-testbed up` with `settings` as its flags."""
    exe = Path(sys.executable).with_name("obmm-testbed")
    argv = [str(exe)] if exe.is_file() else [sys.executable, "-m", "obmm.testbed.cli.main"]
    argv.append("up")
    for knob in settings_mod.KNOBS:
        value = getattr(settings, knob.field)
        if value is None:
            continue
        for one in value if knob.repeat else [value]:
            argv += [knob.flag, str(one)]
    return argv


def up_sample(settings: Settings) -> UpSample:
    """Run `obmm-testbed up` (the settings name the cluster) and time it from outside; its
    timeline is read from the cluster's state, then the cluster is stopped (not counted)."""
    from obmm.testbed.vm.cluster import Cluster, ClusterError

    assert settings.name is not None
    load = os.getloadavg()[0]
    start = time.monotonic()
    proc = subprocess.run(up_argv(settings), capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    try:
        if proc.returncode != 0:
            raise RuntimeError(
                f"obmm-testbed up failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        cluster = Cluster.attach(settings.name)
        return UpSample(wall, cluster.timeline, cluster.restored_from, load)
    finally:
        with contextlib.suppress(ClusterError):
            Cluster.attach(settings.name).stop()


def timeline_figures(prefix: str, samples: Sequence[UpSample], note: str) -> list[Figure]:
    """The phases of `samples` (obmm.testbed.vm.timeline): per step, seconds since the command
    started (the slowest node's); the guest clock's console steps; CPU seconds of the command
    and of all its QEMUs.  Named `<prefix>.at.<step>`, `.guest.<step>`, `.cpu.<what>`."""
    series: dict[str, list[float]] = {}

    def add(name: str, value: float | None) -> None:
        if value is not None:
            series.setdefault(name, []).append(value)

    for sample in samples:
        t = sample.timeline
        for step, _ in CLUSTER_STEPS:
            add(f"at.{step}", t.cluster.get(step))
        for step, _ in NODE_STEPS:
            add(f"at.{step}", _slowest(s.get(step) for s in t.nodes.values()))
            add(f"guest.{step}", _slowest(g.get(step) for g in t.guest.values()))
        add("cpu.command", t.cpu.get("command"))
        qemu = [v for k, v in t.cpu.items() if k.startswith("node")]
        add("cpu.qemu", sum(qemu) if qemu else None)
    return [make_testbed_figure(f"{prefix}.{k}", v, note=note) for k, v in series.items()]


def _slowest(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _loads(samples: Sequence[UpSample]) -> str:
    return "load average " + ", ".join(f"{s.load:.2f}" for s in samples)


def boot_figures(
    settings: Settings,
    sizes: list[int],
    inits: list[str],
    samples: int,
    say: Callable[[str], None],
    others: Sequence[Settings] = (),
) -> list[Figure]:
    """Boot-to-SSH of each cluster size with each init, `samples` times, interleaved: the wall
    time of ``obmm-testbed up --snapshot off`` from its start to its return (:func:`up_sample`),
    and the phases of its timeline (fast init only).

    The boots of one size alternate between the inits (fast, systemd, fast, ...) so that a
    drift of the machine's speed hits both alike; the fast boot's baseline is the systemd boot
    of the same size, so the summary shows their ratio.  `others` (settings of further guest
    architectures) boot with the fast init in the same rotation; their figures are named and
    baselined by :func:`obmm.bench.archs.beside`.
    """
    figures: list[Figure] = []
    for nodes in sizes:
        topology = BOOT_SIZES.get(nodes, "pair")
        variants = [(settings, init) for init in inits]
        variants += [(other, "fast") for other in others]
        runs: dict[tuple[str, str], list[UpSample]] = {(s.arch, i): [] for s, i in variants}
        for k in range(samples):
            for base_settings, init in variants:
                arch = base_settings.arch
                say(f"boot {nodes} {arch} node(s), init {init}, sample {k + 1}/{samples}")
                # snapshot off: a cold boot is what this figure is.
                shape = base_settings.replace(
                    topology=topology, nodes=nodes, init=init, snapshot="off",
                    name=f"bench-{nodes}",
                )  # fmt: skip
                runs[arch, init].append(up_sample(shape))
                say(f"  {runs[arch, init][-1].wall:.1f} s")
        for base_settings, init in variants:
            found: list[Figure] = []
            sample_list = runs[base_settings.arch, init]
            base = "systemd" if init != "systemd" and "systemd" in inits else None
            if base_settings is not settings:
                base = None
            note = (
                f"{topology} topology, {base_settings.accel} accelerator setting; "
                f"{_loads(sample_list)}"
            )
            found.append(
                make_testbed_figure(
                    boot_figure_name(init, nodes),
                    [s.wall for s in sample_list],
                    baseline=boot_figure_name(base, nodes) if base else None,
                    note=note,
                )
            )
            if init == "fast":
                found += timeline_figures(boot_figure_name(init, nodes), sample_list, note)
            if base_settings is not settings:
                found = archs_mod.beside(found, base_settings.arch, [f.name for f in figures])
            figures += found
    return figures


def restore_figure_name(nodes: int) -> str:
    return f"testbed.restore_to_ssh.{nodes}node{'s' if nodes > 1 else ''}"


def restore_figures(
    settings: Settings,
    sizes: list[int],
    samples: int,
    say: Callable[[str], None],
    others: Sequence[Settings] = (),
) -> list[Figure]:
    """Snapshot restore to SSH of each cluster size (fast init), `samples` times: the wall time
    of ``obmm-testbed up`` when a snapshot fits (:func:`up_sample`), and its timeline's phases.

    The first start of a size makes sure a snapshot exists (a cold boot that saves one, not
    counted); its baseline is the cold fast boot of the same size.  `others` (further guest
    architectures) restore in the same rotation, named by :func:`obmm.bench.archs.beside`.
    """
    figures: list[Figure] = []
    for nodes in sizes:
        shapes = [
            s.replace(
                topology=BOOT_SIZES.get(nodes, "pair"), nodes=nodes, init="fast",
                snapshot="auto", name=f"bench-{nodes}",
            )
            for s in (settings, *others)
        ]  # fmt: skip
        for shape in shapes:
            up_sample(shape)
        runs: dict[str, list[UpSample]] = {shape.arch: [] for shape in shapes}
        for k in range(samples):
            for shape in shapes:
                say(f"restore {nodes} {shape.arch} node(s) from a snapshot, "
                    f"sample {k + 1}/{samples}")  # fmt: skip
                sample = up_sample(shape)
                if sample.restored_from is None:
                    raise RuntimeError(f"{nodes} node(s): booted cold, no snapshot restored")
                runs[shape.arch].append(sample)
                say(f"  {sample.wall:.1f} s")
        for shape in shapes:
            note = f"{shape.topology} topology; {_loads(runs[shape.arch])}"
            found = [
                make_testbed_figure(
                    restore_figure_name(nodes),
                    [s.wall for s in runs[shape.arch]],
                    baseline=boot_figure_name("fast", nodes),
                    note=note,
                ),
                *timeline_figures(restore_figure_name(nodes), runs[shape.arch], note),
            ]
            if shape.arch != settings.arch:
                found = archs_mod.beside(found, shape.arch, [f.name for f in figures])
            figures += found
    return figures


#: What each node runs for the parallel-TCG cost: a slice of the guest suite (Python, ioctls,
#: mappings: the suites' own mix), on both nodes of a pair at once.
TCG_WORKLOAD = (
    "cd /opt/obmm-testbed && PYTHONPATH=pylib python3 -m pytest -q -p no:cacheprovider "
    "tests/guest/test_export.py tests/guest/test_shmdev.py"
)
TCG_VARIANTS = ("tcg", "tcg-serial")  # obmm.testbed.vm.qemu.ACCEL_TCG_SERIAL


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tcg_figure_name(accel: str, what: str) -> str:
    return f"testbed.{accel.replace('-', '_')}.{what}"


def _tcg_sample(settings: Settings, accel: str) -> tuple[float, float]:
    """TCG_WORKLOAD on both nodes of a pair started with `accel`: (wall s, QEMU CPU s)."""
    from obmm.testbed.parallel import on_each
    from obmm.testbed.session import bring_up

    shape = settings.replace(topology="pair", accel=accel, name="bench-tcg")
    # The workload is guest-suite tests: the suites' build of the module (its test knobs).
    with bring_up(shape, purpose="bench", test_hooks=True) as session:
        pids = [n.qemu_pid for n in session.nodes]
        before = sum(_cpu_seconds(p) for p in pids)
        start = time.monotonic()
        on_each(session.nodes, lambda n: n.run(TCG_WORKLOAD, timeout=1800, check=True))
        return time.monotonic() - start, sum(_cpu_seconds(p) for p in pids) - before


def tcg_parallel_figures(
    settings: Settings, samples: int, say: Callable[[str], None]
) -> list[Figure]:
    """What parallel TCG (cross-node atomics; obmm.testbed.vm.qemu.TCG_ACCEL) costs.

    A pair runs TCG_WORKLOAD on both nodes at once, booted (or restored) with parallel TCG and
    with serial TCG as before, interleaved (parallel, serial, parallel, ...) so a drift of the
    machine's speed hits both alike.  Figures: the workload's wall time and the host CPU
    seconds both QEMUs spent in it, each with the serial run as its baseline.
    """
    wall: dict[str, list[float]] = {a: [] for a in TCG_VARIANTS}
    cpu: dict[str, list[float]] = {a: [] for a in TCG_VARIANTS}
    for k in range(samples):
        for accel in TCG_VARIANTS:
            say(f"parallel TCG cost: {accel}, sample {k + 1}/{samples}")
            seconds, cpu_s = _tcg_sample(settings, accel)
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


INNER_LOOP_TEST = "tests/guest/test_sysfs.py::test_export_info"
INNER_LOOP_FILE = "kmod/obmm_emu/sysfs.c"
#: What a checkout copy needs for `obmm-testbed dev` to build, provision and test from it.
INNER_LOOP_TREE = ("pyproject.toml", "kmod", "qemu", "uapi", "pylib", "tests/guest", "tests/c",
                   "examples/c")  # fmt: skip


def inner_loop_figures(
    settings: Settings, samples: int, say: Callable[[str], None]
) -> list[Figure]:
    """Edit one C file of the module, then one guest test's result, on a warm node: what
    ``obmm-testbed dev`` takes (build of what changed, payload, module reload, the test).

    It runs on a copy of the checkout (``$OBMM_TESTBED_ROOT``), whose file it edits with a real
    code change each sample (so the module is rebuilt and reloaded), on a cluster of its own
    that the first, uncounted call boots and the end stops."""
    import os
    import shutil
    import subprocess
    import sys

    from obmm.testbed.paths import repo_root
    from obmm.testbed.vm.ownership import scratch_dir

    name = "bench-dev"
    with scratch_dir("inner-loop") as root:
        for rel in INNER_LOOP_TREE:
            src = repo_root() / rel
            if src.is_dir():
                shutil.copytree(src, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
            elif src.is_file():
                shutil.copy2(src, root / rel)
        env = {**os.environ, envvars.ROOT.name: str(root), envvars.ACCEL.name: settings.accel,
               envvars.ARCH.name: settings.arch}  # fmt: skip
        env.pop(envvars.RESULTS.name, None)
        argv = [sys.executable, "-m", "obmm.testbed.cli.main", "dev", "--name", name, "--",
                INNER_LOOP_TEST, "-q"]  # fmt: skip

        def dev() -> float:
            start = time.monotonic()
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"obmm-testbed dev failed ({proc.returncode}):\n"
                                   + (proc.stdout + proc.stderr)[-3000:])  # fmt: skip
            return time.monotonic() - start

        times = []
        try:
            say("inner loop: the first dev call brings its node up (not counted)")
            dev()
            for k in range(samples):
                edited = root / INNER_LOOP_FILE
                with edited.open("a") as f:  # code, not a comment: the module changes
                    symbol = f"obmm_bench_edit_{k}"
                    f.write(f"\nextern const int {symbol};\nconst int {symbol} = {k};\n")
                say(f"inner loop: edit {INNER_LOOP_FILE}, dev one test, sample {k + 1}/{samples}")
                times.append(dev())
        finally:
            subprocess.run([sys.executable, "-m", "obmm.testbed.cli.main", "down", "--name", name],
                           env=env, capture_output=True, check=False)  # fmt: skip
    return [
        make_testbed_figure(
            "testbed.inner_loop",
            times,
            note=f"edit {INNER_LOOP_FILE}, then obmm-testbed dev -- {INNER_LOOP_TEST} (rebuild "
            "what changed, reload the module, run the test) on a warm node",
        )
    ]


def arch_ready(settings: Settings, recipe: Recipe, progress: Progress) -> tuple[Settings, float]:
    """`settings` (one architecture's) with its guest image at hand, built or from the cache,
    and the accelerator chosen for that image's kernel; the seconds the image took."""
    from obmm.testbed.builds.kernels import guest_image
    from obmm.testbed.paths import cache_dir
    from obmm.testbed.vm import accel as accel_mod

    start = time.monotonic()
    image = guest_image(recipe, progress=progress, kernel=settings.kernel, arch=settings.arch)
    seconds = time.monotonic() - start
    accel = accel_mod.choose(settings.accel, image.kernel, cache_dir(), qemu=settings.qemu_binary)
    return settings.replace(accel=accel), seconds


def cluster_bench(args: argparse.Namespace, config: BenchConfig) -> Run:
    if getattr(args, "scheme7", False):
        return scheme7_bench(args, config)
    from obmm.testbed.builds.image import ensure_image, find_recipe
    from obmm.testbed.paths import repo_root, results_dir
    from obmm.testbed.progress import Progress
    from obmm.testbed.vm.ownership import scratch_dir

    progress = Progress("bench")
    say = progress.line
    testbed: list[Figure] = []
    # The bench's own --nodes and --name mean other things: only its testbed flags count.
    settings = settings_mod.Settings.from_env(**{f: getattr(args, f, None) for f in FIELDS})
    recipe = find_recipe(settings.recipe)
    arch_names = [a for a in str(getattr(args, "archs", "") or "").split(",") if a]
    if arch_names:
        settings = settings.replace(arch=arch_names[0])

    if not getattr(args, "skip_cold_image", False):
        # Named after this process: if it is killed, the next testbed command removes it.
        with scratch_dir("bench-cache") as scratch:
            say("cold image build into a throw-away cache")
            start = time.monotonic()
            ensure_image(recipe, cache=scratch, progress=progress, arch=settings.arch)
            testbed.append(
                make_testbed_figure("testbed.image_build.cold", [time.monotonic() - start])
            )
    settings, cached = arch_ready(settings, recipe, progress)
    testbed.append(
        make_testbed_figure(
            "testbed.image_build.cached",
            [cached],
            baseline="testbed.image_build.cold" if testbed else None,
        )
    )
    others = [arch_ready(settings.replace(arch=a), recipe, progress)[0] for a in arch_names[1:]]
    accel = settings.accel
    env = Environment.collect_host(accelerator=accel, node_count=2)

    suites = [s for s in str(getattr(args, "suites", "") or "").split(",") if s]
    if suites:
        testbed += suite_figures(
            suites,
            int(getattr(args, "suite_samples", 3)),
            repo_root(),
            results_dir() / "bench-suites",
            say,
            lambda suite, checkout, logdir: run_once(suite, checkout, logdir, envvars.CACHE.name),
        )
    if getattr(args, "suites_only", False):
        run = Run(env=env)
        run.add(testbed)
        return run

    boot_nodes = [int(n) for n in str(getattr(args, "boot_nodes", "1,2,4,8")).split(",") if n]
    inits = [i for i in str(getattr(args, "boot_inits", "fast,systemd")).split(",") if i]
    samples = int(getattr(args, "boot_samples", 3))
    testbed += boot_figures(settings, sorted(set(boot_nodes)), inits, samples, say, others)
    testbed += restore_figures(settings, sorted(set(boot_nodes)), samples, say, others)
    tcg_samples = int(getattr(args, "tcg_samples", 3))
    if accel == "tcg" and tcg_samples:
        testbed += tcg_parallel_figures(settings, tcg_samples, say)
    if int(getattr(args, "inner_loop_samples", 3)) > 0:
        testbed += inner_loop_figures(settings, int(args.inner_loop_samples), say)
        for other in others:
            found = inner_loop_figures(other, int(args.inner_loop_samples), say)
            testbed += archs_mod.beside(found, other.arch, [f.name for f in testbed])
    run = on_bench_pair(settings, env, config, run_cluster_bench, progress, then=strict_figures)
    for other in others:
        other_env = Environment.collect_host(accelerator=other.accel, node_count=2)
        other_run = on_bench_pair(other, other_env, config, run_cluster_bench, progress)
        run.add(archs_mod.beside(other_run.figures, other.arch, [f.name for f in run.figures]))
        run.notes.append(
            f"{other.arch} nodes: kernel {other_run.env.kernel}, CPU {other_run.env.cpu_model}, "
            f"accelerator {other.accel}"
        )
        run.notes += [f"{other.arch}: {n}" for n in other_run.notes]
        run.warnings += [f"{other.arch}: {w}" for w in other_run.warnings]
    if others:
        run.notes += archs_mod.beside_notes(run, settings.arch, [o.arch for o in others])
    measured = {f.name for f in testbed}
    recorded = [
        f
        for f in _qemu_test_figures(QEMU_TEST_TIMINGS) + _stage_figures(STAGE_SUMMARY)
        if f.name not in measured
    ]
    run.add(testbed + recorded)
    return run


def on_bench_pair(
    settings: Settings,
    env: Environment,
    config: BenchConfig,
    bench: BenchFn,
    progress: Progress,
    then: Callable[[Session, Run, BenchConfig, Callable[[str], None]], None] | None = None,
) -> Run:
    """`bench` on the benchmark pair, brought up (booted or restored, modules loaded) and down;
    `then` adds to its run on the same pair.

    The measurements get their own pair with a 1 GiB export pool per node (the test topology
    has 256 MiB), so the control path reaches the 1 GiB size.
    """
    from obmm.testbed.session import bring_up

    say = progress.line
    say(f"bringing up the benchmark pair ({BENCH_TOPOLOGY}: 1 GiB pool per node)")
    data = settings.replace(topology=BENCH_TOPOLOGY, name="bench-data")
    with bring_up(data, purpose="bench", progress=progress) as session:
        config.python = GUEST_PYTHON
        run = bench(session.nodes, env, config, say)
        note_host_pages(run, [node.qemu_pid for node in session.nodes])
        if then is not None:
            then(session, run, config, say)
        return run


def strict_figures(
    session: Session, run: Run, config: BenchConfig, say: Callable[[str], None]
) -> None:
    """The Engram prefetch and the chase under the `strict` coherence model, beside the run's
    `coherent` ones: the driver reloaded with coherence=strict, measured, and reloaded as it
    was."""
    settings = session.settings
    if settings.driver != "emu" or settings.coherence != "coherent":
        run.notes.append(
            f"no {STRICT_SUFFIX} figures: the emulator in the coherent model is the baseline "
            f"(this pair: --driver {settings.driver}, --coherence {settings.coherence})"
        )
        return
    base = settings.driver_params
    strict = settings_mod.merge_params(base, ("coherence=strict",))
    say("reloading the driver with coherence=strict")
    session.reload_modules(session.modules, strict)
    try:
        run.add(run_strict_figures(session.nodes, config, say))
    finally:
        session.reload_modules(session.modules, base)
    run.notes.append(
        f"sources ending {STRICT_SUFFIX}: the driver loaded with coherence=strict (no eviction), "
        "each node caching what its cacheable mappings touch (docs/coherence.md)"
    )


def note_host_pages(run: Run, pids: list[int]) -> None:
    """How the host maps the QEMU processes' memory (their nodes' RAM files and windows):
    kB mapped with 2 MiB pages of all they map, into env.extra and a note.  With 4 KiB host
    pages, a guest prefetch that misses the TLBs costs more below the guest (the summary's
    Engram section says so where a variant is over its limit)."""
    rss = pmd = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            return
        fields = {
            k.strip(): v.split()[0]
            for k, _, v in (ln.partition(":") for ln in text.splitlines()[1:])
        }
        rss += int(fields.get("Rss", 0))
        pmd += int(fields.get("ShmemPmdMapped", 0)) + int(fields.get("FilePmdMapped", 0))
    run.env.extra[HOST_PAGES_KEY] = f"{pmd} of {rss} kB"
    run.notes.append(
        f"host: the nodes' QEMU processes map {pmd} of {rss} kB with 2 MiB pages "
        "(the rest with 4 KiB pages)"
    )


def scheme7_bench(args: argparse.Namespace, config: BenchConfig) -> Run:
    """`obmm-testbed bench --scheme7`: the seed's client benchmark on the benchmark pair, or
    (`--hw`) on the hardware stage's hosts."""
    if getattr(args, "hw", False):
        return hardware_scheme7_bench(args, config)
    from obmm.testbed.builds.image import find_recipe
    from obmm.testbed.builds.kernels import guest_image
    from obmm.testbed.paths import cache_dir
    from obmm.testbed.progress import Progress
    from obmm.testbed.vm import accel as accel_mod

    progress = Progress("bench")
    settings = settings_mod.Settings.from_env(**{f: getattr(args, f, None) for f in FIELDS})
    image = guest_image(
        find_recipe(settings.recipe), progress=progress, kernel=settings.kernel, arch=settings.arch
    )
    accel = accel_mod.choose(settings.accel, image.kernel, cache_dir(), qemu=settings.qemu_binary)
    env = Environment.collect_host(accelerator=accel, node_count=2)
    return on_bench_pair(settings.replace(accel=accel), env, config, run_scheme7_bench, progress)


def hardware_scheme7_bench(args: argparse.Namespace, config: BenchConfig) -> Run:
    """The scheme-7 bench on the first two hosts of the hardware stage's configuration
    (HW_HOSTS / HW_CONFIG / --hosts ...; `--hw-qemu NAME`: a running cluster stands in): its
    pre-flight, the package copied to a fresh directory on each host (removed afterwards),
    host i running as node i with the stage's decoder hook."""
    from obmm.testbed.hw import config as hw_config
    from obmm.testbed.hw import preflight, stage
    from obmm.testbed.paths import repo_root, results_dir
    from obmm.testbed.progress import Progress
    from obmm.testbed.provision import payload_tar
    from obmm.testbed.ssh import SshError

    say = Progress("bench").line
    environ = dict(os.environ)
    if args.hw_config:
        environ[hw_config.ENV_CONFIG_FILE] = args.hw_config
    overrides: dict[str, Any] = {"hosts": args.hw_hosts, "ssh_key": args.hw_key}
    if args.hw_qemu:
        base = stage.qemu_stand_in(args.hw_qemu, results_dir() / "hw")
        overrides = {**base, **{k: v for k, v in overrides.items() if v}}
    cfg = hw_config.load(environ, overrides)
    hosts = cfg.hosts[:2]
    reports = preflight.preflight(cfg)
    failed = [r for r in reports if not r.ok]
    if failed:
        raise BenchError(f"hardware pre-flight failed: {failed[0].failure}")
    say(f"scheme7 on {', '.join(h.spec for h in hosts)}")
    payload = payload_tar(repo_root())
    nodes = [stage.HostNode(i, host, cfg) for i, host in enumerate(hosts)]
    workdirs: dict[int, str] = {}
    try:
        for i, conn in enumerate(nodes):
            made = conn.run(
                f"mktemp -d {shlex.quote(cfg.remote_tmp)}/obmm-bench.XXXXXX",
                timeout=60,
                check=True,
                bare=True,
            )
            workdirs[i] = made.out.strip()
            conn.run(f"tar -xzf - -C {shlex.quote(workdirs[i])}", timeout=300, check=True,
                     stdin=payload, bare=True)  # fmt: skip
            # the bench runs its commands bare: the node's environment goes on its Python line
            config.node_env[i] = {"PYTHONPATH": f"{workdirs[i]}/pylib", **conn.env}
        config.python = (cfg.python,)
        accelerator = "tcg" if args.hw_qemu else "hardware"
        env = Environment.collect_host(accelerator=accelerator, node_count=len(hosts))
        env.extra["hw_hosts"] = ",".join(h.spec for h in hosts)
        if args.hw_qemu:
            env.extra["hw_stand_in"] = f"QEMU cluster {args.hw_qemu} standing in for hardware"
        return run_scheme7_bench(nodes, env, config, say)
    finally:
        for i, conn in enumerate(nodes):
            try:
                if i in workdirs:
                    conn.run(f"rm -rf {shlex.quote(workdirs[i])}", timeout=120, bare=True)
            except SshError as exc:
                log.warning("host %d: %s left behind: %s", i, workdirs[i], exc)
            finally:
                conn.close()


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
        "--inner-loop-samples",
        type=int,
        default=3,
        help="edit-and-run-one-test loops timed (obmm-testbed dev; default 3, 0: none)",
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
    settings_mod.add_arguments(p, FIELDS)
    p.add_argument(
        "--archs",
        default="",
        metavar="A,B",
        help="guest architectures side by side, e.g. x86_64,arm64 (default: the arch setting "
        "alone): each after the first gets cold boots (fast init), restores, the inner loop and "
        "the benchmark pair's figures, named <figure>.<arch>; its testbed figures' baseline is "
        "the first's",
    )
    p.add_argument(
        "--scheme7",
        action="store_true",
        help="only the seed's scheme-7 client benchmark (Bench 1-3 over the Python API): "
        "node 0 exports and fills the table, node 1 imports and copies rows from it and from "
        "local memory in turn",
    )
    p.add_argument(
        "--hw",
        action="store_true",
        help="with --scheme7: on the hardware stage's hosts (HW_HOSTS / HW_CONFIG or the "
        "options below) instead of the QEMU pair",
    )
    p.add_argument("--hosts", dest="hw_hosts", help="--hw: user@host[:port],... ($HW_HOSTS)")
    p.add_argument("--config", dest="hw_config", help="--hw: hardware config file ($HW_CONFIG)")
    p.add_argument("--key", dest="hw_key", help="--hw: SSH private key ($HW_SSH_KEY)")
    p.add_argument(
        "--hw-qemu",
        dest="hw_qemu",
        metavar="NAME",
        help="--hw: a running `obmm-testbed up --kmod` cluster stands in for the hosts",
    )


if __name__ == "__main__":
    import sys

    sys.exit(main())
