"""The benchmark result model: a run is an environment plus figures; each figure keeps every sample.

    run = Run(env=Environment.collect_host(...), figures=[...])

`obmm.bench.report.write_run` writes it out; this module knows nothing of files or plots beyond
`summary_markdown`, so the plots (`obmm.bench.plots`) and the probe can import it freely.

Naming: `<group>.<what>.<source>[.<param>]`, e.g. `data.chase.cross-node.64MiB`; a figure's
`baseline` is the name of the figure it is measured against in the same run (usually the same
measurement on local memory) and its ratio is median / baseline median.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import platform
import socket
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Union

SCHEMA = 1
GROUPS = ("control", "data", "engram", "scheme7", "testbed")
ParamValue = Union[str, int, float, bool]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def size_label(nbytes: int) -> str:
    """2097152 -> '2MiB', 16384 -> '16KiB', 1000 -> '1000B'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}B"


def fmt_value(value: float | None, unit: str = "") -> str:
    """Three significant digits, thousands without exponent: 0.109 ms, 1.23e+06 rows/s."""
    if value is None or math.isnan(value):
        return "-"
    if value == 0:
        text = "0"
    elif abs(value) >= 1e6 or abs(value) < 1e-3:
        text = f"{value:.3g}"
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}".strip()


@dataclass
class Environment:
    """Where a run happened."""

    kernel: str
    accelerator: str  # "kvm", "tcg", "hardware" or "host"
    cpu_model: str
    node_count: int
    git_revision: str
    host: str
    started: str
    finished: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def collect_host(
        cls, *, accelerator: str = "host", node_count: int = 1, repo: Path | None = None
    ) -> Environment:
        """This machine's kernel and CPU, the git revision of `repo` (default: this checkout)."""
        return cls(
            kernel=platform.release(),
            accelerator=accelerator,
            cpu_model=cpu_model(),
            node_count=node_count,
            git_revision=git_revision(repo),
            host=socket.gethostname(),
            started=now_iso(),
            extra={"machine": platform.machine(), "python": platform.python_version()},
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Environment:
        return cls(
            kernel=str(d["kernel"]),
            accelerator=str(d["accelerator"]),
            cpu_model=str(d["cpu_model"]),
            node_count=int(d["node_count"]),
            git_revision=str(d["git_revision"]),
            host=str(d["host"]),
            started=str(d["started"]),
            finished=str(d.get("finished", "")),
            extra={str(k): str(v) for k, v in d.get("extra", {}).items()},
        )


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def cpu_model_from_cpuinfo(text: str) -> str:
    """'model name' (x86) or the implementer/part pair (arm64) of a /proc/cpuinfo text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    for key in ("model name", "Model", "cpu model", "Processor"):
        if fields.get(key):
            return fields[key]
    if "CPU implementer" in fields:
        return f"implementer {fields['CPU implementer']} part {fields.get('CPU part', '?')}"
    return "unknown"


def cpu_model() -> str:
    try:
        return cpu_model_from_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return platform.processor() or "unknown"


def git_revision(repo: Path | None = None) -> str:
    """`git describe`-like revision of `repo`, '+dirty' when the tree has changes."""
    cwd = repo if repo is not None else Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


@dataclass
class Figure:
    """One measured quantity: every sample, and the figure of the same run it is compared with."""

    name: str
    group: str
    unit: str
    samples: list[float] = field(default_factory=list)
    baseline: str | None = None
    higher_is_better: bool = False
    params: dict[str, ParamValue] = field(default_factory=dict)
    note: str = ""
    skipped: str | None = None  # why there are no samples

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"figure {self.name}: group {self.group!r} is not one of {GROUPS}")

    @property
    def ok(self) -> bool:
        return self.skipped is None and bool(self.samples)

    @property
    def median(self) -> float | None:
        return percentile(self.samples, 50) if self.samples else None

    @property
    def p99(self) -> float | None:
        return percentile(self.samples, 99) if self.samples else None

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None

    @property
    def minimum(self) -> float | None:
        return min(self.samples) if self.samples else None

    @property
    def maximum(self) -> float | None:
        return max(self.samples) if self.samples else None

    def stats(self) -> dict[str, float | int | None]:
        return {
            "n": len(self.samples),
            "median": self.median,
            "p99": self.p99,
            "mean": self.mean,
            "min": self.minimum,
            "max": self.maximum,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "unit": self.unit,
            "baseline": self.baseline,
            "higher_is_better": self.higher_is_better,
            "params": dict(self.params),
            "note": self.note,
            "skipped": self.skipped,
            "stats": self.stats(),
            "samples": list(self.samples),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Figure:
        return cls(
            name=str(d["name"]),
            group=str(d["group"]),
            unit=str(d["unit"]),
            samples=[float(x) for x in d.get("samples", [])],
            baseline=None if d.get("baseline") is None else str(d["baseline"]),
            higher_is_better=bool(d.get("higher_is_better", False)),
            params=dict(d.get("params", {})),
            note=str(d.get("note", "")),
            skipped=None if d.get("skipped") is None else str(d["skipped"]),
        )


def skipped_figure(name: str, group: str, unit: str, reason: str, **kw: Any) -> Figure:
    """A figure that was not measured, with the reason recorded (never silently absent)."""
    return Figure(name=name, group=group, unit=unit, skipped=reason, **kw)


@dataclass(frozen=True)
class Published:
    """A figure measured on real UB hardware by someone else: printed beside ours, never mixed."""

    what: str
    value: float
    unit: str
    source: str
    machine: str
    compare_with: str = ""  # what of ours it lines up with (free text, for the reader)


_SMOKE = "YChange01/sglang benchmark/engram/ubsmem_smoke/RESULTS.md@51e3a1c"
_AIDOC = "YChange01/sglang benchmark/engram/doc/ai_assisted_engram_benchmark.md"
_SCHEME7 = "YChange01/sglang scheme7_obmm README v3 (scheme 5 reference values)"
_UB2 = "2 aarch64 nodes, real UB, device udma2"

PUBLISHED: tuple[Published, ...] = (
    Published(
        "Engram prefetch, 128 tokens x 12 tables, URMA read (scheme 5 urma_read)",
        0.14,
        "ms",
        _SCHEME7,
        _UB2,
        "engram.prefetch.cross-node.128tok",
    ),
    Published(
        "Engram prefetch, 128 tokens x 12 tables, local DRAM",
        0.109,
        "ms",
        _SMOKE,
        _UB2,
        "engram.prefetch.local.128tok",
    ),
    Published(
        "Engram prefetch, 128 tokens x 12 tables, UBS-MEM cacheable load/store",
        0.111,
        "ms",
        _SMOKE,
        _UB2,
        "engram.prefetch.cross-node.128tok",
    ),
    Published(
        "Engram prefetch, 128 tokens x 12 tables, URMA read (ubsmem_smoke run)",
        0.117,
        "ms",
        _SMOKE,
        _UB2,
        "engram.prefetch.cross-node.128tok",
    ),
    Published("single 4 B load, local DRAM", 36.3, "ns", _SMOKE, _UB2, "data.load.local"),
    Published(
        "single 4 B load, cross-node UBS-MEM cacheable",
        42.8,
        "ns",
        _SMOKE,
        _UB2,
        "data.load.cross-node",
    ),
    Published("one 1364 B row, local DRAM", 0.168, "us", _SMOKE, _UB2, ""),
    Published("one 1364 B row, cross-node UBS-MEM cacheable", 0.163, "us", _SMOKE, _UB2, ""),
    Published("one 1364 B row, URMA read", 2.104, "us", _SMOKE, _UB2, ""),
    Published("batch of 256 rows, local DRAM", 21.1, "GB/s", _SMOKE, _UB2, "data.read.local"),
    Published(
        "batch of 256 rows, UBS-MEM cacheable", 20.5, "GB/s", _SMOKE, _UB2, "data.read.cross-node"
    ),
    Published("batch of 256 rows, URMA read", 15.4, "GB/s", _SMOKE, _UB2, ""),
    Published(
        "one 320 B read, UBS-MEM non-cacheable (O_SYNC)",
        1.429,
        "us",
        _AIDOC,
        _UB2,
        "data.load.cross-node-sync",
    ),
    Published(
        "one 320 B read, UBS-MEM non-cacheable, steady state",
        243,
        "MB/s",
        _AIDOC,
        _UB2,
        "data.read.cross-node-sync",
    ),
)

PUBLISHED_LABEL = "Published hardware figures (different machine: real UB hardware, not this run)"

CAVEAT = """\
What these numbers mean: every figure was measured in this run, side by side with its baseline
(the same measurement on local memory, or the cheapest local operation of the same size), and
the ratio is median / baseline median.  On the QEMU testbed an imported region is the exporter's
guest RAM file mapped into the importer through an emulated decoder window: loads and stores are
plain memory accesses.  The data-path and Engram figures therefore measure the guest's memory
under the accelerator (TCG or KVM) on this host, not UB latency; a remote/local ratio near 1 is
what the emulator should show, and a large ratio points at the emulation path (mapping type,
faults, TCG), not at the fabric.  Control-path figures measure the emulated driver and Python,
not the real obmm.ko.  Only the hardware stage, on real UB hosts, measures UB.  The published
figures below come from a different machine and are printed for scale only."""


@dataclass
class Run:
    """One benchmark run: its environment and every figure."""

    env: Environment
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what makes figures of the run doubtful

    def figure(self, name: str) -> Figure | None:
        for fig in self.figures:
            if fig.name == name:
                return fig
        return None

    def add(self, figures: Iterable[Figure]) -> None:
        seen = {f.name for f in self.figures}
        for fig in figures:
            if fig.name in seen:
                raise ValueError(f"figure {fig.name} is already in the run")
            seen.add(fig.name)
            self.figures.append(fig)

    def baseline_of(self, fig: Figure) -> Figure | None:
        return self.figure(fig.baseline) if fig.baseline else None

    def ratio(self, fig: Figure) -> float | None:
        """median / baseline median, or None when either is missing or the baseline is 0."""
        base = self.baseline_of(fig)
        if base is None or fig.median is None or base.median is None or base.median == 0:
            return None
        return fig.median / base.median

    def paired_ratios(self, fig: Figure) -> list[float] | None:
        """sample k / baseline sample k, for a figure measured interleaved with its baseline
        (the same round of one process: params["interleaved"] on both); else None."""
        base = self.baseline_of(fig)
        if (
            base is None
            or not fig.params.get("interleaved")
            or not base.params.get("interleaved")
            or not fig.samples
            or len(fig.samples) != len(base.samples)
            or any(b <= 0 for b in base.samples)
        ):
            return None
        return [a / b for a, b in zip(fig.samples, base.samples)]

    def paired_ratio_stats(self, fig: Figure) -> dict[str, float] | None:
        """min, median and max of `paired_ratios`."""
        ratios = self.paired_ratios(fig)
        if not ratios:
            return None
        return {"min": min(ratios), "median": percentile(ratios, 50), "max": max(ratios)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "environment": self.env.to_dict(),
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "figures": [
                dict(
                    f.to_dict(),
                    ratio_to_baseline=self.ratio(f),
                    paired_ratio=self.paired_ratio_stats(f),
                )
                for f in self.figures
            ],
            "published_hardware_figures": [
                {
                    "what": p.what,
                    "value": p.value,
                    "unit": p.unit,
                    "source": p.source,
                    "machine": p.machine,
                    "label": "different machine",
                }
                for p in PUBLISHED
            ],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Run:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"results schema {d.get('schema')!r}; this code reads {SCHEMA}")
        return cls(
            env=Environment.from_dict(d["environment"]),
            figures=[Figure.from_dict(f) for f in d["figures"]],
            notes=[str(n) for n in d.get("notes", [])],
            warnings=[str(w) for w in d.get("warnings", [])],
        )

    @classmethod
    def load(cls, path: Path) -> Run:
        """From a results.json, or a folder holding one."""
        if path.is_dir():
            path = path / "results.json"
        doc: dict[str, Any] = json.loads(path.read_text())
        return cls.from_dict(doc)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def _spread(fig: Figure) -> str:
    """min / median / max of a figure, in its unit."""
    return " / ".join(fmt_value(v, fig.unit) for v in (fig.minimum, fig.median, fig.maximum))


def _ratio_spread(stats: dict[str, float] | None) -> str:
    """min / median / max of paired ratios."""
    if stats is None:
        return "-"
    return " / ".join(_ratio_text(stats[k]) for k in ("min", "median", "max"))


ENGRAM_LIMIT = 1.05  # an Engram prefetch from an import within this of its local baseline
HOST_PAGES_KEY = "host_ram_pmd_mapped"  # env.extra: how the host maps the nodes' memory
ENGRAM_METHOD = """\
Each row's figure and its baseline were measured by one memprobe process on the importer that
mapped the import (4 KiB entries, and a second import with PMD entries) and local anonymous
memory with 4 KiB and with 2 MiB pages, each at a 2 MiB-aligned address and filled by that
process, and copied the same random rows (128 tokens x 12 tables x 1364 B) from each into the
same buffer in turn, rotating which went first; a sample is the fastest of the prefetches of
one round (so a prefetch the vCPU was descheduled in does not decide it).  The import with
4 KiB entries is compared with 4 KiB local memory, the PMD mapping with 2 MiB local memory,
O_SYNC runs with the local memory of their own process.  ratio: median / baseline median;
per round: sample k / baseline sample k (min / median / max); small tables: the ratio of the
same prefetch from the first rows of each table only (a few pages, which stay in the TLBs and
caches), measured in the same process."""


def _engram(run: Run, source: str, tokens: int = 128) -> Figure | None:
    fig = run.figure(f"engram.prefetch.{source}.{tokens}tok")
    return fig if fig is not None and fig.ok else None


def engram_findings(run: Run) -> list[str]:
    """What the run's own figures say about where an Engram ratio comes from, as bullets."""
    out = []
    kinds = [k for k in ("loopback", "cross-node") if _engram(run, k)]
    page = [
        (k, run.ratio(f))
        for k in kinds + [f"{k}-sync" for k in kinds]
        if (f := _engram(run, f"{k}-local-thp")) is not None and run.ratio(f) is not None
    ]
    if page:
        out.append(
            "- Page size: local memory with 2 MiB pages against 4 KiB pages, same process: "
            + ", ".join(f"x{r:.2f} (beside {k})" for k, r in page)
            + ": the page size alone moves an Engram figure by that much, so each mapping is "
            "compared with local memory of its own page size."
        )
    sync = []
    for k in kinds:
        cached, nc = _engram(run, k), _engram(run, f"{k}-sync")
        if cached is not None and nc is not None:
            a, b = run.ratio(cached), run.ratio(nc)
            if a is not None and b is not None:
                sync.append(f"{k} x{a:.2f} cacheable, x{b:.2f} O_SYNC")
    if sync:
        out.append(
            "- O_SYNC: ratio to local memory " + "; ".join(sync) + ".  TCG does not model "
            "memory types, so an O_SYNC (write-combining) mapping loads at cacheable speed "
            "here; on UB hardware an uncached 320 B read takes 1.43 us (published, UBS-MEM "
            "non-cacheable): this figure says nothing of that cost."
        )
    return out


def _over_limit(run: Run, fig: Figure, small_ratio: float | None) -> str:
    """Why a variant is above the limit, as far as the run's own figures say."""
    ratio = run.ratio(fig) or 0.0
    faults = int(fig.params.get("faults", -1))
    head = f"- {fig.name}: x{ratio:.2f}"
    if small_ratio is None:
        return f"{head}; this run has no small-table figure to tell where the time goes."
    said = f"{head} from the whole tables, x{small_ratio:.2f} from small tables (same process)"
    said += f", {faults} page faults while timed" if faults >= 0 else ""
    paired = run.paired_ratio_stats(fig)
    if paired is not None and paired["median"] <= ENGRAM_LIMIT:
        # Round k's samples of both sides were taken back to back; their medians were not.
        said += (
            f"; round by round the median ratio is x{paired['median']:.2f}, within the limit: "
            "the two medians moved apart with what else the host ran, not prefetch by prefetch"
        )
    if small_ratio <= ENGRAM_LIMIT and faults <= 0:
        return (
            f"{said}: the extra time comes with the pages a prefetch touches, not with the rows "
            "it copies, and no fault put the emulated driver on the path: it is spent below "
            "the guest, reaching memory that is not in the TLBs and caches (QEMU's software "
            "TLB under TCG, the host's TLB and caches, which back local memory and the "
            "windows alike: see the notes for the host's page size)."
        )
    return f"{said}: not explained by this run's figures."


def engram_section(run: Run) -> list[str]:
    """The interleaved Engram figures of a run: every variant against its local baseline."""
    figs = [
        f
        for f in run.figures
        if f.ok and f.name.startswith("engram.prefetch.") and f.params.get("interleaved")
    ]
    if not figs:
        return []
    lines = [
        "## Engram prefetch, side by side with local memory",
        "",
        ENGRAM_METHOD,
        "",
        "| prefetch from | min / median / max | baseline (same process) | min / median / max "
        f"| ratio | per round min / median / max | small tables | within x{ENGRAM_LIMIT:.2f} |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    over: list[tuple[Figure, float | None, Figure | None]] = []
    for fig in figs:
        base = run.baseline_of(fig)
        if base is None:
            continue
        ratio = run.ratio(fig)
        source = str(fig.params.get("source"))
        small = run.figure(fig.name.replace("engram.prefetch.", "engram.small_tables.", 1))
        small_ratio = run.ratio(small) if small is not None else None
        if source.endswith(("-local", "-local-thp")):
            verdict = "(page size)"
        elif ratio is not None and ratio <= ENGRAM_LIMIT:
            verdict = "yes"
        else:
            verdict = "**no**"
            over.append((fig, small_ratio, small))
        cells = (
            _md_escape(fig.name),
            _spread(fig),
            _md_escape(base.name),
            _spread(base),
            _ratio_text(ratio),
            _ratio_spread(run.paired_ratio_stats(fig)),
            _ratio_text(small_ratio),
            verdict,
        )
        lines.append("| " + " | ".join(cells) + " |")
    limit = f"x{ENGRAM_LIMIT:.2f}"
    verdict_line = (
        f"Above {limit} in this run: {', '.join(f.name for f, _r, _s in over)}."
        if over
        else f"Every import variant within {limit} of its local baseline in this run."
    )
    lines += ["", verdict_line, ""]
    lines += [_over_limit(run, fig, small_ratio) for fig, small_ratio, _s in over]
    lines += ["", *engram_findings(run), ""]
    return lines


def summary_markdown(run: Run, *, plots: Sequence[str] = ()) -> str:
    env = run.env
    lines = [
        "# obmm-testbed benchmark summary",
        "",
        f"- started {env.started}, finished {env.finished or '-'}",
        f"- accelerator **{env.accelerator}**, {env.node_count} node(s), kernel {env.kernel}",
        f"- CPU {env.cpu_model}; host {env.host}; git {env.git_revision}",
        "",
        CAVEAT,
        "",
    ]
    headline = [
        f
        for f in run.figures
        if f.ok
        and f.group in ("data", "engram")
        and "cross-node" in str(f.params.get("source"))
        and not str(f.params.get("source")).endswith(("-local", "-local-thp"))
    ]
    if run.warnings:
        lines += ["## Warnings", ""] + [f"- **{w}**" for w in run.warnings] + [""]
    if headline:
        lines += ["## Headline: remote / local", ""]
        for fig in headline:
            ratio = run.ratio(fig)
            base = run.baseline_of(fig)
            if ratio is not None and base is not None:
                lines.append(
                    f"- {fig.name}: {fmt_value(fig.median, fig.unit)} vs "
                    f"{fmt_value(base.median, base.unit)} ({base.name}) = **x{ratio:.2f}**"
                )
        lines.append("")
    lines += engram_section(run)
    lines += [
        "## This run",
        "",
        "| figure | min | median | max | p99 | n | baseline | baseline min / median / max "
        "| ratio | ratio per round min / median / max |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for fig in run.figures:
        if not fig.ok:
            continue
        base = run.baseline_of(fig)
        ratio = run.ratio(fig)
        base_stats = (
            " / ".join(fmt_value(v, fig.unit) for v in (base.minimum, base.median, base.maximum))
            if base
            else "-"
        )
        lines.append(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                _md_escape(fig.name),
                fmt_value(fig.minimum, fig.unit),
                fmt_value(fig.median, fig.unit),
                fmt_value(fig.maximum, fig.unit),
                fmt_value(fig.p99, fig.unit),
                len(fig.samples),
                _md_escape(fig.baseline or "-"),
                base_stats,
                _ratio_text(ratio),
                _ratio_spread(run.paired_ratio_stats(fig)),
            )
        )
    skipped = [f for f in run.figures if not f.ok]
    if skipped:
        lines += ["", "Not measured in this run:", ""]
        for fig in skipped:
            lines.append(f"- {fig.name}: {fig.skipped or 'no samples'}")
    if run.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in run.notes]
    lines += [
        "",
        f"## {PUBLISHED_LABEL}",
        "",
        "Measured by others on real UB hardware (two aarch64 nodes); **not comparable "
        "as numbers** with the emulator figures above: a different machine, CPU and memory.",
        "",
        "| figure (real UB hardware, different machine) | value | machine | source |",
        "|---|---:|---|---|",
    ]
    for pub in PUBLISHED:
        lines.append(
            f"| {_md_escape(pub.what)} | {fmt_value(pub.value, pub.unit)} | {pub.machine} "
            f"| {_md_escape(pub.source)} |"
        )
    lines += [
        "",
        "Import / export / unimport ioctl latencies have not been published for real UB "
        "hardware by any source this project found.",
    ]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def timestamp_dirname(when: dt.datetime | None = None) -> str:
    when = when or dt.datetime.now(dt.timezone.utc)
    return when.strftime("%Y%m%dT%H%M%SZ")
