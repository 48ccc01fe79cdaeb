"""``python3 -m obmm.fuzz``: the structured fuzzer of obmm_emu, inside a node (as root).

    python3 -m obmm.fuzz --seed 1 --ops 2000                 # single process
    python3 -m obmm.fuzz --seed 1 --ops 300 --mode concurrent
    python3 -m obmm.fuzz --seed 1 --ops 2000 --only 3,17,42  # replay a reproducer
    python3 -m obmm.fuzz --seed 1 --ops 2000 --record out.jsonl  # outcomes, for make fuzz-diff

Prints one JSON line of figures at the end (ops, seconds, ops/s, fault injection).  On a
failure: what failed, the replay command, the list shrunk by delta debugging with its own
replay command and its trace; exit status 1.  Exit status 2: the node cannot be fuzzed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from obmm.fuzz import faults, race
from obmm.fuzz.engine import Engine, Failure
from obmm.fuzz.ops import Op, generate, select
from obmm.fuzz.shrink import ddmin, suffix_first


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m obmm.fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ops", type=int, default=1000, help="operations (concurrent: race rounds)")
    p.add_argument("--mode", choices=("single", "concurrent"), default="single")
    p.add_argument("--only", default="", help="comma-separated operation indexes to run "
                   "(concurrent: scenario names)")  # fmt: skip
    p.add_argument("--no-shrink", action="store_true", help="report the failure unshrunk")
    p.add_argument("--shrink-budget", type=float, default=300.0, help="seconds (default 300)")
    p.add_argument("--no-reload", action="store_true", help="never rmmod/insmod the module")
    p.add_argument("--no-faults", action="store_true", help="no fault injection even if present")
    p.add_argument("--verbose", "-v", action="store_true", help="print every operation")
    p.add_argument(
        "--record",
        metavar="FILE",
        help="hold nothing against the model: write each operation's outcome to FILE (JSON "
        "lines), for comparing two drivers; no reload, no fault injection",
    )
    p.add_argument("--skip-exports", default="", metavar="OPS",
                   help="record mode: comma-separated EXPORT operations to leave out (those "
                   "another driver's run found scattered: make fuzz-diff)")  # fmt: skip
    p.add_argument("--seconds", type=float, default=0.0,
                   help="start no operation (concurrent: round) after this many seconds; "
                   "0: no limit (a campaign sized to end by a given time)")  # fmt: skip
    p.add_argument("--progress", metavar="FILE",
                   help="keep the operation about to run in FILE (what is left of a run that a "
                   "kernel bug killed)")  # fmt: skip
    return p.parse_args(argv)


def record(args: argparse.Namespace) -> int:
    """One run in record mode; status 1 only for a kernel report (or a failed cleanup)."""
    skip = [int(i) for i in args.skip_exports.split(",") if i]
    engine = Engine(reload=False, faults_on=False, log=args.verbose, record=True,
                    skip_exports=skip)  # fmt: skip
    ops = generate(args.seed, args.ops)
    if args.only:
        ops = select(ops, [int(i) for i in args.only.split(",") if i])
    t0 = time.monotonic()
    try:
        failure = engine.run(ops)
    finally:  # what ran is recorded even when the run ends in an exception
        elapsed = time.monotonic() - t0
        engine.close()
        with open(args.record, "w") as out:
            for outcome in engine.outcomes:
                out.write(json.dumps(outcome) + "\n")
    if failure is not None:
        print(f"FUZZ FAILURE: {failure}", flush=True)
    figures = {"mode": "record", "seed": args.seed, "ops": engine.ops_run,
               "seconds": round(elapsed, 2), "failed": failure is not None}  # fmt: skip
    print("fuzz-result " + json.dumps(figures), flush=True)
    return 1 if failure is not None else 0


def report(args: argparse.Namespace, failure: Failure, trace: list[str]) -> None:
    base = f"python3 -m obmm.fuzz --seed {args.seed} --ops {args.ops} --mode {args.mode}"
    print(f"FUZZ FAILURE: {failure}", flush=True)
    print(f"replay: {base}", flush=True)
    if trace:
        print("trace of the failing run (last 30 steps):")
        for line in trace[-30:]:
            print("  " + line)
        sys.stdout.flush()


def single(args: argparse.Namespace) -> int:
    engine = Engine(
        reload=not args.no_reload,
        faults_on=not args.no_faults,
        log=args.verbose,
        progress=args.progress,
    )
    ops = generate(args.seed, args.ops)
    if args.only:
        ops = select(ops, [int(i) for i in args.only.split(",") if i])
    fault_note = ",".join(engine.faults.names) if engine.faults else f"off ({faults.why_absent()})"
    if args.no_faults:
        fault_note = "off (--no-faults)"
    print(f"fuzz: seed {args.seed}, {len(ops)} ops, fault injection {fault_note}, "
          f"module reload {'on' if engine.reload_ok else 'off'}", flush=True)  # fmt: skip
    t0 = time.monotonic()
    failure = engine.run(ops, deadline=t0 + args.seconds if args.seconds > 0 else None)
    elapsed = time.monotonic() - t0
    done = engine.ops_run
    status = 0
    if failure is not None:
        status = 1
        report(args, failure, engine.trace)
        if not args.no_shrink and failure.op is not None:
            shrink(args, engine, ops, failure)
    engine.close()
    per_kind = {k: round(1000 * t / n, 1) for k, (n, t) in sorted(engine.stats.items())}
    figures = {"mode": "single", "seed": args.seed, "ops": done, "seconds": round(elapsed, 2),
               "ops_per_s": round(done / elapsed, 1) if elapsed else 0.0,
               "faults": fault_note, "failed": status != 0,
               "count_per_kind": {k: n for k, (n, _) in sorted(engine.stats.items())},
               "ms_per_kind": per_kind,
               "handoffs_live_revoked": dict(sorted(engine.handoffs.items()))}  # fmt: skip
    print("fuzz-result " + json.dumps(figures), flush=True)
    return status


def shrink(args: argparse.Namespace, engine: Engine, ops: Sequence[Op], failure: Failure) -> None:
    assert failure.op is not None
    prefix = [op for op in ops if op.index <= failure.op.index]
    want = failure.signature

    def fails(candidate: Sequence[Op]) -> bool:
        engine.trace = []
        got = engine.run(candidate)
        return got is not None and got.signature == want

    t0 = time.monotonic()
    tail, runs = suffix_first(prefix, fails, budget_s=args.shrink_budget / 2)
    left = args.shrink_budget - (time.monotonic() - t0)
    small, more = ddmin(tail, fails, budget_s=max(left, 10.0))
    runs += more
    engine.trace = []
    again = engine.run(small)
    only = ",".join(str(op.index) for op in small)
    print(f"minimised to {len(small)} of {len(prefix)} ops in {runs} runs:", flush=True)
    print(f"replay: python3 -m obmm.fuzz --seed {args.seed} --ops {args.ops} --only {only}")
    if again is not None:
        print(f"  fails with: {again}")
    for line in engine.trace:
        print("  " + line)
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        if args.record:
            return record(args)
        if args.mode == "concurrent":
            only = [n for n in args.only.split(",") if n]
            return race.main(args.seed, args.ops, reload=not args.no_reload, only=only,
                             seconds=args.seconds)  # fmt: skip
        return single(args)
    except RuntimeError as exc:
        print(f"fuzz: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
