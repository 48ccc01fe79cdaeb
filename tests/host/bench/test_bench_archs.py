"""bench --archs: a further architecture's figures beside the first's (obmm.bench.archs)."""

from __future__ import annotations

import pytest

from obmm.bench import archs
from obmm.bench.results import Environment, Figure, Run


def _fig(name: str, group: str, median: float, baseline: str | None = None) -> Figure:
    return Figure(name=name, group=group, unit="ns", samples=[median], baseline=baseline)


def test_data_figures_keep_their_own_baselines_and_testbed_ones_compare_with_the_first() -> None:
    first = [
        _fig("data.chase.local.64MiB", "data", 100.0),
        _fig("data.chase.cross-node.64MiB", "data", 300.0, "data.chase.local.64MiB"),
        _fig("testbed.inner_loop", "testbed", 40.0),
    ]
    other = [
        _fig("data.chase.local.64MiB", "data", 150.0),
        _fig("data.chase.cross-node.64MiB", "data", 600.0, "data.chase.local.64MiB"),
        _fig("testbed.inner_loop", "testbed", 60.0),
        _fig("testbed.only_there", "testbed", 1.0),
    ]
    renamed = archs.beside(other, "arm64", [f.name for f in first])
    by_name = {f.name: f for f in renamed}
    # remote against local on the arm64 nodes themselves
    assert by_name["data.chase.cross-node.64MiB.arm64"].baseline == "data.chase.local.64MiB.arm64"
    assert by_name["data.chase.local.64MiB.arm64"].baseline is None
    # the testbed's speed against x86_64's
    assert by_name["testbed.inner_loop.arm64"].baseline == "testbed.inner_loop"
    assert by_name["testbed.only_there.arm64"].baseline is None
    assert other[0].name == "data.chase.local.64MiB"  # the originals are left alone

    run = Run(env=Environment.collect_host())
    run.add(first + renamed)
    assert run.ratio(by_name["testbed.inner_loop.arm64"]) == pytest.approx(1.5)
    assert run.ratio(by_name["data.chase.cross-node.64MiB.arm64"]) == pytest.approx(4.0)
    notes = archs.beside_notes(run, "x86_64", ["arm64", "riscv64"])
    assert notes == [
        "data.chase.cross-node.64MiB by architecture (median): x86_64 300 ns, "
        "arm64 600 ns (x2.00), riscv64 not measured"
    ]
