"""`make qemu-test` wall times: recorded only when green, cold vs warm, read back by make bench."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from obmm.bench import cluster_hook
from obmm.bench.results import HOST_PAGES_KEY, Environment, Run
from obmm.testbed.settings import Settings


def _junit(path: Path, failures: int) -> Path:
    path.write_text(
        f'<testsuites><testsuite name="pytest" tests="3" failures="{failures}" errors="0">'
        "</testsuite></testsuites>"
    )
    return path


def test_green_runs_are_recorded_as_cold_then_warm(tmp_path: Path) -> None:
    out = tmp_path / "timings.json"
    green = _junit(tmp_path / "g.xml", 0)
    cluster_hook.record_qemu_test(green, 700.04, True, out)
    cluster_hook.record_qemu_test(green, 600.0, False, out)
    doc = json.loads(out.read_text())
    assert doc["cold"]["seconds"] == 700.0
    assert doc["warm"]["seconds"] == 600.0
    figures = {f.name: f for f in cluster_hook._qemu_test_figures(out)}
    assert sorted(figures) == ["testbed.qemu_test.cold", "testbed.qemu_test.warm"]
    assert figures["testbed.qemu_test.warm"].baseline == "testbed.qemu_test.cold"


def test_red_runs_are_not_recorded(tmp_path: Path) -> None:
    out = tmp_path / "timings.json"
    cluster_hook.record_qemu_test(_junit(tmp_path / "r.xml", 1), 10.0, False, out)
    assert not out.exists()
    assert cluster_hook._qemu_test_figures(out) == []


def test_record_command_needs_every_suite_green(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cluster_hook, "image_built_since", lambda start: False)
    out = tmp_path / "timings.json"
    green, red = _junit(tmp_path / "g.xml", 0), _junit(tmp_path / "r.xml", 2)
    start = str(time.time() - 42)
    assert cluster_hook.main(["record", start, str(green), str(red), "--out", str(out)]) == 0
    assert "not recorded" in capsys.readouterr().out
    assert not out.exists()
    assert cluster_hook.main(["record", start, str(green), "--out", str(out)]) == 0
    assert 41 <= json.loads(out.read_text())["warm"]["seconds"] < 60


def test_boot_figures_interleave_the_inits_and_compare_fast_with_systemd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from obmm.testbed import session

    booted: list[tuple[int, str]] = []

    class FakeSession:
        def __enter__(self) -> FakeSession:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def fake_bring_up(settings: Settings, **kw: object) -> FakeSession:
        booted.append((settings.nodes or 0, settings.init))
        assert settings.snapshot == "off"  # a boot figure is a cold boot, never a restore
        assert kw["load_modules"] is False  # what `up` takes, without modules
        return FakeSession()

    monkeypatch.setattr(session, "bring_up", fake_bring_up)
    figures = cluster_hook.boot_figures(
        Settings(accel="tcg"), [1, 8], ["fast", "systemd"], 2, lambda _msg: None
    )
    assert booted == [(n, i) for n in (1, 8) for _ in range(2) for i in ("fast", "systemd")]
    by_name = {f.name: f for f in figures}
    assert set(by_name) == {
        "testbed.boot_to_ssh.fast.1node",
        "testbed.boot_to_ssh.systemd.1node",
        "testbed.boot_to_ssh.fast.8nodes",
        "testbed.boot_to_ssh.systemd.8nodes",
    }
    assert by_name["testbed.boot_to_ssh.fast.8nodes"].baseline == (
        "testbed.boot_to_ssh.systemd.8nodes"
    )
    assert by_name["testbed.boot_to_ssh.systemd.1node"].baseline is None
    assert all(len(f.samples) == 2 for f in figures)


def test_restore_figures_time_restores_against_the_cold_fast_boot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from obmm.testbed import session

    starts: list[int] = []

    class FakeCluster:
        restored_from: str | None = "abc"

    class FakeSession:
        cluster = FakeCluster

        def __enter__(self) -> FakeSession:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def fake_bring_up(settings: Settings, **kw: object) -> FakeSession:
        starts.append(settings.nodes or 0)
        assert settings.snapshot == "auto"
        return FakeSession()

    monkeypatch.setattr(session, "bring_up", fake_bring_up)
    figures = cluster_hook.restore_figures(Settings(), [2], 3, lambda _m: None)
    assert starts == [2, 2, 2, 2]  # one to make sure a snapshot exists, three timed
    (fig,) = figures
    assert fig.name == "testbed.restore_to_ssh.2nodes"
    assert fig.baseline == "testbed.boot_to_ssh.fast.2nodes"
    assert len(fig.samples) == 3
    FakeCluster.restored_from = None
    with pytest.raises(RuntimeError, match="booted cold"):
        cluster_hook.restore_figures(Settings(), [2], 1, lambda _m: None)


def test_the_host_page_size_of_the_nodes_memory_is_noted() -> None:
    """How the host maps a process's memory (here this one's), as the bench notes it for the
    nodes' QEMU processes: kB on 2 MiB pages of all they map."""
    run = Run(env=Environment.collect_host())
    cluster_hook.note_host_pages(run, [os.getpid()])
    pmd, _, rest = run.env.extra[HOST_PAGES_KEY].partition(" of ")
    assert int(pmd) >= 0 and rest.endswith(" kB") and int(rest.split()[0]) > 0
    assert run.notes == [
        f"host: the nodes' QEMU processes map {run.env.extra[HOST_PAGES_KEY]} with 2 MiB pages "
        "(the rest with 4 KiB pages)"
    ]
    gone = Run(env=Environment.collect_host())
    cluster_hook.note_host_pages(gone, [2**22 + 7])  # no such process: nothing claimed
    assert gone.notes == [] and HOST_PAGES_KEY not in gone.env.extra


def test_parallel_tcg_figures_bring_up_both_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's parallel-TCG stage asks bring_up for accel tcg and tcg-serial; the settings
    refused tcg-serial (SettingsError) and the bench died before its data pair."""
    from obmm.testbed import session

    class FakeNode:
        qemu_pid = os.getpid()

        def run(self, command: str, **kw: object) -> None:
            pass

    class FakeSession:
        nodes = (FakeNode(), FakeNode())

        def __enter__(self) -> FakeSession:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    accels: list[str] = []

    def fake_bring_up(settings: Settings, **kw: object) -> FakeSession:
        accels.append(settings.accel)
        assert kw.get("test_hooks"), "the workload is guest-suite tests: the suites' build"
        return FakeSession()

    monkeypatch.setattr(session, "bring_up", fake_bring_up)
    figures = cluster_hook.tcg_parallel_figures(Settings(), 1, lambda _m: None)
    assert accels == ["tcg", "tcg-serial"]
    assert {f.name for f in figures} == {
        "testbed.tcg.workload_wall", "testbed.tcg_serial.workload_wall",
        "testbed.tcg.qemu_cpu", "testbed.tcg_serial.qemu_cpu",
    }  # fmt: skip


def test_make_test_s_stage_summary_becomes_wall_against_floor_figures(tmp_path: Path) -> None:
    # What obmm.testbed.stages.stage_summary writes at the end of make test.
    summary = tmp_path / "stage-summary.json"
    assert cluster_hook._stage_figures(summary) == []
    stage = {"name": "host+build", "wall_s": 300.0, "cpu_s": 400.0, "floor_s": 200.0,
             "status": 0, "jobs": []}  # fmt: skip
    total = {**stage, "name": "total"}
    summary.write_text(json.dumps({"cores": 2, "stages": [stage], "total": total}))
    figures = {f.name: f for f in cluster_hook._stage_figures(summary)}
    assert sorted(figures) == [
        "testbed.make_test.host_build.floor", "testbed.make_test.host_build.wall",
        "testbed.make_test.total.floor", "testbed.make_test.total.wall",
    ]  # fmt: skip
    wall = figures["testbed.make_test.host_build.wall"]
    assert wall.samples == [300.0] and wall.baseline == "testbed.make_test.host_build.floor"
    assert figures["testbed.make_test.host_build.floor"].samples == [200.0]
    summary.write_text("{")  # cut short: no figures, no error
    assert cluster_hook._stage_figures(summary) == []
