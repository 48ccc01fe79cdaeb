"""The real-driver plumbing that needs no VM: the driver setting, which modules each driver
loads and in which order, the skip when the upstream tree is absent, fuzz-diff's comparison and
the real-vs-emu report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from obmm import envvars
from obmm.testbed import arch as arch_table
from obmm.testbed import paths, provision
from obmm.testbed.builds import elfcheck, kbuild, kheaders
from obmm.testbed.cli import kmod
from obmm.testbed.settings import Settings, SettingsError
from obmm.testbed.ssh import Result
from obmm.testbed.stages import fuzzdiff, realreport


class FakeImage:
    kernel_release = "6.1.0-0-amd64"
    kdir = None
    arch = arch_table.X86_64


def test_the_driver_setting() -> None:
    assert Settings.from_env({}).driver == "emu"
    assert Settings.from_env({envvars.DRIVER.name: "real"}).driver == "real"
    # a flag (a front end's value) beats the environment
    assert Settings.from_env({envvars.DRIVER.name: "real"}, driver="emu").driver == "emu"
    with pytest.raises(SettingsError, match="OBMM_TESTBED_DRIVER='ral': must be one of emu, real"):
        Settings.from_env({envvars.DRIVER.name: "ral"})


def test_the_compat_layer_loads_before_the_real_driver() -> None:
    kos = [Path(n) for n in ("obmm.ko", "ub_compat.ko", "obmm_testhook.ko")]
    order = [p.name for p in provision.module_load_order(kos)]
    assert order == ["obmm_testhook.ko", "ub_compat.ko", "obmm.ko"]


class RecordingNode:
    """A node that answers modinfo with the parameters the module declares and records the rest."""

    name = "node0"
    index = 0

    def __init__(self, declared: dict[str, list[str]]) -> None:
        self.declared = declared
        self.commands: list[str] = []

    def run(self, cmd: str, **kw: object) -> Result:
        self.commands.append(cmd)
        if cmd.startswith("modinfo"):
            stem = Path(cmd.split()[3]).stem
            return Result(cmd, 0, "\n".join(self.declared.get(stem, [])).encode(), b"", 0.0)
        return Result(cmd, 0, b"", b"", 0.0)


# obmm_emu's and the real obmm.ko's parameters, as their modinfo lists them (abridged).
DECLARED = {
    "obmm": ["mempool_size", "mempool_refill_timeout", "mempool_allocator"],
    "obmm_emu": ["node_id", "nr_nodes", "pool_base", "pool_size"],
}


def test_the_driver_setting_not_the_module_name_decides_the_real_driver_parameters() -> None:
    """The emulator is obmm.ko too once it is renamed (issue 27): only `driver` says which."""
    from obmm.testbed.topology import Topology

    topo = Topology(nodes=1, memory_mib=1024, pool_mib=256)
    assert provision.real_driver_params(topo) == {
        "mempool_size": str(256 << 20),
        "mempool_refill_timeout": "1000",
    }
    kos = [Path("obmm.ko")]
    real = RecordingNode(DECLARED)
    provision.load_modules(real, topo, kos, params=["mempool_refill_timeout=5"], driver="real")  # type: ignore[arg-type]
    insmods = [c for c in real.commands if c.startswith("insmod")]
    # the testbed's pool size, the user's parameter over the testbed's refill time
    assert insmods == [
        "insmod /opt/obmm-testbed/kmod/obmm.ko mempool_size=268435456 mempool_refill_timeout=5"
    ]
    assert any(provision.REAL_POOL_SYSFS in c for c in real.commands)  # waited for the pool
    emu = RecordingNode({"obmm": DECLARED["obmm_emu"]})  # an emulator named obmm.ko
    provision.load_modules(emu, topo, kos, driver="emu")  # type: ignore[arg-type]
    assert [c for c in emu.commands if c.startswith("insmod")] == [
        f"insmod /opt/obmm-testbed/kmod/obmm.ko node_id=0 nr_nodes=1 pool_base={topo.pool_base:#x} "
        f"pool_size={topo.pool_size:#x}"
    ]
    assert not any(provision.REAL_POOL_SYSFS in c for c in emu.commands)


def test_a_failing_pool_wait_names_the_node_and_the_counters() -> None:
    from obmm.testbed.topology import Topology

    class Slow(RecordingNode):
        def run(self, cmd: str, **kw: object) -> Result:
            if provision.REAL_POOL_SYSFS in cmd:
                return Result(cmd, 1, b"total 0x1000 cleared 0x0\n", b"", 0.0)
            return super().run(cmd, **kw)

    with pytest.raises(provision.ProvisionError, match=r"node0: the real driver.s pool .* total"):
        provision.wait_real_pool(Slow({}), Topology(nodes=1, memory_mib=1024, pool_mib=256))  # type: ignore[arg-type]


@pytest.fixture
def fake_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """kmod/ with the emulator, the testhook and the compat layer; builds record what they make."""
    kmod = tmp_path / "kmod"
    for name in ("obmm_emu", "obmm_testhook", "ub_compat"):
        (kmod / name).mkdir(parents=True)
        (kmod / name / "Kbuild").write_text(f"obj-m := {name}.o\n")
    monkeypatch.setattr(provision, "kmod_dir", lambda: kmod)
    upstream = tmp_path / "upstream"
    for marker in kbuild.UPSTREAM_MARKERS:
        (upstream / marker).parent.mkdir(parents=True, exist_ok=True)
        (upstream / marker).write_text("x\n")
    monkeypatch.setattr(provision, "ub_upstream_dir", lambda: upstream)
    made: dict[str, list[str]] = {}

    def fake(kind: str, names: list[str]):  # type: ignore[no-untyped-def]
        def build(*args: object, **kw: object) -> list[Path]:
            out = Path(str(args[3] if kind == "real" else args[2]))
            out.mkdir(parents=True, exist_ok=True)
            made[kind] = names
            kos = [out / f"{n}.ko" for n in names]
            for ko in kos:
                ko.write_bytes(b"ko")
            return kos

        return build

    monkeypatch.setattr(kheaders, "fetch_headers", lambda release, *a, **kw: tmp_path)
    monkeypatch.setattr(
        kbuild, "build_modules", fake("emu", ["obmm_emu", "obmm_testhook", "ub_compat"])
    )
    monkeypatch.setattr(
        kbuild, "build_real_driver", fake("real", ["obmm_testhook", "ub_compat", "obmm"])
    )
    monkeypatch.setattr(elfcheck.Symvers, "load", staticmethod(lambda path: None))
    monkeypatch.setattr(elfcheck, "module_exports", lambda ko: set())
    monkeypatch.setattr(elfcheck, "require_loadable", lambda *a, **kw: None)
    return made


def test_each_driver_loads_its_own_modules_from_its_own_directory(
    fake_builds: dict[str, list[str]], tmp_path: Path
) -> None:
    out = tmp_path / "results" / "kmod"
    emu = provision.build_guest_modules(FakeImage(), out, "emu")  # type: ignore[arg-type]
    assert sorted(k.name for k in emu) == ["obmm_emu.ko", "obmm_testhook.ko"]  # no ub_compat
    real = provision.build_guest_modules(FakeImage(), out, "real")  # type: ignore[arg-type]
    assert {k.name for k in real} == {"obmm_testhook.ko", "ub_compat.ko", "obmm.ko"}
    assert all(
        k.parent == tmp_path / "results" / "kmod-real" / FakeImage.kernel_release for k in real
    )


def test_without_the_upstream_tree_the_build_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(kbuild.UpstreamMissing, match="no upstream UB driver tree at"):
        kbuild.check_upstream(tmp_path / "absent")
    parser = argparse.ArgumentParser()
    kmod.add_arguments(parser)
    args = parser.parse_args(["--driver", "real", "--upstream", str(tmp_path / "absent")])
    assert kmod.command(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("kbuild --driver real: skipped: no upstream UB")
    assert paths.is_input_skip(out[0])


def test_without_a_tree_given_the_real_build_skips_and_builds_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not given is not "the emulator instead": nothing is built, one line says how to give it.
    monkeypatch.delenv(envvars.UB_UPSTREAM.name, raising=False)
    with pytest.raises(kbuild.UpstreamMissing, match=r"^no upstream UB driver tree \(set OBMM_"):
        kbuild.check_upstream(None)
    monkeypatch.setattr(kheaders, "fetch_headers", lambda *a, **k: pytest.fail("built something"))
    parser = argparse.ArgumentParser()
    kmod.add_arguments(parser)
    assert kmod.command(parser.parse_args(["--driver", "real"])) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        f"kbuild --driver real: skipped: no upstream UB driver tree ({paths.UB_UPSTREAM_HINT}, "
        "or --upstream)"
    ]
    assert paths.skipped_inputs_file().read_text() == out[0] + "\n"


def test_the_report_check_skips_in_one_line_without_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(envvars.UB_UPSTREAM.name, str(tmp_path / "absent"))
    assert realreport.main(["--check-upstream"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("real driver: skipped:")
    monkeypatch.delenv(envvars.UB_UPSTREAM.name)
    assert realreport.main(["--check-upstream", "--step", "real-driver-test"]) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith("real-driver-test: skipped: no upstream UB driver tree (set OBMM_")
    assert paths.skipped_inputs_file().read_text().splitlines()[-1] == line


def outcome(op: int, kind: str, **kw: object) -> dict[str, object]:
    return {"op": op, "kind": kind, "errnos": ["ok"], **kw}


def test_fuzz_diff_counts_and_stops_at_the_first_unexplained_difference() -> None:
    emu = [
        outcome(0, "export", mem_id=1),
        outcome(1, "import", skipped="token"),
        outcome(2, "open", errnos=["EPERM"]),
        outcome(3, "mmap"),
    ]
    real = [
        outcome(0, "export", mem_id=1),
        outcome(1, "import", skipped="token"),
        outcome(2, "open", errnos=["ok"]),
        outcome(3, "mmap"),
    ]
    result = fuzzdiff.compare(emu, real)
    assert result.per_kind["export"]["passed"] == 1
    assert result.per_kind["import"]["skipped"] == {"token": 1}
    assert result.first_unexplained is not None and result.first_unexplained[0] == 2
    assert result.compared == 3 and "mmap" not in result.per_kind


def test_an_explained_difference_is_counted_with_its_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rule = fuzzdiff.Explained("open", "a reason", lambda e, r: e["errnos"] == ["EPERM"])
    monkeypatch.setattr(fuzzdiff, "EXPLAINED", (rule,))
    result = fuzzdiff.compare(
        [outcome(0, "open", errnos=["EPERM"])], [outcome(0, "open", errnos=["ok"])]
    )
    assert result.first_unexplained is None
    assert result.per_kind["open"]["differs"] == {"a reason": 1}


def test_a_move_of_a_mapping_the_real_driver_split_at_update_range_bounds_is_explained() -> None:
    """The real driver splits the VMA at an UPDATE_RANGE's bounds (obmm_shm_dev.c:
    obmm_shm_update_range), obmm_emu keeps one: a later move of the whole mapping is the core's
    EFAULT (more than one VMA) on the real driver, the driver's EOPNOTSUPP on the emulator."""
    emu = [outcome(0, "mremap", errnos=["EOPNOTSUPP"]), outcome(1, "mremap", errnos=["ok"])]
    real = [outcome(0, "mremap", errnos=["EFAULT"]), outcome(1, "mremap", errnos=["EFAULT"])]
    result = fuzzdiff.compare(emu, real)
    assert result.per_kind["mremap"]["differs"] == {
        fuzzdiff.EXPLAINED[0].reason: 1,
        "unexplained": 1,
    }
    assert result.first_unexplained is not None and result.first_unexplained[0] == 1


def test_a_declaration_past_every_window_is_explained() -> None:
    """fuzz-diff op 384 (seed 1, 4,000 operations): DECLARE_PREIMPORT of 4 PiB at the window's
    base, EINVAL on obmm_emu (window first), EBUSY on the real driver (iomem first)."""
    emu = [outcome(0, "declare_big", errnos=["EINVAL"])]
    real = [outcome(0, "declare_big", errnos=["EBUSY"])]
    result = fuzzdiff.compare(emu, real)
    assert result.first_unexplained is None
    assert list(result.per_kind["declare_big"]["differs"]) == [
        "DECLARE_PREIMPORT outside every window: EINVAL before iomem, real EBUSY"
    ]


def test_the_emulators_run_leaves_out_the_exports_the_real_pool_scattered() -> None:
    """fuzz-diff op 46 of one run: the real driver's pool gave an export granules that are not
    one physical run, which no import reaches on the testbed (EINVAL) while obmm_emu's import
    worked.  The real run goes first and leaves such an export out; the emulator's run is told
    to leave out the same operations."""
    from obmm.fuzz.engine import SCATTERED

    calls: list[tuple[str, tuple[int, ...]]] = []

    class FakeSide:
        def __init__(self, driver: str, outcomes: list[dict[str, object]]) -> None:
            self.driver, self.outcomes = driver, outcomes

        def record(self, seed: int, ops: int, only=(), skip_exports=()):  # type: ignore[no-untyped-def]
            calls.append((self.driver, tuple(skip_exports)))
            return self.outcomes, ""

    left_out = {"errnos": [], "skipped": SCATTERED, "scattered": True}
    real = [outcome(0, "export", mem_id=1), {"op": 5, "kind": "export", **left_out}]
    emu = [outcome(0, "export", mem_id=1), {"op": 5, "kind": "export", "errnos": [],
                                            "skipped": SCATTERED}]  # fmt: skip
    sides = [FakeSide("emu", emu), FakeSide("real", real)]
    (e, _), (r, _) = fuzzdiff.record_pair(sides, 1, 10)  # type: ignore[arg-type]
    assert calls == [("real", ()), ("emu", (5,))]
    result = fuzzdiff.compare(e, r)
    assert result.first_unexplained is None
    assert result.per_kind["export"] == {"passed": 1, "differs": {}, "skipped": {SCATTERED: 1}}


JUNIT = """<?xml version="1.0"?>
<testsuites><testsuite>
<testcase classname="tests.qemu.guest.guestsuite.tests/guest/test_x.py" name="test_a"/>
<testcase classname="tests.qemu.guest.guestsuite.tests/guest/test_x.py" name="test_b">
  <failure message="guest test: failed">E   assert 1 == 2</failure></testcase>
<testcase classname="tests.qemu.guest.guestsuite.tests/guest/test_x.py" name="test_c">
  <skipped type="pytest.skip" message="Skipped: emulator_only: why"/></testcase>
<testcase classname="tests.cluster.test_xnode" name="test_d[o_sync]">
  <skipped type="pytest.xfail" message="real_driver_differs: 4 KiB"/></testcase>
</testsuite></testsuites>
"""


def test_the_report_per_test_file(tmp_path: Path) -> None:
    (tmp_path / "real-qemu-junit.xml").write_text(JUNIT)
    (tmp_path / "qemu-junit.xml").write_text(
        JUNIT.replace("<failure", "<skipped").replace("</failure>", "</skipped>")
    )
    (tmp_path / "fuzz-diff.json").write_text(json.dumps({
        "seed": 1, "ops": 10, "compared": 10,
        "per_kind": {"export": {"passed": 9, "differs": {}, "skipped": {"x": 1}}},
    }))  # fmt: skip
    path, totals = realreport.write(tmp_path)
    doc = json.loads(path.with_suffix(".json").read_text())
    row = doc["files"]["tests/guest/test_x.py"]
    assert row["passed_on_both"] == 1
    assert row["differs"] == {"test_b": "failed: assert 1 == 2"}
    assert row["skipped"] == {"emulator_only: why": 1}
    assert doc["files"]["tests/cluster/test_xnode.py"]["differs"] == {
        "test_d[o_sync]": "xfailed: real_driver_differs: 4 KiB"
    }
    assert totals == {"passed_both": 1, "passed_real": 0, "differs": 2, "skipped": 1}
    text = path.read_text()
    assert "| tests/guest/test_x.py | 1 | 0 | test_b: failed: assert 1 == 2 |" in text
    assert "| export | 9 | 0 | 1 x |" in text


class FakeItem:
    """What mark_for_driver reads of a pytest item: its markers; it records those added."""

    def __init__(self, *marks: pytest.MarkDecorator) -> None:
        self.marks = {m.mark.name: m.mark for m in marks}
        self.added: list[pytest.Mark] = []

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self.marks.get(name)

    def add_marker(self, marker: pytest.MarkDecorator, append: bool = True) -> None:
        self.added.append(marker.mark)
        # a driver's skip goes first, so a test's own skipif cannot win over its reason
        assert not append or marker.mark.name != "skipif", marker


def _added(item: FakeItem) -> list[tuple[str, str, bool]]:
    return [(m.name, m.kwargs["reason"], m.kwargs.get("strict", False)) for m in item.added]


@pytest.mark.parametrize("driver", ["emu", "real", "hardware"])
def test_the_driver_markers_under_each_driver(driver: str) -> None:
    from obmm.testbed.suite.guest_plugin import (
        TESTBED_FABRIC_SKIP,
        emulator_only_reason,
        mark_for_driver,
    )

    emu_only = FakeItem(pytest.mark.emulator_only)
    fabric = FakeItem(pytest.mark.testbed_fabric)
    differs = FakeItem(pytest.mark.real_driver_differs("4 KiB PTEs"))
    plain = FakeItem()
    both = FakeItem(pytest.mark.emulator_only, pytest.mark.testbed_fabric)
    mark_for_driver([emu_only, fabric, differs, plain, both], driver)  # type: ignore[list-item]
    if driver != "emu":
        # each skip is put first: the last one added is the reason pytest gives
        assert _added(both)[-1][1] == emulator_only_reason(driver)
    assert _added(plain) == []
    if driver == "emu":
        assert _added(emu_only) == _added(fabric) == _added(differs) == []
    elif driver == "real":
        assert _added(emu_only) == [("skipif", emulator_only_reason("real"), False)]
        assert _added(fabric) == []  # the testbed's fabric is there under either driver
        assert _added(differs) == [("xfail", "real_driver_differs: 4 KiB PTEs", True)]
    else:
        assert _added(emu_only) == [("skipif", emulator_only_reason("hardware"), False)]
        assert _added(fabric) == [("skipif", TESTBED_FABRIC_SKIP, False)]
        assert _added(differs) == []  # a UB host is the real driver on real hardware


def test_fuzz_diff_says_why_a_fuzzer_ended_without_its_result(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The CLI prints an error's first line only: it names the exception the fuzzer ended on
    and the file holding its whole output (the 20,000-op run said only 'Traceback (most
    recent call last):')."""
    monkeypatch.setenv("OBMM_TESTBED_RESULTS", str(tmp_path))
    side = object.__new__(fuzzdiff.Side)
    side.driver = "real"
    err = (
        '{"op": 0, "kind": "export", "errnos": ["ok"]}\n'
        "Traceback (most recent call last):\n"
        '  File "engine.py", line 9, in run\n'
        "KeyError: 7\n"
    )
    exc = side.unfinished(1, "", err)
    first = str(exc).splitlines()[0]
    log = tmp_path / "fuzz-diff-real.log"
    assert first == (
        f"real: the fuzzer did not finish: exit status 1, after 1 operation(s): KeyError: 7 "
        f"(its output: {log})"
    )
    assert "KeyError: 7" in log.read_text() and '"op": 0' in log.read_text()
    assert "(signal 9: see the node's console)" in str(side.unfinished(137, "", ""))


def test_fuzz_diff_runs_the_fuzzer_without_khugepaged() -> None:
    """The real driver's EXPORT_PID deadlocks its caller against a queued mmap writer
    (FIDELITY): both record runs start with khugepaged off, before the fuzzer."""
    commands: list[str] = []

    class Conn:
        def __enter__(self) -> Conn:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def run(self, cmd: str, *, timeout: float) -> Result:
            commands.append(cmd)
            return Result(cmd, 0, b'fuzz-result {"ops": 0}\n', b"", 0.1)

    class Session:
        def connect(self, node: int) -> Conn:
            return Conn()

    side = object.__new__(fuzzdiff.Side)
    side.driver, side.session = "real", Session()  # type: ignore[assignment]
    side.record(1, 10)
    (cmd,) = commands
    assert cmd.startswith("echo never > /sys/kernel/mm/transparent_hugepage/enabled; ")
    assert cmd.index("transparent_hugepage") < cmd.index("python3 -m obmm.fuzz")
