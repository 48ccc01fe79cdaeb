"""compare: direction-aware regression flags and the exit status."""

from __future__ import annotations

from pathlib import Path

import pytest

from obmm.bench import compare
from obmm.bench.report import write_run
from obmm.bench.results import Environment, Figure, Run


def make_run(rev: str, load_ns: float, read_gbs: float, *, extra: bool = False) -> Run:
    env = Environment(
        kernel="6.1",
        accelerator="kvm",
        cpu_model="cpu",
        node_count=2,
        git_revision=rev,
        host="h",
        started="2026-01-01T00:00:00+00:00",
    )
    figs = [
        Figure("data.load.local", "data", "ns", [10.0, 10.0, 10.0]),
        Figure("data.load.cross-node", "data", "ns", [load_ns] * 3, baseline="data.load.local"),
        Figure("data.read.local", "data", "GB/s", [20.0] * 3, higher_is_better=True),
        Figure(
            "data.read.cross-node",
            "data",
            "GB/s",
            [read_gbs] * 3,
            higher_is_better=True,
            baseline="data.read.local",
        ),
        Figure("control.export.1GiB", "control", "us", skipped="pool too small"),
    ]
    if extra:
        figs.append(Figure("engram.prefetch.local.128tok", "engram", "ms", [0.3]))
    return Run(env=env, figures=figs)


def verdicts(rows: list[compare.Row]) -> dict[str, str]:
    return {r.name: r.verdict for r in rows}


def test_judge_both_directions() -> None:
    # latency: lower is better
    assert compare.judge(100, 111, higher_is_better=False, threshold=0.10) == compare.REGRESSION
    assert compare.judge(100, 110, higher_is_better=False, threshold=0.10) == compare.SAME
    assert compare.judge(100, 80, higher_is_better=False, threshold=0.10) == compare.IMPROVEMENT
    # bandwidth: higher is better
    assert compare.judge(20, 17, higher_is_better=True, threshold=0.10) == compare.REGRESSION
    assert compare.judge(20, 25, higher_is_better=True, threshold=0.10) == compare.IMPROVEMENT
    assert compare.judge(20, 19, higher_is_better=True, threshold=0.10) == compare.SAME
    assert compare.judge(0, 1, higher_is_better=False, threshold=0.10) == compare.REGRESSION
    assert compare.judge(0, 1, higher_is_better=True, threshold=0.10) == compare.IMPROVEMENT


def test_latency_up_and_bandwidth_down_are_regressions() -> None:
    rows = compare.compare_runs(make_run("a", 20.0, 18.0), make_run("b", 30.0, 9.0))
    v = verdicts(rows)
    assert v["data.load.cross-node"] == compare.REGRESSION
    assert v["data.read.cross-node"] == compare.REGRESSION
    assert v["data.load.local"] == compare.SAME
    assert v["control.export.1GiB"] == "not measured"
    row = next(r for r in rows if r.name == "data.read.cross-node")
    assert (row.old, row.new, row.change) == (18.0, 9.0, -0.5)


def test_latency_down_and_bandwidth_up_are_improvements() -> None:
    v = verdicts(compare.compare_runs(make_run("a", 30.0, 9.0), make_run("b", 20.0, 18.0)))
    assert v["data.load.cross-node"] == compare.IMPROVEMENT
    assert v["data.read.cross-node"] == compare.IMPROVEMENT
    assert compare.REGRESSION not in v.values()


def test_threshold_and_by_ratio() -> None:
    old, new = make_run("a", 20.0, 18.0), make_run("b", 21.0, 18.0)  # +5 %
    assert verdicts(compare.compare_runs(old, new, threshold=0.10))["data.load.cross-node"] == (
        compare.SAME
    )
    assert verdicts(compare.compare_runs(old, new, threshold=0.01))["data.load.cross-node"] == (
        compare.REGRESSION
    )
    rows = compare.compare_runs(old, new, by_ratio=True)
    row = next(r for r in rows if r.name == "data.load.cross-node")
    assert (row.old, row.new, row.unit) == (2.0, 2.1, "x baseline")
    # figures without a baseline have no ratio
    assert verdicts(rows)["data.load.local"] == "not measured"


def test_figures_only_on_one_side() -> None:
    v = verdicts(compare.compare_runs(make_run("a", 20, 18), make_run("b", 20, 18, extra=True)))
    assert v["engram.prefetch.local.128tok"] == "only in new"
    v = verdicts(compare.compare_runs(make_run("a", 20, 18, extra=True), make_run("b", 20, 18)))
    assert v["engram.prefetch.local.128tok"] == "only in old"


def test_main_exit_status_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write_run(make_run("aaa", 20.0, 18.0), tmp_path, name="old", plots=False)
    worse = write_run(make_run("bbb", 30.0, 18.0), tmp_path, name="worse", plots=False)
    better = write_run(make_run("ccc", 15.0, 20.0), tmp_path, name="better", plots=False)

    assert compare.main([str(old), str(worse)]) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("data.load.cross-node"))
    assert line.split() == ["data.load.cross-node", "20", "ns", "30", "ns", "+50.0%", "REGRESSION"]
    assert "old (aaa)" in out and "new (bbb)" in out
    assert "1 regression(s) beyond 10%" in out

    assert compare.main([str(old), str(better)]) == 0
    out = capsys.readouterr().out
    assert "REGRESSION" not in out
    assert "0 regression(s)" in out
    # the other way round, the better run's figures regress
    assert compare.main([str(better), str(old), "--threshold", "0.05"]) == 1
    assert compare.main([str(old), str(tmp_path / "missing")]) == 2


def test_side_by_side_puts_each_runs_median_and_own_ratio_in_one_table(tmp_path: Path) -> None:
    qemu = make_run("aaa", 12.0, 18.0)
    hw = make_run("bbb", 40.0, 10.0)
    hw.env.accelerator = "hardware"
    hw.env.extra["hw_hosts"] = "root@ub1,root@ub2"
    hw.figures = [f for f in hw.figures if f.name != "data.read.cross-node"]
    text = compare.side_by_side([qemu, hw], prefix="data.")
    lines = text.splitlines()
    assert lines[0].split() == [
        "figure", "kvm", "h", "(aaa)", "x", "baseline",
        "hardware", "root@ub1,root@ub2", "(bbb)", "x", "baseline",
    ]  # fmt: skip
    row = next(ln for ln in lines if ln.startswith("data.load.cross-node"))
    assert row.split() == ["data.load.cross-node", "12", "ns", "x1.20", "40", "ns", "x4.00"]
    row = next(ln for ln in lines if ln.startswith("data.read.cross-node"))
    assert row.split()[-2:] == ["-", "-"]  # not in the hardware run
    assert not any(ln.startswith("control.") for ln in lines)  # --prefix
    a, b = tmp_path / "a", tmp_path / "b"
    write_run(qemu, a.parent, name="a", plots=False)
    write_run(hw, b.parent, name="b", plots=False)
    assert compare.main([str(a), str(b), "--side-by-side"]) == 0  # never a verdict
