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
from obmm.testbed.vm.timeline import Timeline


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


def _sample(wall: float, restored: str | None = None) -> cluster_hook.UpSample:
    timeline = Timeline(
        kind="boot",
        cluster={"bring_up": 0.5, "returned": wall - 0.01},
        nodes={0: {"qemu": 0.7, "sshd": wall - 1.0}, 1: {"qemu": 0.8, "sshd": wall - 0.5}},
        guest={0: {"sshd": 5.0}, 1: {"sshd": 5.5}},
        cpu={"command": 0.9, "node0": 6.0, "node1": 7.0},
    )
    return cluster_hook.UpSample(wall, timeline, restored, load=0.25)


def test_boot_figures_interleave_the_inits_and_compare_fast_with_systemd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    booted: list[tuple[int, str]] = []

    def fake_up(settings: Settings) -> cluster_hook.UpSample:
        booted.append((settings.nodes or 0, settings.init))
        assert settings.snapshot == "off"  # a boot figure is a cold boot, never a restore
        return _sample(8.0)

    monkeypatch.setattr(cluster_hook, "up_sample", fake_up)
    figures = cluster_hook.boot_figures(
        Settings(accel="tcg"), [1, 8], ["fast", "systemd"], 2, lambda _msg: None
    )
    assert booted == [(n, i) for n in (1, 8) for _ in range(2) for i in ("fast", "systemd")]
    by_name = {f.name: f for f in figures}
    assert {n for n in by_name if ".at." not in n and ".cpu." not in n and ".guest." not in n} == {
        "testbed.boot_to_ssh.fast.1node",
        "testbed.boot_to_ssh.systemd.1node",
        "testbed.boot_to_ssh.fast.8nodes",
        "testbed.boot_to_ssh.systemd.8nodes",
    }
    assert by_name["testbed.boot_to_ssh.fast.8nodes"].baseline == (
        "testbed.boot_to_ssh.systemd.8nodes"
    )
    assert by_name["testbed.boot_to_ssh.systemd.1node"].baseline is None
    assert by_name["testbed.boot_to_ssh.fast.1node"].samples == [8.0, 8.0]
    assert "load average 0.25, 0.25" in by_name["testbed.boot_to_ssh.fast.1node"].note
    # The fast boot's phases: the slowest node's time of each step, CPU of command and QEMUs.
    assert by_name["testbed.boot_to_ssh.fast.8nodes.at.sshd"].samples == [7.5, 7.5]
    assert by_name["testbed.boot_to_ssh.fast.8nodes.at.returned"].samples == [7.99, 7.99]
    assert by_name["testbed.boot_to_ssh.fast.8nodes.guest.sshd"].samples == [5.5, 5.5]
    assert by_name["testbed.boot_to_ssh.fast.8nodes.cpu.qemu"].samples == [13.0, 13.0]
    assert by_name["testbed.boot_to_ssh.fast.8nodes.cpu.command"].samples == [0.9, 0.9]
    assert "testbed.boot_to_ssh.systemd.8nodes.at.sshd" not in by_name


def test_restore_figures_time_restores_against_the_cold_fast_boot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starts: list[int] = []
    restored: list[str | None] = ["abc"]

    def fake_up(settings: Settings) -> cluster_hook.UpSample:
        starts.append(settings.nodes or 0)
        assert settings.snapshot == "auto"
        return _sample(2.0, restored[0])

    monkeypatch.setattr(cluster_hook, "up_sample", fake_up)
    figures = cluster_hook.restore_figures(Settings(), [2], 3, lambda _m: None)
    assert starts == [2, 2, 2, 2]  # one to make sure a snapshot exists, three timed
    fig = figures[0]
    assert fig.name == "testbed.restore_to_ssh.2nodes"
    assert fig.baseline == "testbed.boot_to_ssh.fast.2nodes"
    assert fig.samples == [2.0, 2.0, 2.0]
    assert {f.name for f in figures[1:]} >= {
        "testbed.restore_to_ssh.2nodes.at.qemu",
        "testbed.restore_to_ssh.2nodes.cpu.qemu",
    }
    restored[0] = None
    with pytest.raises(RuntimeError, match="booted cold"):
        cluster_hook.restore_figures(Settings(), [2], 1, lambda _m: None)


def test_up_argv_is_the_command_a_user_types_with_the_settings_as_flags() -> None:
    argv = cluster_hook.up_argv(
        Settings(nodes=2, init="fast", snapshot="off", name="bench-2", params=("a=1", "b=2"))
    )
    assert argv[0].endswith("obmm-testbed") or argv[1:3] == ["-m", "obmm.testbed.cli.main"]
    rest = argv[argv.index("up") + 1 :]
    pairs = list(zip(rest[::2], rest[1::2]))
    assert ("--nodes", "2") in pairs and ("--snapshot", "off") in pairs
    assert ("--name", "bench-2") in pairs and ("--init", "fast") in pairs
    assert ("--param", "a=1") in pairs and ("--param", "b=2") in pairs
    assert not any(flag == "--topology" for flag, _ in pairs)  # unset: not given


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


def test_a_second_architecture_boots_and_restores_in_the_same_rotation_against_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bench --archs x86_64,arm64: arm64's cold boots (fast init) and restores interleave with
    x86_64's, and each arm64 figure's baseline is x86_64's same figure (the ratio column)."""
    started: list[tuple[str, str, str]] = []

    def fake_up(settings: Settings) -> cluster_hook.UpSample:
        started.append((settings.arch, settings.init, settings.snapshot))
        wall = 12.0 if settings.arch == "arm64" else 8.0
        return _sample(wall, "abc" if settings.snapshot == "auto" else None)

    monkeypatch.setattr(cluster_hook, "up_sample", fake_up)
    x86 = Settings(accel="tcg")
    arm = Settings(accel="tcg", arch="arm64")
    say = lambda _m: None  # noqa: E731
    boots = cluster_hook.boot_figures(x86, [2], ["fast", "systemd"], 2, say, [arm])
    assert started == [("x86_64", "fast", "off"), ("x86_64", "systemd", "off"),
                       ("arm64", "fast", "off")] * 2  # fmt: skip
    by_name = {f.name: f for f in boots}
    cold = by_name["testbed.boot_to_ssh.fast.2nodes.arm64"]
    assert cold.samples == [12.0, 12.0] and cold.baseline == "testbed.boot_to_ssh.fast.2nodes"
    assert "testbed.boot_to_ssh.systemd.2nodes.arm64" not in by_name
    assert by_name["testbed.boot_to_ssh.fast.2nodes.at.sshd.arm64"].baseline == (
        "testbed.boot_to_ssh.fast.2nodes.at.sshd"
    )
    assert by_name["testbed.boot_to_ssh.fast.2nodes"].baseline == (
        "testbed.boot_to_ssh.systemd.2nodes"
    )

    started.clear()
    restores = cluster_hook.restore_figures(x86, [2], 2, say, [arm])
    assert started == [("x86_64", "fast", "auto"), ("arm64", "fast", "auto")] * 3
    by_name = {f.name: f for f in restores}
    assert by_name["testbed.restore_to_ssh.2nodes"].baseline == "testbed.boot_to_ssh.fast.2nodes"
    again = by_name["testbed.restore_to_ssh.2nodes.arm64"]
    assert again.baseline == "testbed.restore_to_ssh.2nodes" and again.samples == [12.0, 12.0]
    run = Run(env=Environment.collect_host())
    run.add(boots + restores)
    assert run.ratio(cold) == pytest.approx(1.5) and run.ratio(again) == pytest.approx(1.5)
