"""A run written to disk: results.json, summary.md and the PNG plots, in one folder.

    outdir = write_run(run, Path("bench-results"))   # bench-results/<timestamp>/

writes `results.json` (every sample, the environment), `summary.md` (one table of figure,
value, baseline, ratio; then the published real-hardware figures, clearly separated) and PNG
plots (`obmm.bench.plots`, matplotlib, only imported when plots are asked for).  Kept apart from
`obmm.bench.results` so the model does not import the plots that import it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from obmm.bench.results import Run, now_iso, summary_markdown, timestamp_dirname


def write_run(run: Run, root: Path, *, name: str | None = None, plots: bool = True) -> Path:
    """Write results.json, summary.md and (with `plots`) the PNGs to root/<name or timestamp>/."""
    outdir = root / (name or timestamp_dirname())
    outdir.mkdir(parents=True, exist_ok=True)
    if not run.env.finished:
        run.env.finished = now_iso()
    plot_names: list[str] = []
    if plots:
        # deferred: matplotlib is an optional dependency (the `bench` extra)
        from obmm.bench import plots as plots_mod

        plot_names = [p.name for p in plots_mod.write_plots(run, outdir)]
    tmp = outdir / "results.json.tmp"
    tmp.write_text(json.dumps(run.to_dict(), indent=1) + "\n")
    os.replace(tmp, outdir / "results.json")
    (outdir / "summary.md").write_text(summary_markdown(run, plots=plot_names))
    return outdir
