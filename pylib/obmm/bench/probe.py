"""memprobe.c: where its source is, how to build and run it, and its output turned into figures.

memprobe prints one JSON object per line (see the comment at the top of memprobe.c); this
module parses that and names the figures `data.<test>.<source>[.<size>]` and
`engram.{prefetch,rows_per_s}.<source>.<tokens>tok`, each paired with the same figure of the
baseline source (normally `local`).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from obmm.bench.results import Figure, size_label

SOURCE_NAME = "memprobe.c"
CFLAGS = ("-O2", "-std=gnu11", "-Wall", "-Wextra")
ENGRAM_TABLES = 12
ENGRAM_ROW_BYTES = 1364

# What each memory source is, for plots and the summary.
SOURCE_TITLES = {
    "local": "local memory",
    "file": "shared file (host stand-in)",
    "loopback": "loopback import",
    "loopback-sync": "loopback import, O_SYNC",
    "cross-node": "cross-node import",
    "cross-node-sync": "cross-node import, O_SYNC",
}

# Interleaved runs (memprobe --interleave): a mapping and, in the same process, the local
# memory it is compared with, named after it.
LOCAL_SUFFIX = "-local"  # anonymous memory, 4 KiB pages: the page-granule mapping's baseline
LOCAL_THP_SUFFIX = "-local-thp"  # anonymous memory, 2 MiB pages: the PMD mapping's baseline
PMD_SUFFIX = "-pmd"  # the same kind of import mapped with the PMD flag (huge entries)
INTERLEAVED_TESTS = "engram,load,chase"


def interleaved_sources(name: str, *, pmd: bool = True) -> dict[str, str | None]:
    """The sources of one interleaved run of mapping `name`, each with its baseline: the page
    mapping against 4 KiB local memory, the PMD mapping (`pmd`) against 2 MiB local memory,
    and the 2 MiB local memory against the 4 KiB (what the page size alone costs)."""
    local, thp = f"{name}{LOCAL_SUFFIX}", f"{name}{LOCAL_THP_SUFFIX}"
    sources: dict[str, str | None] = {local: None, thp: local, name: local}
    if pmd:
        sources[f"{name}{PMD_SUFFIX}"] = thp
    return sources


def kind_of(source: str) -> str:
    """The mapping an interleaved source was measured beside ("cross-node-local-thp" ->
    "cross-node"); a source of no interleaved run is its own kind."""
    for suffix in (LOCAL_THP_SUFFIX, LOCAL_SUFFIX, PMD_SUFFIX):
        if source.endswith(suffix):
            return source[: -len(suffix)]
    return source


def source_title(source: str) -> str:
    """What a source is, interleaved ones included ("cross-node import, PMD mapping")."""
    for suffix, what in (
        (LOCAL_THP_SUFFIX, "local memory, 2 MiB pages, beside"),
        (LOCAL_SUFFIX, "local memory, 4 KiB pages, beside"),
    ):
        if source.endswith(suffix):
            base = source[: -len(suffix)]
            return f"{what} {SOURCE_TITLES.get(base, base)}"
    if source.endswith(PMD_SUFFIX):
        base = source[: -len(PMD_SUFFIX)]
        return f"{SOURCE_TITLES.get(base, base)}, PMD mapping"
    return SOURCE_TITLES.get(source, source)


def source_text() -> str:
    return resources.files("obmm.bench").joinpath(SOURCE_NAME).read_text()


def compile_argv(src: str, out: str, *, cc: str = "gcc", werror: bool = False) -> list[str]:
    return [cc, *CFLAGS, *(["-Werror"] if werror else []), "-o", out, src]


def compile_local(outdir: Path, *, cc: str = "gcc", werror: bool = True) -> Path:
    """Build memprobe on this machine into `outdir`; raises RuntimeError with gcc's output."""
    outdir.mkdir(parents=True, exist_ok=True)
    src = outdir / SOURCE_NAME
    src.write_text(source_text())
    binary = outdir / "memprobe"
    proc = subprocess.run(
        compile_argv(str(src), str(binary), cc=cc, werror=werror),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {SOURCE_NAME} failed:\n{proc.stderr}")
    return binary


@dataclass
class ProbeSettings:
    """memprobe options shared by every source of one run (so figures pair up)."""

    chase_sizes: tuple[int, ...] = (16 << 10, 256 << 10, 4 << 20, 64 << 20)
    chase_loads: int = 1 << 20
    samples: int = 10
    load_samples: int = 1000
    engram_rows: int = 10000
    engram_tokens: tuple[int, ...] = (128,)
    engram_iters: int = 100
    bw_size: int = 64 << 20
    max_seconds: float = 30.0
    seed: int = 1
    # Interleaved runs (an import beside local memory): many short samples, so that every
    # source sees the same conditions and a median is not moved by a few disturbed ones.
    interleave_samples: int = 32  # a multiple of the 4 sources: each leads a round as often
    interleave_chase_loads: int = 1 << 14
    interleave_best_of: int = 10  # a chase sample is the fastest of this many timed runs
    interleave_engram_iters: int = 64  # prefetch rounds; a multiple of 4: each source leads
    # the same prefetch from the first rows of each table only (a few pages: 1.6 MB)
    interleave_engram_small_rows: int = 100

    @classmethod
    def quick(cls) -> ProbeSettings:
        """A few seconds per source: smoke runs and tests."""
        return cls(
            chase_sizes=(16 << 10, 1 << 20, 16 << 20),
            chase_loads=1 << 17,
            samples=5,
            load_samples=200,
            engram_rows=2000,
            engram_iters=30,
            bw_size=16 << 20,
            max_seconds=8.0,
            interleave_samples=20,
            interleave_chase_loads=1 << 13,
            interleave_engram_iters=40,
        )

    def args(self) -> list[str]:
        return [
            "--chase-sizes",
            ",".join(str(s) for s in self.chase_sizes),
            "--chase-loads",
            str(self.chase_loads),
            "--samples",
            str(self.samples),
            "--load-samples",
            str(self.load_samples),
            "--engram-rows",
            str(self.engram_rows),
            "--engram-tokens",
            ",".join(str(t) for t in self.engram_tokens),
            "--engram-iters",
            str(self.engram_iters),
            "--bw-size",
            str(self.bw_size),
            "--max-seconds",
            f"{self.max_seconds:g}",
            "--seed",
            str(self.seed),
        ]

    def interleave_args(self) -> list[str]:
        """args() with the interleaved runs' sample counts and four times the time budget."""
        args = self.args()
        for opt, value in (
            ("--samples", self.interleave_samples),
            ("--chase-loads", self.interleave_chase_loads),
            ("--engram-iters", self.interleave_engram_iters),
            ("--max-seconds", f"{4 * self.max_seconds:g}"),
        ):
            args[args.index(opt) + 1] = str(value)
        return [
            *args,
            "--best-of",
            str(self.interleave_best_of),
            "--engram-small-rows",
            str(self.interleave_engram_small_rows),
        ]

    def engram_bytes(self) -> int:
        """Bytes of the Engram tables at full size."""
        return self.engram_rows * ENGRAM_TABLES * ENGRAM_ROW_BYTES

    def region_bytes(self) -> int:
        """Bytes a source needs for every test at full size (Engram tables or the largest set)."""
        return max(self.engram_bytes(), self.bw_size, *self.chase_sizes)

    def interleave_bytes(self) -> int:
        """Bytes each source of an interleaved run needs (Engram tables or the largest set)."""
        return max(self.engram_bytes(), *self.chase_sizes)


@dataclass
class ProbeOutput:
    """memprobe's output lines, sorted by kind."""

    env: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    samples: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    skips: list[dict[str, Any]] = field(default_factory=list)
    truncated: list[dict[str, Any]] = field(default_factory=list)
    verify: dict[str, Any] | None = None
    done: dict[str, Any] | None = None

    def values(self, test: str, param: int) -> list[float]:
        return [float(s["value"]) for s in self.samples.get((test, param), [])]

    def by_source(self) -> dict[str, ProbeOutput]:
        """An interleaved run's output, one ProbeOutput per source label (in first-seen order)."""
        outs: dict[str, ProbeOutput] = {}

        def of(obj: dict[str, Any]) -> ProbeOutput:
            label = str(obj.get("source", ""))
            if label not in outs:
                outs[label] = ProbeOutput(env=self.env, info=self.info, done=self.done)
            return outs[label]

        for rows in self.samples.values():
            for row in rows:
                of(row).samples.setdefault((str(row["test"]), int(row["param"])), []).append(row)
        for skip in self.skips:
            of(skip).skips.append(skip)
        for cut in self.truncated:
            of(cut).truncated.append(cut)
        return outs


def parse_output(text: str) -> ProbeOutput:
    """Parse memprobe's stdout; raises ValueError on a line that is not one of its objects."""
    out = ProbeOutput()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            kind = obj["kind"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"memprobe output line {lineno} is not JSON: {line[:120]!r}") from exc
        if kind == "sample":
            out.samples.setdefault((str(obj["test"]), int(obj["param"])), []).append(obj)
        elif kind == "env":
            out.env = obj
        elif kind == "info":
            out.info.update(obj)
        elif kind == "skip":
            out.skips.append(obj)
        elif kind == "truncated":
            out.truncated.append(obj)
        elif kind == "verify":
            out.verify = obj
        elif kind == "done":
            out.done = obj
        else:
            raise ValueError(f"memprobe output line {lineno}: unknown kind {kind!r}")
    return out


def _name(test: str, source: str, param: int | None = None) -> str:
    if test == "chase" and param is not None:
        return f"data.chase.{source}.{size_label(param)}"
    return f"data.{test}.{source}"


def _engram_names(source: str, tokens: int) -> tuple[str, str]:
    return (f"engram.prefetch.{source}.{tokens}tok", f"engram.rows_per_s.{source}.{tokens}tok")


def small_tables_name(source: str, tokens: int) -> str:
    """The interleaved Engram prefetch from the first few rows of each table (memprobe's
    engram-small test): the same copies, but from pages that stay in the TLBs and caches."""
    return f"engram.small_tables.{source}.{tokens}tok"


def figures_from_probe(
    out: ProbeOutput,
    source: str,
    *,
    baseline_source: str | None = "local",
    interleaved: bool = False,
) -> list[Figure]:
    """Figures of one memprobe run on `source`, each paired with `baseline_source`'s.

    `interleaved`: the output is one source of a `memprobe --interleave` run, so sample k of
    a figure and of its baseline were taken in the same round (params["interleaved"]).
    """
    base = None if baseline_source in (None, source) else baseline_source
    sync = bool(out.env.get("sync", False))
    truncated = {(str(t["test"]), int(t["param"])): t for t in out.truncated}
    figs: list[Figure] = []

    def params(test: str, param: int) -> dict[str, str | int | float | bool]:
        p: dict[str, str | int | float | bool] = {
            "test": test,
            "source": source,
            "param": param,
            "sync": sync,
        }
        if interleaved:
            p["interleaved"] = True
        return p

    def faults(test: str) -> int:
        """Page faults memprobe took while timing `test` (-1: not reported)."""
        return int(out.info.get(f"{test}_faults", -1))

    def note(test: str, param: int, extra: str = "") -> str:
        t = truncated.get((test, param))
        cut = f"stopped at {t['samples']} of {t['wanted']} samples (time budget)" if t else ""
        return "; ".join(x for x in (extra, cut) if x)

    for (test, param), rows in sorted(out.samples.items()):
        values = [float(r["value"]) for r in rows]
        if test == "chase":
            figs.append(
                Figure(
                    name=_name(test, source, param),
                    group="data",
                    unit="ns",
                    samples=values,
                    baseline=_name(test, base, param) if base else None,
                    params=params(test, param),
                    note=note(test, param, f"dependent loads, {size_label(param)} working set"),
                )
            )
        elif test in ("read", "write"):
            figs.append(
                Figure(
                    name=_name(test, source),
                    group="data",
                    unit="GB/s",
                    samples=values,
                    baseline=_name(test, base) if base else None,
                    higher_is_better=True,
                    params=params(test, param),
                    note=note(test, param, f"sequential {test}, {size_label(param)} per pass"),
                )
            )
        elif test == "load":
            overhead = float(out.env.get("clock_overhead_ns", 0.0))
            figs.append(
                Figure(
                    name=_name(test, source),
                    group="data",
                    unit="ns",
                    samples=[max(v - overhead, 0.0) for v in values],
                    baseline=_name(test, base) if base else None,
                    params=params(test, param),
                    note=note(
                        test,
                        param,
                        f"one 4 B load at a random line, minus the "
                        f"{overhead:g} ns clock_gettime pair",
                    ),
                )
            )
        elif test == "clock":
            if base is None:  # the timer is a property of the node, not of the source
                figs.append(
                    Figure(
                        name="data.clock_gettime",
                        group="data",
                        unit="ns",
                        samples=values,
                        params=params(test, param),
                        note="two back-to-back CLOCK_MONOTONIC reads",
                    )
                )
        elif test == "engram-small":
            rows_note = f"the first {out.env.get('engram_small_rows', '?')} rows of each table"
            figs.append(
                Figure(
                    name=small_tables_name(source, param),
                    group="engram",
                    unit="ms",
                    samples=values,
                    baseline=small_tables_name(base, param) if base else None,
                    params={**params(test, param), "faults": faults(test)},
                    note=note(
                        test,
                        param,
                        f"{param} tokens x {ENGRAM_TABLES} random {ENGRAM_ROW_BYTES} B rows "
                        f"from {rows_note}, interleaved like engram.prefetch",
                    ),
                )
            )
        elif test == "engram":
            prefetch, rate = _engram_names(source, param)
            bprefetch, brate = _engram_names(base, param) if base else (None, None)
            rows_note = f"{out.info.get('engram_rows', '?')} rows x {ENGRAM_TABLES} tables"
            if interleaved:
                best = out.env.get("best_of", 1)
                rows_note += (
                    f"; interleaved with its local baselines, a sample is the fastest of "
                    f"{best} prefetches"
                )
            figs.append(
                Figure(
                    name=prefetch,
                    group="engram",
                    unit="ms",
                    samples=values,
                    baseline=bprefetch,
                    params={**params(test, param), "faults": faults(test)},
                    note=note(
                        test,
                        param,
                        f"{param} tokens x {ENGRAM_TABLES} random "
                        f"{ENGRAM_ROW_BYTES} B rows memcpy'd; {rows_note}",
                    ),
                )
            )
            figs.append(
                Figure(
                    name=rate,
                    group="engram",
                    unit="rows/s",
                    higher_is_better=True,
                    samples=[float(r["rows_per_s"]) for r in rows],
                    baseline=brate,
                    params=params(test, param),
                    note=rows_note,
                )
            )
    for skip in out.skips:
        test, param, reason = str(skip["test"]), int(skip["param"]), str(skip["reason"])
        if test == "engram-small":
            figs.append(
                Figure(
                    name=small_tables_name(source, param),
                    group="engram",
                    unit="ms",
                    skipped=reason,
                    params=params(test, param),
                )
            )
        elif test == "engram":
            for name in _engram_names(source, param) if param else (f"engram.{source}",):
                figs.append(
                    Figure(
                        name=name,
                        group="engram",
                        unit="ms",
                        skipped=reason,
                        params=params(test, param),
                    )
                )
        else:
            figs.append(
                Figure(
                    name=_name(test, source, param),
                    group="data",
                    unit="ns",
                    skipped=reason,
                    params=params(test, param),
                )
            )
    return figs


def probe_failure_figures(source: str, reason: str) -> list[Figure]:
    """One skipped figure standing for a whole source that could not be measured."""
    return [
        Figure(
            name=f"data.{source}",
            group="data",
            unit="-",
            skipped=reason,
            params={"source": source},
        )
    ]
