"""The end of ``make test``: each stage's wall time beside its CPU floor, and what was skipped for
lack of an input.

``python -m obmm.testbed.stages.stage_summary [--times FILE] [--json FILE] [--skipped FILE]``
reads the JSON lines :mod:`obmm.tools.side_by_side` ``--record`` appended during the run (one per
job and one per side-by-side run, ``kind: stage``), prints one row per stage and, under it, one per
job, writes the same numbers to ``results/stage-summary.json`` and then lists the lines of
``results/skipped-inputs.txt`` (:func:`obmm.testbed.paths.note_input_skip`), each once.

A CPU floor is the CPU seconds of all of a stage's processes (children and QEMU guests included)
over the machine's cores: no schedule of that work on this machine ends sooner.  A stage's row is
its outermost timed run (a stage timed as a whole and again inside, as ``qemu-test``'s jobs are);
the total is the sum of the stages, which ran one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from obmm.testbed import paths

TIMES_NAME = "stage-times.jsonl"
SUMMARY_NAME = "stage-summary.json"


@dataclass
class Row:
    name: str
    wall_s: float
    cpu_s: float
    floor_s: float
    status: int
    jobs: list[Row] = field(default_factory=list)


def floor(cpu_s: float, cores: int) -> float:
    return cpu_s / max(cores, 1)


def summarise(records: Iterable[dict[str, object]], cores: int) -> list[Row]:
    """One row per stage in the order stages first appear, each with its jobs' rows."""
    stages: dict[str, Row] = {}
    jobs: dict[str, list[Row]] = {}
    for rec in records:
        stage = str(rec.get("stage", ""))
        wall, cpu = float(rec.get("wall_s", 0.0)), float(rec.get("cpu_s", 0.0))  # type: ignore[arg-type]
        status = int(rec.get("status") or 0)  # type: ignore[call-overload]
        row = Row(str(rec.get("job", stage)), wall, cpu, floor(cpu, cores), status)
        jobs.setdefault(stage, [])
        if rec.get("kind") == "stage":
            # The outermost run of a stage is the longest one.
            if stage not in stages or wall > stages[stage].wall_s:
                stages[stage] = row
        elif row.name != stage:  # a stage timed as one job is its stage row already
            jobs[stage].append(row)
    out = []
    for stage, its_jobs in jobs.items():
        row = stages.get(stage) or Row(
            stage,
            max((j.wall_s for j in its_jobs), default=0.0),
            sum(j.cpu_s for j in its_jobs),
            floor(sum(j.cpu_s for j in its_jobs), cores),
            next((j.status for j in its_jobs if j.status), 0),
        )
        row.jobs = its_jobs
        out.append(row)
    return out


def total(rows: Sequence[Row], cores: int) -> Row:
    cpu = sum(r.cpu_s for r in rows)
    status = next((r.status for r in rows if r.status), 0)
    return Row("total", sum(r.wall_s for r in rows), cpu, floor(cpu, cores), status)


def render(rows: Sequence[Row], cores: int) -> list[str]:
    """The table: stage (jobs indented), wall, CPU, floor, wall over floor, status."""
    head = (
        f"{'stage / job':24} {'wall s':>8} {'CPU s':>8} {'floor s':>8} {'wall/floor':>10}  status"
    )
    lines = [f"make test: wall time and CPU floor (CPU seconds / {cores} cores)", head]

    def line(r: Row, indent: str) -> str:
        ratio = f"{r.wall_s / r.floor_s:.2f}" if r.floor_s > 0 else "-"
        verdict = "ok" if r.status == 0 else f"exit {r.status}"
        return (
            f"{indent + r.name:24} {r.wall_s:8.0f} {r.cpu_s:8.0f} {r.floor_s:8.0f} {ratio:>10}"
            f"  {verdict}"
        )

    for r in rows:
        lines.append(line(r, ""))
        lines.extend(line(j, "  ") for j in r.jobs)
    if rows:
        lines.append(line(total(rows, cores), ""))
    return lines


def skipped_lines(path: Path) -> list[str]:
    """The skip lines of `path`, each once, in the order first noted."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return list(dict.fromkeys(ln.strip() for ln in text.splitlines() if ln.strip()))


def read_records(path: Path) -> list[dict[str, object]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for ln in text.splitlines():
        try:
            out.append(json.loads(ln))
        except ValueError:
            continue  # a line cut short by a killed run
    return out


def main(argv: Sequence[str] | None = None) -> int:
    results = paths.results_dir()
    p = argparse.ArgumentParser(
        prog="python -m obmm.testbed.stages.stage_summary", description=__doc__
    )
    p.add_argument("--times", type=Path, default=results / TIMES_NAME)
    p.add_argument("--json", type=Path, default=results / SUMMARY_NAME)
    p.add_argument("--skipped", type=Path, default=paths.skipped_inputs_file())
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    rows = summarise(read_records(args.times), args.cores)
    for ln in render(rows, args.cores):
        print(ln)
    doc = {
        "cores": args.cores,
        "stages": [asdict(r) for r in rows],
        "total": asdict(total(rows, args.cores)),
        "skipped_inputs": skipped_lines(args.skipped),
    }
    try:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as exc:
        print(f"stage_summary: cannot write {args.json}: {exc}", file=sys.stderr)
    skipped = doc["skipped_inputs"]
    if skipped:
        print("make test: skipped for lack of inputs:")
        for ln in skipped:
            print(f"  {ln}")
    else:
        print("make test: nothing skipped for lack of inputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
