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


def test_each_architecture_gets_its_own_image_and_the_accelerator_for_its_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from obmm.bench import cluster_hook
    from obmm.testbed.builds import kernels
    from obmm.testbed.settings import Settings
    from obmm.testbed.vm import accel

    built: list[str] = []

    def guest_image(recipe: object, *, progress: object, kernel: object, arch: str) -> object:
        built.append(arch)
        return SimpleNamespace(kernel=f"vmlinuz-{arch}")

    monkeypatch.setattr(kernels, "guest_image", guest_image)
    monkeypatch.setattr(
        accel, "choose", lambda wanted, kernel, cache, qemu: "kvm" if "x86" in kernel else "tcg"
    )
    base = Settings.from_env()
    ready = [
        cluster_hook.arch_ready(base.replace(arch=a), object(), object())  # type: ignore[arg-type]
        for a in ("x86_64", "arm64")
    ]
    assert built == ["x86_64", "arm64"]
    assert [(s.arch, s.accel) for s, _ in ready] == [("x86_64", "kvm"), ("arm64", "tcg")]
    assert all(seconds >= 0 for _, seconds in ready)
