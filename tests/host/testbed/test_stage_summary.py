"""obmm.testbed.stages.stage_summary: make test's table of each stage's wall time against its CPU
floor, from the times obmm.tools.side_by_side records, and the list of what was skipped for lack
of an input."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from obmm.testbed.stages import stage_summary
from obmm.testbed.stages.stage_summary import Row, render, summarise, total

SIDE = [sys.executable, "-m", "obmm.tools.side_by_side"]


def job(stage: str, name: str, wall: float, cpu: float, status: int = 0) -> dict[str, object]:
    return {"kind": "job", "stage": stage, "job": name, "wall_s": wall, "cpu_s": cpu,
            "status": status}  # fmt: skip


def stage(name: str, wall: float, cpu: float, status: int = 0) -> dict[str, object]:
    return {**job(name, name, wall, cpu, status), "kind": "stage"}


def test_a_stage_row_is_its_outermost_run_and_its_jobs_sit_under_it() -> None:
    records = [
        job("host+build", "host", 100, 150),
        job("host+build", "build", 300, 250),
        stage("host+build", 300, 400),
        # qemu-test's own side-by-side run, then the whole stage timed around it (its image
        # and kmod prelude included): the outer one is the stage's row.
        job("qemu-test", "qemu", 900, 1000),
        job("qemu-test", "cluster", 600, 700, status=1),
        stage("qemu-test", 900, 1700, status=1),
        job("qemu-test", "qemu-test", 950, 1800, status=2),
        stage("qemu-test", 950, 1800, status=2),
    ]
    rows = summarise(records, cores=2)
    assert [(r.name, r.wall_s, r.cpu_s, r.floor_s, r.status) for r in rows] == [
        ("host+build", 300, 400, 200, 0),
        ("qemu-test", 950, 1800, 900, 2),
    ]
    assert [j.name for j in rows[1].jobs] == ["qemu", "cluster"]
    assert rows[1].jobs[1].floor_s == 350 and rows[1].jobs[1].status == 1
    whole = total(rows, cores=2)
    assert (whole.wall_s, whole.cpu_s, whole.floor_s, whole.status) == (1250, 2200, 1100, 2)


def test_a_stage_without_its_own_line_is_made_of_its_jobs() -> None:
    # A run killed before its side-by-side wrote the stage line.
    rows = summarise([job("s", "a", 10, 4), job("s", "b", 30, 8, status=3)], cores=2)
    assert [(r.name, r.wall_s, r.cpu_s, r.floor_s, r.status) for r in rows] == [("s", 30, 12, 6, 3)]


def test_the_table_shows_wall_floor_and_their_ratio_per_stage_and_job() -> None:
    rows = [Row("qemu-test", 900, 1200, 600, 0, [Row("qemu", 800, 1000, 500, 1)])]
    lines = render(rows, cores=2)
    assert "2 cores" in lines[0] and "wall/floor" in lines[1]
    assert lines[2].split() == ["qemu-test", "900", "1200", "600", "1.50", "ok"]
    assert lines[3].startswith("  qemu ") and lines[3].split()[-2:] == ["exit", "1"]
    assert lines[4].split()[:5] == ["total", "900", "1200", "600", "1.50"]


def test_side_by_side_records_nested_stages_and_the_summary_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # As make test runs a stage: timed as a whole (--plain) around its own side-by-side jobs.
    times = tmp_path / "stage-times.jsonl"
    burn = tmp_path / "burn.py"
    burn.write_text(
        "import time\nt = time.process_time() + 0.4\nwhile time.process_time() < t: pass\n"
    )
    step = shlex.join([sys.executable, str(burn)])
    inner = [*SIDE, "--record", str(times), "--stage", "st", f"a={step}", f"b={step}"]
    outer = [*SIDE, "--record", str(times), "--stage", "st", "--plain", f"st={shlex.join(inner)}"]
    done = subprocess.run(outer, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = tmp_path / "skipped-inputs.txt"
    skipped.write_text("x: skipped: no y (set OBMM_Y=DIR)\nx: skipped: no y (set OBMM_Y=DIR)\n")
    out_json = tmp_path / "stage-summary.json"
    argv = ["--times", str(times), "--json", str(out_json), "--skipped", str(skipped)]
    assert stage_summary.main([*argv, "--cores", "2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    doc = json.loads(out_json.read_text())
    (st,) = doc["stages"]
    assert st["name"] == "st" and [j["name"] for j in st["jobs"]] == ["a", "b"]
    # The outer run saw all the CPU of the inner one's jobs (waited-for descendants count).
    assert st["cpu_s"] >= sum(j["cpu_s"] for j in st["jobs"]) >= 0.7
    assert st["floor_s"] == pytest.approx(st["cpu_s"] / 2)
    assert doc["skipped_inputs"] == ["x: skipped: no y (set OBMM_Y=DIR)"]
    assert printed[-2:] == [
        "make test: skipped for lack of inputs:",
        "  x: skipped: no y (set OBMM_Y=DIR)",
    ]


def test_nothing_skipped_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--times", str(tmp_path / "none"), "--json", str(tmp_path / "s.json"),
            "--skipped", str(tmp_path / "none")]  # fmt: skip
    assert stage_summary.main(argv) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1] == "make test: nothing skipped for lack of inputs"
    )
