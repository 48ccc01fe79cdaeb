"""`obmm-testbed bench` and `obmm-testbed bench-compare`.

    obmm-testbed bench --local-only [--out bench-results] [--full]   # host smoke run, no VM
    obmm-testbed bench [--nodes 2] [--quick]                         # needs a cluster hook
    obmm-testbed bench --scheme7 [--quick] [--hw [--hosts ...]]      # the seed's client
    obmm-testbed bench-compare OLD NEW [--threshold 0.10] [--by-ratio]
    obmm-testbed bench-compare QEMU_RUN HW_RUN --side-by-side [--prefix scheme7.]

The cluster mode is `obmm.bench.cluster_hook.cluster_bench` (it boots the clusters, builds
run/copy callables and calls `obmm.bench.measure.run_cluster_bench`); `obmm-testbed bench` and
`python -m obmm.bench` reach it the same way.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from obmm.bench import cluster_hook, compare
from obmm.bench.measure import BenchConfig, BenchError, run_local_bench
from obmm.bench.probe import ProbeSettings
from obmm.bench.report import write_run
from obmm.bench.results import Environment
from obmm.tools import interrupts

DEFAULT_OUT = Path("bench-results")


def _print_summary(outdir: Path) -> None:
    print(f"results in {outdir}/ (results.json, summary.md, *.png)")


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.hw and not args.scheme7:
        raise BenchError("bench --hw runs only the scheme-7 benchmark: add --scheme7")
    if args.local_only and args.scheme7:
        raise BenchError("bench --scheme7 needs nodes with /dev/obmm: drop --local-only")
    if args.local_only:
        settings = ProbeSettings() if args.full else ProbeSettings.quick()
        if args.max_seconds is not None:
            settings.max_seconds = args.max_seconds
        env = Environment.collect_host(accelerator="host", node_count=1)
        run = run_local_bench(env, settings, say=lambda m: print(f"[bench] {m}", flush=True))
    else:
        config = BenchConfig.quick() if args.quick else BenchConfig()
        if args.max_seconds is not None:
            config.probe.max_seconds = args.max_seconds
        run = cluster_hook.cluster_bench(args, config)
    outdir = write_run(run, args.out, name=args.name, plots=not args.no_plots)
    _print_summary(outdir)
    if args.print_summary:
        print((outdir / "summary.md").read_text())
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    argv = [str(args.old), str(args.new), "--threshold", str(args.threshold)]
    argv += ["--by-ratio"] if args.by_ratio else []
    argv += ["--side-by-side", "--prefix", args.prefix] if args.side_by_side else []
    return compare.main(argv)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--local-only",
        action="store_true",
        help="run memprobe on this machine (no VM): local memory vs a shared file",
    )
    p.add_argument("--nodes", type=int, default=2, help="cluster size for the cluster mode (2)")
    p.add_argument("--quick", action="store_true", help="cluster mode: small counts")
    p.add_argument(
        "--full",
        action="store_true",
        help="--local-only: full-size counts (10 000-row tables, 64 MiB sets)",
    )
    p.add_argument(
        "--max-seconds", type=float, default=None, help="memprobe time budget per source"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="results root (bench-results); a <timestamp>/ folder is made in it",
    )
    p.add_argument("--name", default=None, help="folder name instead of the timestamp")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--print-summary", action="store_true", help="print summary.md at the end")
    cluster_hook.add_arguments(p)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="measure control path, data path and Engram prefetch")
    add_bench_arguments(p)
    p.set_defaults(func=_cmd_bench)
    c = sub.add_parser("bench-compare", help="two bench-results folders side by side")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    c.add_argument("--threshold", type=float, default=0.10)
    c.add_argument("--by-ratio", action="store_true")
    c.add_argument(
        "--side-by-side",
        action="store_true",
        help="one table, each run's median and ratio to its own baseline, no verdict "
        "(runs on different machines: the QEMU pair beside real UB hosts)",
    )
    c.add_argument("--prefix", default="", help="--side-by-side: only figures named so")
    c.set_defaults(func=_cmd_compare)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m obmm.bench [bench options]` (the `bench` subcommand's options)."""
    p = argparse.ArgumentParser(prog="python -m obmm.bench")
    add_bench_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return interrupts.run_unwinding("python -m obmm.bench", lambda: _cmd_bench(args))


if __name__ == "__main__":
    sys.exit(main())
