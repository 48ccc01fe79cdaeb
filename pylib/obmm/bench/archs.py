"""One bench run over several guest architectures (`bench --archs x86_64,arm64`).

The first architecture's figures keep their names.  A further architecture's carry its name as
a suffix (``testbed.boot_to_ssh.fast.2nodes.arm64``): its testbed figures (cold boot, restore,
inner loop) take the first architecture's same figure as their baseline, so the summary's ratio
column reads arm64 / x86_64; its data-path and Engram figures keep their own baselines
(remote against local memory on the same nodes), and :func:`beside_notes` puts each headline
figure beside the first architecture's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from obmm.bench.results import Figure, Run, fmt_value

#: The figures a note puts side by side: the chase over an import and the Engram prefetch.
BESIDE_PREFIXES = ("data.chase.cross-node", "engram.prefetch.cross-node")


def tagged(name: str, arch: str) -> str:
    return f"{name}.{arch}"


def beside(figures: Iterable[Figure], arch: str, reference: Iterable[str]) -> list[Figure]:
    """`figures` of architecture `arch`, renamed after it; a testbed figure's baseline is the
    reference architecture's figure of the same name (when `reference` has it), any other
    figure's its own architecture's renamed baseline."""
    names = set(reference)
    out = []
    for fig in figures:
        if fig.group == "testbed":
            baseline = fig.name if fig.name in names else None
        else:
            baseline = tagged(fig.baseline, arch) if fig.baseline else None
        out.append(dataclasses.replace(fig, name=tagged(fig.name, arch), baseline=baseline))
    return out


def beside_notes(run: Run, first: str, archs: Sequence[str]) -> list[str]:
    """One note per headline data or Engram figure: its median on each architecture."""
    notes = []
    suffixes = tuple(f".{a}" for a in archs)
    for fig in run.figures:
        if not fig.ok or not fig.name.startswith(BESIDE_PREFIXES) or fig.name.endswith(suffixes):
            continue
        others = [(a, run.figure(tagged(fig.name, a))) for a in archs]
        cells = [f"{first} {fmt_value(fig.median, fig.unit)}"]
        for arch, other in others:
            if other is None or not other.ok or other.median is None or not fig.median:
                cells.append(f"{arch} not measured")
            else:
                ratio = other.median / fig.median
                cells.append(f"{arch} {fmt_value(other.median, other.unit)} (x{ratio:.2f})")
        notes.append(f"{fig.name} by architecture (median): " + ", ".join(cells))
    return notes
