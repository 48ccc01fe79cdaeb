"""Two result folders side by side, regressions flagged.

    python -m obmm.bench.compare OLD NEW [--threshold 0.10] [--by-ratio]
    python -m obmm.bench.compare A B --side-by-side [--prefix scheme7.]

OLD and NEW are `bench-results/<timestamp>/` folders (or their results.json).  Figures are
matched by name and compared on the median (`--by-ratio`: on the ratio to the baseline of the
same run, which is what stays comparable between machines).  Direction-aware: a latency or time
that grew, or a bandwidth / rate that shrank, by more than the threshold is a regression.
Exit status 1 when any regression is flagged, 0 otherwise, 2 on bad input.
`--side-by-side` prints one table of both runs instead (each run's median and its ratio to
that run's own baseline, no verdict), for runs on different machines: the scheme-7 benchmark on
the QEMU pair beside the same on real UB hosts.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from obmm.bench.results import Figure, Run, fmt_value

REGRESSION = "REGRESSION"
IMPROVEMENT = "improvement"
SAME = "same"
EPSILON = 1e-9


@dataclass(frozen=True)
class Row:
    name: str
    unit: str
    old: float | None
    new: float | None
    verdict: str  # REGRESSION, improvement, same, only in old, only in new, not measured

    @property
    def change(self) -> float | None:
        """new / old - 1 (inf when old is 0 and new is not)."""
        if self.old is None or self.new is None:
            return None
        if self.old == 0:
            return 0.0 if self.new == 0 else math.inf
        return self.new / self.old - 1.0


def judge(old: float, new: float, *, higher_is_better: bool, threshold: float) -> str:
    if old == new:
        return SAME
    if old == 0:
        worse = (new < 0) if higher_is_better else (new > 0)
        return REGRESSION if worse else IMPROVEMENT
    change = new / old - 1.0
    if higher_is_better:
        change = -change
    # a change of exactly the threshold is not flagged (110 / 100 - 1 is 0.10000000000000009)
    if change > threshold + EPSILON:
        return REGRESSION
    if change < -threshold - EPSILON:
        return IMPROVEMENT
    return SAME


def _value(run: Run, fig: Figure, by_ratio: bool) -> float | None:
    return run.ratio(fig) if by_ratio else fig.median


def compare_runs(
    old: Run, new: Run, *, threshold: float = 0.10, by_ratio: bool = False
) -> list[Row]:
    rows: list[Row] = []
    new_names = {f.name for f in new.figures}
    for ofig in old.figures:
        nfig = new.figure(ofig.name)
        unit = "x baseline" if by_ratio else ofig.unit
        if nfig is None:
            rows.append(Row(ofig.name, unit, _value(old, ofig, by_ratio), None, "only in old"))
            continue
        ov, nv = _value(old, ofig, by_ratio), _value(new, nfig, by_ratio)
        if ov is None or nv is None:
            rows.append(Row(ofig.name, unit, ov, nv, "not measured"))
            continue
        verdict = judge(ov, nv, higher_is_better=nfig.higher_is_better, threshold=threshold)
        rows.append(Row(ofig.name, unit, ov, nv, verdict))
    for nfig in new.figures:
        if nfig.name not in {f.name for f in old.figures} and nfig.name in new_names:
            rows.append(
                Row(
                    nfig.name,
                    "x baseline" if by_ratio else nfig.unit,
                    None,
                    _value(new, nfig, by_ratio),
                    "only in new",
                )
            )
    return rows


def render(rows: Sequence[Row], old_label: str, new_label: str) -> str:
    header = ("figure", old_label, new_label, "change", "verdict")
    table = [header]
    for r in rows:
        change = r.change
        table.append(
            (
                r.name,
                fmt_value(r.old, r.unit),
                fmt_value(r.new, r.unit),
                "-" if change is None else ("inf" if math.isinf(change) else f"{change:+.1%}"),
                r.verdict,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_label(run: Run) -> str:
    """Where a run was measured, for a column header: accelerator, hosts or host, revision."""
    env = run.env
    where = env.extra.get("hw_hosts") or env.host
    return f"{env.accelerator} {where} ({env.git_revision})"


def side_by_side(runs: Sequence[Run], *, prefix: str = "") -> str:
    """One table of several runs (a QEMU run beside one on real hosts, say): every figure any
    run has (names starting with `prefix`), each run's median and its ratio to that run's own
    baseline.  No verdicts: the runs may come from different machines."""
    names: list[str] = []
    for run in runs:
        names += [f.name for f in run.figures if f.name.startswith(prefix) and f.name not in names]
    header = ["figure"]
    for run in runs:
        header += [run_label(run), "x baseline"]
    table = [header]
    for name in names:
        row = [name]
        for run in runs:
            fig = run.figure(name)
            if fig is None or not fig.ok:
                row += ["-" if fig is None else "not measured", "-"]
                continue
            ratio = run.ratio(fig)
            row += [fmt_value(fig.median, fig.unit), "-" if ratio is None else f"x{ratio:.2f}"]
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m obmm.bench.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument(
        "--side-by-side",
        action="store_true",
        help="one table of both runs (median and ratio to its own baseline each), no verdict: "
        "for runs on different machines, e.g. the QEMU pair and real UB hosts",
    )
    p.add_argument("--prefix", default="", help="--side-by-side: only figures named so")
    p.add_argument(
        "--threshold", type=float, default=0.10, help="relative change that counts (0.10 = 10%%)"
    )
    p.add_argument(
        "--by-ratio",
        action="store_true",
        help="compare each figure's ratio to its baseline instead of the median",
    )
    args = p.parse_args(argv)
    if args.threshold < 0:
        p.error("--threshold must be >= 0")
    try:
        old, new = Run.load(args.old), Run.load(args.new)
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot read results: {exc}", file=sys.stderr)
        return 2
    if args.side_by_side:
        print(side_by_side([old, new], prefix=args.prefix))
        return 0
    rows = compare_runs(old, new, threshold=args.threshold, by_ratio=args.by_ratio)
    print(render(rows, f"old ({old.env.git_revision})", f"new ({new.env.git_revision})"))
    bad = [r for r in rows if r.verdict == REGRESSION]
    print(
        f"\n{len(bad)} regression(s) beyond {args.threshold:.0%} "
        f"({'ratio to baseline' if args.by_ratio else 'median'})"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
