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
    engram_section,
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


# an import's Engram prefetch time over its local baseline's, round by round
ENGRAM_FACTORS = {"loopback": 1.0, "cross-node": 1.02, "cross-node-sync": 1.3}


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
    # Engram: interleaved runs, each import beside local memory of both page sizes
    for kind, factor in ENGRAM_FACTORS.items():
        local = noisy(0.3, 40, rng)
        thp = [v * 0.97 for v in local]
        for source, base, samples in (
            (f"{kind}-local", None, local),
            (f"{kind}-local-thp", f"{kind}-local", thp),
            (kind, f"{kind}-local", [v * factor for v in local]),
            (f"{kind}-pmd", f"{kind}-local-thp", [v * factor for v in thp]),
        ):
            run.figures.append(
                Figure(
                    name=f"engram.prefetch.{source}.128tok",
                    group="engram",
                    unit="ms",
                    samples=samples,
                    baseline=f"engram.prefetch.{base}.128tok" if base else None,
                    params={
                        "source": source,
                        "sync": kind.endswith("sync"),
                        "test": "engram",
                        "param": 128,
                        "interleaved": True,
                    },
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
        "| ratio | ratio per round min / median / max |" in text
    )
    cross = run.figure("data.chase.cross-node.64MiB")
    assert cross is not None
    ratio = run.ratio(cross)
    assert ratio is not None
    row = next(ln for ln in text.splitlines() if ln.startswith("| data.chase.cross-node.64MiB"))
    assert row.endswith(f"| x{ratio:.2f} | - |")  # not interleaved: no per-round ratio
    assert "| data.chase.local.64MiB |" in row
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


def test_engram_section_pairs_rounds_and_judges_each_variant() -> None:
    """Every interleaved Engram variant against its same-process baseline: min / median / max
    of both, the ratio of medians, the per-round ratios' min / median / max and the verdict."""
    run = synthetic_run()
    text = summary_markdown(run)
    section = text[text.index("## Engram prefetch, side by side") : text.index("## This run")]
    rows = {ln.split(" | ")[0][2:]: ln for ln in section.splitlines() if ln.startswith("| engram")}
    assert len(rows) == 3 * len(ENGRAM_FACTORS)  # the 4 K local baseline has no row
    for kind, factor in ENGRAM_FACTORS.items():
        page = run.figure(f"engram.prefetch.{kind}.128tok")
        base = run.figure(f"engram.prefetch.{kind}-local.128tok")
        assert page is not None and base is not None
        paired = run.paired_ratios(page)
        assert paired == pytest.approx([factor] * 40)
        row = rows[page.name]
        assert f"| {base.name} |" in row
        assert f"{fmt_value(page.minimum, 'ms')} / {fmt_value(page.median, 'ms')} / " in row
        assert f"x{factor:.2f} / x{factor:.2f} / x{factor:.2f}" in row
        assert row.endswith("| yes |" if factor <= 1.05 else "| **no** |")
        pmd_row = rows[f"engram.prefetch.{kind}-pmd.128tok"]
        assert f"| engram.prefetch.{kind}-local-thp.128tok |" in pmd_row
        assert rows[f"engram.prefetch.{kind}-local-thp.128tok"].endswith("| (page size) |")
    assert (
        "Above x1.05 in this run: engram.prefetch.cross-node-sync.128tok, "
        "engram.prefetch.cross-node-sync-pmd.128tok." in section
    )
    # no small-table figures in this run: nothing to tell where the time goes
    assert (
        "- engram.prefetch.cross-node-sync.128tok: x1.30; this run has no small-table figure"
        in section
    )
    # what the run's own figures say: page size, and O_SYNC against cacheable
    assert "- Page size: local memory with 2 MiB pages against 4 KiB pages" in section
    assert "x0.97 (beside cross-node)" in section
    assert "cross-node x1.02 cacheable, x1.30 O_SYNC" in section
    # the JSON carries the per-round ratios too
    doc = run.to_dict()
    by_name = {f["name"]: f for f in doc["figures"]}
    assert by_name["engram.prefetch.cross-node.128tok"]["paired_ratio"] == pytest.approx(
        {"min": 1.02, "median": 1.02, "max": 1.02}
    )
    assert by_name["data.chase.cross-node.64MiB"]["paired_ratio"] is None


def test_paired_ratios_need_the_same_rounds() -> None:
    """Only figures measured interleaved with their baseline, with as many samples, pair."""
    inter: dict[str, ParamValue] = {"interleaved": True}
    run = Run(env=env())
    run.add(
        [
            Figure("engram.prefetch.a-local.128tok", "engram", "ms", [1.0, 2.0], params=inter),
            Figure(
                "engram.prefetch.a.128tok",
                "engram",
                "ms",
                [1.5, 2.0],
                baseline="engram.prefetch.a-local.128tok",
                params=inter,
            ),
            Figure(
                "engram.prefetch.b.128tok",
                "engram",
                "ms",
                [1.5],
                baseline="engram.prefetch.a-local.128tok",
                params=inter,
            ),
            Figure(
                "engram.prefetch.c.128tok",
                "engram",
                "ms",
                [1.5, 2.0],
                baseline="engram.prefetch.a-local.128tok",
            ),
        ]
    )
    a, b, c = (run.figure(f"engram.prefetch.{x}.128tok") for x in "abc")
    assert a is not None and b is not None and c is not None
    assert run.paired_ratios(a) == [1.5, 1.0]
    assert run.paired_ratio_stats(a) == {"min": 1.0, "median": 1.25, "max": 1.5}
    assert run.paired_ratios(b) is None  # a sample short
    assert run.paired_ratios(c) is None  # not interleaved


def test_warnings_lead_the_summary_and_survive_the_json(tmp_path: Path) -> None:
    run = synthetic_run()
    run.warnings.append("node 1's clock ran at x7.30 of the host's")
    outdir = write_run(run, tmp_path, name="w", plots=False)
    text = (outdir / "summary.md").read_text()
    assert text.index("## Warnings") < text.index("## Headline")
    assert "- **node 1's clock ran at x7.30 of the host's**" in text
    assert Run.load(outdir).warnings == run.warnings


@pytest.mark.parametrize(
    ("small_factor", "faults", "says"),
    [
        (1.0, 0, "the extra time comes with the pages a prefetch touches"),
        (1.2, 0, "not explained by this run's figures"),
        (1.0, 3, "not explained by this run's figures"),
    ],
)
def test_a_variant_over_the_limit_is_explained_by_its_small_table_figure(
    small_factor: float, faults: int, says: str
) -> None:
    """A variant above x1.05 whose copies from small tables (same process) are within it and
    which took no fault while timed: the summary says the time comes with the pages touched."""
    run = Run(env=env())
    inter: dict[str, ParamValue] = {"interleaved": True, "test": "engram", "faults": faults}
    for kind, factor in (("engram.prefetch", 1.07), ("engram.small_tables", small_factor)):
        run.add(
            [
                Figure(f"{kind}.x-local-thp.128tok", "engram", "ms", [1.0, 1.1], params=inter),
                Figure(
                    f"{kind}.x-pmd.128tok",
                    "engram",
                    "ms",
                    [factor, 1.1 * factor],
                    baseline=f"{kind}.x-local-thp.128tok",
                    params={**inter, "source": "x-pmd"},
                ),
            ]
        )
    section = "\n".join(engram_section(run))
    row = next(ln for ln in section.splitlines() if ln.startswith("| engram.prefetch.x-pmd"))
    assert row.endswith(f"| x1.07 | x1.07 / x1.07 / x1.07 | x{small_factor:.2f} | **no** |")
    line = next(ln for ln in section.splitlines() if ln.startswith("- engram.prefetch.x-pmd"))
    assert line.startswith(
        f"- engram.prefetch.x-pmd.128tok: x1.07 from the whole tables, x{small_factor:.2f} from "
        f"small tables (same process), {faults} page faults while timed: "
    )
    assert says in line


def test_a_variant_over_the_limit_only_by_its_medians_says_so() -> None:
    """Medians x1.30 apart while round k's two samples (taken back to back) are x1.04 apart at
    the median: the summary says the gap came with the host's load, not with each prefetch."""
    run = Run(env=env())
    inter: dict[str, ParamValue] = {"interleaved": True, "test": "engram", "faults": 0}
    for kind in ("engram.prefetch", "engram.small_tables"):
        run.add(
            [
                Figure(f"{kind}.x-local.128tok", "engram", "ms", [1.0, 1.0, 1.25], params=inter),
                Figure(
                    f"{kind}.x.128tok",
                    "engram",
                    "ms",
                    [1.0, 1.3, 1.3],
                    baseline=f"{kind}.x-local.128tok",
                    params={**inter, "source": "x"},
                ),
            ]
        )
    section = "\n".join(engram_section(run))
    line = next(ln for ln in section.splitlines() if ln.startswith("- engram.prefetch.x.128tok"))
    assert line.startswith("- engram.prefetch.x.128tok: x1.30 from the whole tables, x1.30 from")
    assert "round by round the median ratio is x1.04, within the limit" in line
    # when the rounds agree with the medians, nothing of the kind is said
    section = "\n".join(engram_section(_run_with_pairs([1.0, 1.1], [1.07, 1.177])))
    assert "round by round" not in section


def _run_with_pairs(base: list[float], samples: list[float]) -> Run:
    run = Run(env=env())
    inter: dict[str, ParamValue] = {"interleaved": True, "test": "engram", "faults": 0}
    run.add(
        [
            Figure("engram.prefetch.x-local.128tok", "engram", "ms", base, params=inter),
            Figure(
                "engram.prefetch.x.128tok",
                "engram",
                "ms",
                samples,
                baseline="engram.prefetch.x-local.128tok",
                params={**inter, "source": "x"},
            ),
        ]
    )
    return run
