"""PNG plots of a run (matplotlib, Agg backend).  Each plot is written only when the run holds
figures for it; `write_plots` returns the paths written."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from obmm.bench.probe import (
    LOCAL_SUFFIX,
    LOCAL_THP_SUFFIX,
    PMD_SUFFIX,
    kind_of,
    source_title,
)
from obmm.bench.results import (
    PUBLISHED,
    Figure,
    Run,
    percentile,
    size_label,
)

DPI = 110
SOURCE_ORDER = ("local", "file", "loopback", "loopback-sync", "cross-node", "cross-node-sync")
COLORS = {
    "local": "#1f77b4",
    "file": "#17becf",
    "loopback": "#2ca02c",
    "loopback-sync": "#98df8a",
    "cross-node": "#d62728",
    "cross-node-sync": "#ff9896",
}
PUBLISHED_COLOR = "#7f7f7f"


def _sources(figs: Sequence[Figure]) -> list[str]:
    found = {str(f.params.get("source")) for f in figs}
    ordered = [s for s in SOURCE_ORDER if s in found]
    return ordered + sorted(found - set(ordered))


def _title(source: str) -> str:
    return source_title(source)


def _short_label(source: str) -> str:
    """A source title on short lines ("loopback\nimport\nO_SYNC"): tick labels never touch."""
    return _title(source).replace(", ", "\n").replace(" import", "\nimport")


def _size_formatter() -> FuncFormatter:
    return FuncFormatter(lambda x, _pos: size_label(int(x)) if x >= 1 else "")


def _subtitle(run: Run) -> str:
    env = run.env
    return (
        f"{env.accelerator}, {env.node_count} node(s), kernel {env.kernel}, git {env.git_revision}"
    )


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


BASE_STYLES = {
    "base.mmap_populate": (":", "s"),
    "base.munmap": ("-.", "v"),
    "base.mmap_touch": ("--", "^"),
}
OP_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
SIZED_OPS = ("export", "unexport", "shmdev_open_mmap_touch", "export_to_readable")
FIXED_OPS = ("import", "unimport", "query_pa", "query_memid")


def _control_panel(ax: Any, ops: dict[str, list[Figure]], names: Sequence[str]) -> None:
    for i, op in enumerate(n for n in names if n in ops):
        items = sorted(ops[op], key=lambda f: int(f.params["size"]))
        xs = [int(f.params["size"]) for f in items]
        med = [f.median or 0.0 for f in items]
        p99 = [f.p99 or 0.0 for f in items]
        if op in BASE_STYLES:
            style, marker = BASE_STYLES[op]
            color = "#333333"
            label = f"{op.removeprefix('base.')} (baseline)"
        else:
            style, marker, color, label = "-", "o", OP_COLORS[i % len(OP_COLORS)], op
        ax.plot(xs, med, style, marker=marker, color=color, label=label)
        ax.fill_between(xs, med, p99, color=color, alpha=0.12)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(_size_formatter())
    ax.set_xlabel("region size")
    ax.set_ylabel("microseconds (log); line = median, band to p99")
    ax.grid(True, which="both", alpha=0.3)


def plot_control(run: Run, path: Path) -> Path | None:
    figs = [f for f in run.figures if f.group == "control" and f.ok and "size" in f.params]
    if not figs:
        return None
    ops: dict[str, list[Figure]] = {}
    for f in figs:
        ops.setdefault(str(f.params["op"]), []).append(f)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 6))
    _control_panel(ax1, ops, (*SIZED_OPS, *BASE_STYLES))
    ax1.set_title("Operations that touch the memory, vs local baselines")
    ax1.legend(fontsize=8)
    _control_panel(ax2, ops, FIXED_OPS)
    null = run.figure("control.null_syscall")
    if null is not None and null.median is not None:
        ax2.axhline(
            null.median,
            color="black",
            lw=1,
            ls="--",
            label=f"null syscall (baseline), {null.median:.2g} us",
        )
    ax2.set_title("Ioctls that only manage the region, vs a null syscall")
    ax2.legend(fontsize=8)
    fig.suptitle(
        f"Control path latency (Python + ioctl) vs region size: {_subtitle(run)}", fontsize=10
    )
    return _save(fig, path)


def plot_data_latency(run: Run, path: Path) -> Path | None:
    chase = [f for f in run.figures if f.ok and f.params.get("test") == "chase"]
    loads = [f for f in run.figures if f.ok and f.params.get("test") == "load"]
    if not chase and not loads:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    for src in _sources(chase):
        items = sorted(
            (f for f in chase if f.params.get("source") == src),
            key=lambda f: int(f.params["param"]),
        )
        xs = [int(f.params["param"]) for f in items]
        ax1.errorbar(
            xs,
            [f.median or 0.0 for f in items],
            yerr=[[0.0] * len(items), [(f.p99 or 0.0) - (f.median or 0.0) for f in items]],
            marker="o",
            capsize=3,
            color=COLORS.get(src),
            label=_title(src),
        )
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.xaxis.set_major_formatter(_size_formatter())
    ax1.set_xlabel("working set (random cyclic chain of 64 B lines)")
    ax1.set_ylabel("ns per dependent load (log); bar to p99")
    ax1.set_title("Pointer-chase load latency")
    ax1.grid(True, which="both", alpha=0.3)
    if chase:
        ax1.legend(fontsize=8)
    srcs = _sources(loads)
    ticks = []
    for i, src in enumerate(srcs):
        f = next(f for f in loads if f.params.get("source") == src)
        ax2.bar(i, f.median or 0.0, color=COLORS.get(src), label=_title(src))
        ax2.errorbar(
            i,
            f.median or 0.0,
            yerr=[[0.0], [(f.p99 or 0.0) - (f.median or 0.0)]],
            color="black",
            capsize=4,
        )
        # The ratio goes under the bar, where the p99 whisker cannot cover it.
        ratio = run.ratio(f)
        label = _short_label(src)
        ticks.append(f"{label}\nx{ratio:.2f} local" if ratio is not None else label)
    ax2.set_xticks(range(len(srcs)), ticks, fontsize=8)
    ax2.set_ylabel("ns (median; bar to p99)")
    ax2.set_title("Single 4 B load at a random line\n(median ratio to local memory under each bar)")
    ax2.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"Data path latency: {_subtitle(run)}", fontsize=10)
    return _save(fig, path)


def plot_bandwidth(run: Run, path: Path) -> Path | None:
    bw = [f for f in run.figures if f.ok and f.params.get("test") in ("read", "write")]
    if not bw:
        return None
    srcs = _sources(bw)
    fig, ax = plt.subplots(figsize=(10, 5.5))
    width = 0.8 / max(len(srcs), 1)
    for j, src in enumerate(srcs):
        for i, test in enumerate(("read", "write")):
            f = next(
                (f for f in bw if f.params.get("source") == src and f.params.get("test") == test),
                None,
            )
            if f is None:
                continue
            x = i + (j - (len(srcs) - 1) / 2) * width
            ax.bar(
                x,
                f.median or 0.0,
                width * 0.95,
                color=COLORS.get(src),
                label=_title(src) if i == 0 else None,
            )
            lo = (f.median or 0.0) - percentile(f.samples, 1)
            ax.errorbar(x, f.median or 0.0, yerr=[[lo], [0.0]], color="black", capsize=3)
            ratio = run.ratio(f)
            text = f"{f.median:.3g}" + (f"\nx{ratio:.2f}" if ratio is not None else "")
            ax.annotate(
                text,
                (x, f.median or 0.0),
                ha="center",
                va="bottom",
                xytext=(0, 3),
                textcoords="offset points",
                fontsize=7,
            )
    ax.set_ylim(0, max(f.median or 0.0 for f in bw) * 1.2)
    ax.set_xticks([0, 1], ["sequential read", "sequential write"])
    ax.set_ylabel("GB/s (median; bar down to p1)")
    ax.set_title(f"Data path bandwidth (ratio to local under each value)\n{_subtitle(run)}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


# An interleaved run's sources in plotting order: (suffix, tick label, colour or None = the
# import's own colour, hatched)
ENGRAM_PARTS = (
    (LOCAL_SUFFIX, "local\n4K", "#1f77b4", False),
    ("", "import\n4K", None, False),
    (LOCAL_THP_SUFFIX, "local\n2M", "#aec7e8", False),
    (PMD_SUFFIX, "import\nPMD", None, True),
)


def _engram_groups(eng: Sequence[Figure]) -> list[tuple[str, list[tuple[Figure, str, str, bool]]]]:
    """Interleaved Engram figures grouped by the mapping they were measured beside."""
    by_source = {str(f.params.get("source")): f for f in eng}
    kinds = {k for k in (kind_of(s) for s in by_source) if k}
    groups = []
    for kind in [k for k in SOURCE_ORDER if k in kinds] + sorted(kinds - set(SOURCE_ORDER)):
        parts = []
        for suffix, label, color, hatched in ENGRAM_PARTS:
            fig = by_source.get(kind + suffix)
            if fig is not None:
                parts.append((fig, label, color or COLORS.get(kind, "#cccccc"), hatched))
        groups.append((kind, parts))
    return groups


def plot_engram(run: Run, path: Path) -> Path | None:
    eng = [
        f
        for f in run.figures
        if f.ok and f.name.startswith("engram.prefetch.") and f.params.get("interleaved")
    ]
    if not eng:
        return None
    tokens = sorted({int(f.params.get("param", 0)) for f in eng})
    eng = [f for f in eng if int(f.params.get("param", 0)) == tokens[-1]]
    groups = _engram_groups(eng)
    pubs = [p for p in PUBLISHED if p.unit == "ms" and "Engram" in p.what]
    fig, (ax1, ax2) = plt.subplots(
        1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [4, 1.6]}, sharey=False
    )
    positions, data, labels, colors, hatches, figs = [], [], [], [], [], []
    x = 1.0
    for kind, parts in groups:
        start = x
        for f, label, color, hatched in parts:
            positions.append(x)
            data.append(f.samples)
            labels.append(label)
            colors.append(color)
            hatches.append(hatched)
            figs.append(f)
            x += 1
        ax1.annotate(
            _title(kind),
            ((start + x - 1) / 2, 0),
            xycoords=("data", "axes fraction"),
            xytext=(0, -52),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize=9,
            fontweight="bold",
        )
        x += 0.8
    bp = ax1.boxplot(
        data,
        positions=positions,
        whis=(0, 100),
        showfliers=False,
        patch_artist=True,
        widths=0.7,
        medianprops={"color": "black"},
    )
    for patch, color, hatched in zip(bp["boxes"], colors, hatches):
        patch.set_facecolor(color)
        if hatched:
            patch.set_hatch("//")
    top = max(max(d) for d in data)
    for pos, f in zip(positions, figs):
        ratio = run.ratio(f)
        base = run.baseline_of(f)
        text = f"{f.median:.3g}"
        if ratio is not None and base is not None:
            kind = "2 MiB" if str(base.params.get("source")).endswith(LOCAL_THP_SUFFIX) else "4 KiB"
            text += f"\nx{ratio:.2f}\nof {kind}"
        ax1.annotate(
            text,
            (pos, f.maximum or 0.0),
            ha="center",
            va="bottom",
            xytext=(0, 3),
            textcoords="offset points",
            fontsize=7,
        )
    ax1.set_xticks(positions, labels, fontsize=7)
    ax1.set_xlim(0.3, x - 0.5)
    ax1.set_ylim(0, top * 1.3)
    ax1.set_ylabel("ms per prefetch (box: quartiles, whiskers: min..max)")
    ax1.set_xlabel(
        "4K: 4 KiB pages or page entries; 2M: 2 MiB pages; PMD: 2 MiB entries", fontsize=8
    )
    ax1.set_title(
        f"This run: {tokens[-1]}-token Engram prefetch (12 tables x 1364 B rows), each import "
        f"side by side\nwith local memory in one process; median and ratio to the local memory "
        f"of the same page size above each box\n{_subtitle(run)}",
        fontsize=9,
    )
    ax1.grid(True, axis="y", alpha=0.3)
    ax2.barh(
        range(len(pubs)),
        [p.value for p in pubs],
        color=PUBLISHED_COLOR,
        hatch="//",
        edgecolor="white",
    )
    ax2.set_yticks(
        range(len(pubs)),
        [
            p.what.replace("Engram prefetch, 128 tokens x 12 tables, ", "").replace(" (", "\n(")
            for p in pubs
        ],
        fontsize=7,
    )
    for i, p in enumerate(pubs):
        ax2.annotate(
            f"{p.value:g} ms",
            (p.value, i),
            va="center",
            xytext=(3, 0),
            textcoords="offset points",
            fontsize=8,
        )
    ax2.set_xlabel("ms per 128-token prefetch")
    ax2.set_xlim(0, max(p.value for p in pubs) * 1.4)
    ax2.set_title(
        "PUBLISHED, DIFFERENT MACHINE:\nreal UB hardware (2 aarch64 nodes;\n"
        "not this run, for scale only)",
        fontsize=9,
        color="#444444",
    )
    ax2.invert_yaxis()
    ax2.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)


def plot_distributions(run: Run, path: Path) -> Path | None:
    """ECDF of each figure against its baseline: the whole distribution, not just the median."""
    picks: list[tuple[str, list[Figure]]] = []
    for test, title in (("load", "single 4 B load"), ("engram", "Engram prefetch")):
        figs = [
            f
            for f in run.figures
            if f.ok and f.params.get("test") == test and f.unit in ("ns", "ms")
        ]
        if figs:
            picks.append((title, figs))
    chase = [f for f in run.figures if f.ok and f.params.get("test") == "chase"]
    if chase:
        largest = max(int(f.params["param"]) for f in chase)
        picks.append(
            (
                f"pointer chase, {size_label(largest)}",
                [f for f in chase if int(f.params["param"]) == largest],
            )
        )
    if not picks:
        return None
    fig, axes = plt.subplots(1, len(picks), figsize=(5 * len(picks), 4.5), squeeze=False)
    for ax, (title, figs) in zip(axes[0], picks):
        for f in sorted(
            figs,
            key=lambda f: (
                SOURCE_ORDER.index(str(f.params.get("source")))
                if f.params.get("source") in SOURCE_ORDER
                else 99
            ),
        ):
            xs = sorted(f.samples)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            src = str(f.params.get("source"))
            ax.step(
                xs,
                ys,
                where="post",
                color=COLORS.get(src),
                label=_title(src) + (" (baseline)" if f.baseline is None else ""),
            )
        lo = min(min(f.samples) for f in figs)
        hi = max(max(f.samples) for f in figs)
        if lo > 0 and hi / lo > 20:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
            ax.set_xlabel(f"{figs[0].unit} (log scale)")
        else:
            ax.set_xlabel(figs[0].unit)
        ax.set_ylabel("fraction of samples <= x")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Latency distributions vs baseline: {_subtitle(run)}", fontsize=10)
    return _save(fig, path)


def plot_testbed(run: Run, path: Path) -> Path | None:
    figs = [f for f in run.figures if f.group == "testbed" and f.ok]
    if not figs:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(figs) + 2))
    ys = range(len(figs))
    # Figures an earlier `make qemu-test` recorded are hatched and say so: not this run.
    recorded = ["not in this run" in f.note for f in figs]
    bars = ax.barh(ys, [f.median or 0.0 for f in figs], color="#9467bd")
    for bar, old in zip(bars, recorded):
        if old:
            bar.set_hatch("//")
            bar.set_facecolor("#c5b0d5")
    for y, f, old in zip(ys, figs, recorded):
        ax.annotate(
            f"{f.median:.3g} {f.unit}"
            + (" (recorded by make qemu-test, not this run)" if old else ""),
            (f.median or 0.0, y),
            va="center",
            xytext=(3, 0),
            textcoords="offset points",
            fontsize=8,
        )
    ax.set_yticks(list(ys), [f.name.removeprefix("testbed.") for f in figs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"{figs[0].unit} (median)")
    ax.set_title(f"Testbed speed\n{_subtitle(run)}")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)


PLOTS = (
    ("control_latency.png", plot_control),
    ("data_latency.png", plot_data_latency),
    ("data_bandwidth.png", plot_bandwidth),
    ("engram.png", plot_engram),
    ("distributions.png", plot_distributions),
    ("testbed.png", plot_testbed),
)


def write_plots(run: Run, outdir: Path) -> list[Path]:
    written = []
    for name, fn in PLOTS:
        out = fn(run, outdir / name)
        if out is not None:
            written.append(out)
    return written
