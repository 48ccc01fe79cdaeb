"""The result model: statistics, ratios, results.json round trip, summary.md and the plots."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from obmm.bench import controlpath
from obmm.bench.measure import make_testbed_figure as tb_fig
from obmm.bench.report import write_run
from obmm.bench.results import (
    PUBLISHED,
    PUBLISHED_LABEL,
    Environment,
    Figure,
    ParamValue,
    Run,
    cpu_model_from_cpuinfo,
    fmt_value,
    percentile,
    size_label,
    summary_markdown,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def env() -> Environment:
    return Environment(
        kernel="6.1.0-test",
        accelerator="tcg",
        cpu_model="Test CPU",
        node_count=2,
        git_revision="abc123",
        host="testhost",
        started="2026-01-01T00:00:00+00:00",
    )


def noisy(center: float, n: int, rng: random.Random) -> list[float]:
    return [center * (1 + rng.uniform(-0.1, 0.3)) for _ in range(n)]


def synthetic_run() -> Run:
    rng = random.Random(7)
    run = Run(env=env())
    sources = {"local": 1.0, "loopback": 1.1, "cross-node": 1.3, "cross-node-sync": 6.0}
    for src, factor in sources.items():
        base = None if src == "local" else "local"

        def bname(kind: str, suffix: str = "", b: str | None = base) -> str | None:
            return f"{kind}.{b}{suffix}" if b else None

        params: dict[str, ParamValue] = {"source": src, "sync": src.endswith("sync")}
        for ws, ns in ((16 << 10, 1.5), (1 << 20, 6.0), (64 << 20, 90.0)):
            run.figures.append(
                Figure(
                    name=f"data.chase.{src}.{size_label(ws)}",
                    group="data",
                    unit="ns",
                    samples=noisy(ns * factor, 10, rng),
                    baseline=bname("data.chase", f".{size_label(ws)}"),
                    params={**params, "test": "chase", "param": ws},
                )
            )
        for test, gbs in (("read", 20.0), ("write", 15.0)):
            run.figures.append(
                Figure(
                    name=f"data.{test}.{src}",
                    group="data",
                    unit="GB/s",
                    samples=noisy(gbs / factor, 10, rng),
                    baseline=bname(f"data.{test}"),
                    higher_is_better=True,
                    params={**params, "test": test, "param": 64 << 20},
                )
            )
        run.figures.append(
            Figure(
                name=f"data.load.{src}",
                group="data",
                unit="ns",
                samples=noisy(80 * factor, 200, rng),
                baseline=bname("data.load"),
                params={**params, "test": "load", "param": 4},
            )
        )
        run.figures.append(
            Figure(
                name=f"engram.prefetch.{src}.128tok",
                group="engram",
                unit="ms",
                samples=noisy(0.3 * factor, 50, rng),
                baseline=bname("engram.prefetch", ".128tok"),
                params={**params, "test": "engram", "param": 128},
            )
        )
    results = []
    for size in controlpath.SIZES[:5]:
        res = controlpath.SizeResult(size)
        scale = size / (2 << 20)
        for _ in range(8):
            for op in controlpath.OPS:
                res.add(op, rng.uniform(20, 40) * (scale if op == "export" else 1))
            for op in controlpath.BASE_OPS:
                res.add(op, rng.uniform(10, 20) * scale)
        results.append(res)
    big = controlpath.SizeResult(1 << 30)
    for op in (*controlpath.OPS, *controlpath.BASE_OPS):
        big.skipped[op] = "1GiB is larger than the free export pool (512MiB)"
    results.append(big)
    run.figures += controlpath.figures(results, [0.3] * 100)
    run.figures += [
        tb_fig("testbed.image_build.cold", [412.0]),
        tb_fig("testbed.image_build.cached", [9.5], baseline="testbed.image_build.cold"),
        tb_fig("testbed.boot_to_ssh.1node", [31.0, 33.0]),
        tb_fig("testbed.boot_to_ssh.2nodes", [40.0, 44.0], baseline="testbed.boot_to_ssh.1node"),
    ]
    return run


def test_percentile_exact() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(map(float, range(101))), 99) == 99.0
    assert percentile(list(map(float, range(1, 11))), 99) == pytest.approx(9.91)
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_figure_stats_and_ratio() -> None:
    run = Run(env=env())
    run.add(
        [
            Figure("data.load.local", "data", "ns", [10.0, 20.0, 30.0]),
            Figure(
                "data.load.cross-node", "data", "ns", [30.0, 50.0, 70.0], baseline="data.load.local"
            ),
            Figure("data.load.loopback", "data", "ns", skipped="no import"),
            Figure("data.load.orphan", "data", "ns", [1.0], baseline="data.load.missing"),
        ]
    )
    fig = run.figure("data.load.cross-node")
    assert fig is not None
    assert (fig.median, fig.mean, fig.minimum, fig.maximum) == (50.0, 50.0, 30.0, 70.0)
    assert fig.p99 == pytest.approx(69.6)
    assert run.ratio(fig) == 2.5
    skipped = run.figure("data.load.loopback")
    assert skipped is not None and not skipped.ok and skipped.median is None
    orphan = run.figure("data.load.orphan")
    assert orphan is not None and run.ratio(orphan) is None
    with pytest.raises(ValueError, match="already in the run"):
        run.add([Figure("data.load.local", "data", "ns", [1.0])])
    with pytest.raises(ValueError, match="group"):
        Figure("x", "nonsense", "ns")


def test_helpers() -> None:
    assert [size_label(n) for n in (2 << 20, 16 << 10, 1 << 30, 1000)] == [
        "2MiB",
        "16KiB",
        "1GiB",
        "1000B",
    ]
    assert fmt_value(0.109, "ms") == "0.109 ms"
    assert fmt_value(1234.0, "ns") == "1234 ns"
    assert fmt_value(None) == "-"
    assert cpu_model_from_cpuinfo("processor\t: 0\nmodel name\t: Xeon X\n") == "Xeon X"
    assert cpu_model_from_cpuinfo("CPU implementer\t: 0x48\nCPU part\t: 0xd02\n") == (
        "implementer 0x48 part 0xd02"
    )
    with pytest.raises(ValueError):
        tb_fig("boot", [1.0])


def test_json_round_trip(tmp_path: Path) -> None:
    run = synthetic_run()
    outdir = write_run(run, tmp_path, name="r", plots=False)
    doc = json.loads((outdir / "results.json").read_text())
    assert doc["environment"]["git_revision"] == "abc123"
    assert doc["environment"]["finished"]  # set on write
    by_name = {f["name"]: f for f in doc["figures"]}
    f = by_name["data.chase.cross-node.64MiB"]
    assert len(f["samples"]) == 10  # every sample is kept
    assert f["stats"]["median"] == pytest.approx(percentile(f["samples"], 50))
    assert f["ratio_to_baseline"] == pytest.approx(
        percentile(f["samples"], 50) / percentile(by_name["data.chase.local.64MiB"]["samples"], 50)
    )
    assert by_name["control.export.1GiB"]["skipped"].startswith("1GiB is larger")
    assert all(p["label"] == "different machine" for p in doc["published_hardware_figures"])
    again = Run.load(outdir)
    assert [x.to_dict() for x in again.figures] == [x.to_dict() for x in run.figures]
    assert again.env == run.env


def test_summary_table_has_ratio_and_published_section() -> None:
    run = synthetic_run()
    text = summary_markdown(run)
    assert (
        "| figure | min | median | max | p99 | n | baseline | baseline min / median / max "
        "| ratio |" in text
    )
    cross = run.figure("engram.prefetch.cross-node.128tok")
    assert cross is not None
    ratio = run.ratio(cross)
    assert ratio is not None
    row = next(ln for ln in text.splitlines() if ln.startswith("| engram.prefetch.cross-node."))
    assert row.endswith(f"| x{ratio:.2f} |")
    assert "| engram.prefetch.local.128tok |" in row
    # the published figures are in their own, labelled section after this run's table
    assert text.index("## This run") < text.index(f"## {PUBLISHED_LABEL}")
    published = text[text.index(f"## {PUBLISHED_LABEL}") :]
    assert "different machine" in PUBLISHED_LABEL
    assert (
        "| Engram prefetch, 128 tokens x 12 tables, URMA read (scheme 5 urma_read) | 0.14 ms"
        in published
    )
    assert "| Engram prefetch, 128 tokens x 12 tables, local DRAM | 0.109 ms" in published
    assert all(p.source in published for p in PUBLISHED)
    assert "0.14 ms" not in text[: text.index(f"## {PUBLISHED_LABEL}")]
    # skipped sizes are reported with their reason, not dropped
    assert "- control.export.1GiB: 1GiB is larger than the free export pool (512MiB)" in text
    assert "not UB latency" in text
    assert "## Headline: remote / local" in text


def test_plots_written_and_non_trivial(tmp_path: Path) -> None:
    outdir = write_run(synthetic_run(), tmp_path, name="r")
    names = {
        "control_latency.png",
        "data_latency.png",
        "data_bandwidth.png",
        "engram.png",
        "distributions.png",
        "testbed.png",
    }
    assert {p.name for p in outdir.glob("*.png")} == names
    for name in names:
        data = (outdir / name).read_bytes()
        assert data.startswith(PNG_MAGIC)
        assert len(data) > 20_000, name  # axes, labels, legends: not an empty canvas
    summary = (outdir / "summary.md").read_text()
    assert all(f"![{n}]({n})" in summary for n in names)


def test_no_plot_without_figures(tmp_path: Path) -> None:
    run = Run(env=env(), figures=[Figure("data.load.local", "data", "ns", skipped="no VM")])
    outdir = write_run(run, tmp_path, name="empty")
    assert list(outdir.glob("*.png")) == []
    assert "- data.load.local: no VM" in (outdir / "summary.md").read_text()


def test_load_rejects_other_schema(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"schema": 99}))
    with pytest.raises(ValueError, match="schema"):
        Run.load(tmp_path)
