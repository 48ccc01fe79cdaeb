"""`obmm-testbed doctor`: each check's verdict and advice, on a host made to lack things."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from obmm.testbed.cli import doctor
from obmm.testbed.vm import accel


def test_too_little_memory_fails_with_what_to_change() -> None:
    need, ram_files = doctor.cluster_need(2)
    assert ram_files == (2 * 1024 + 2) << 20  # the pair topology's RAM files and control region
    low = doctor.check_memory(2, available=lambda: need - 1)
    assert low.level == doctor.FAIL and "--memory" in low.detail
    assert doctor.check_memory(2, available=lambda: need).level == doctor.OK


def test_missing_tools_say_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CC", raising=False)
    qemu = list(doctor.check_qemu())
    assert [c.level for c in qemu] == [doctor.FAIL, doctor.FAIL]
    assert "apt-get install qemu-system-x86" in qemu[0].detail
    compiler = list(doctor.check_compiler())
    assert compiler[0].level == doctor.FAIL and "build-essential" in compiler[0].detail
    # mmdebstrap only matters while no image is cached.
    assert doctor.check_mmdebstrap(tmp_path).level == doctor.FAIL
    (tmp_path / "images" / "debian-x").mkdir(parents=True)
    (tmp_path / "images" / "debian-x" / "manifest.json").write_text("{}")
    warn = doctor.check_mmdebstrap(tmp_path)
    assert warn.level == doctor.WARN and "1 is cached" in warn.detail


def test_kvm_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor.os.path, "exists", lambda p: p == "/dev/kvm")
    monkeypatch.setattr(accel, "kvm_usable", lambda: False)
    assert "group kvm" in doctor.check_kvm(tmp_path, probe=False).detail
    monkeypatch.setattr(accel, "kvm_usable", lambda: True)
    monkeypatch.setattr(accel, "kvm_is_pvm", lambda: False)
    assert "not probed yet" in doctor.check_kvm(tmp_path, probe=False).detail
    (tmp_path / "accel-probe.json").write_text(json.dumps({"key": "k", "accel": "tcg"}))
    assert doctor.check_kvm(tmp_path, probe=False).level == doctor.WARN
    (tmp_path / "accel-probe.json").write_text(json.dumps({"key": "k", "accel": "kvm"}))
    assert doctor.check_kvm(tmp_path, probe=False).level == doctor.OK


def test_a_pvm_kvm_is_named_and_not_probed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor.os.path, "exists", lambda p: p == "/dev/kvm")
    monkeypatch.setattr(accel, "kvm_usable", lambda: True)
    monkeypatch.setattr(accel, "kvm_is_pvm", lambda: True)
    monkeypatch.setattr(accel, "probe_kvm", lambda *a, **k: pytest.fail("probed a PVM host"))
    (tmp_path / "images" / "debian-bookworm-x").mkdir(parents=True)
    (tmp_path / "images" / "debian-bookworm-x" / "manifest.json").write_text("{}")
    check = doctor.check_kvm(tmp_path, probe=True)
    assert check.level == doctor.WARN
    assert check.detail == (
        "/dev/kvm is PVM (module kvm_pvm), which boots only kernels built as PVM guests "
        "(CONFIG_PVM_GUEST); the image's Debian kernel is not one: nodes run under TCG"
    )


def test_the_exit_status_is_1_only_when_a_check_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    checks = [doctor.Check(doctor.OK, "a", "x"), doctor.Check(doctor.WARN, "b", "y")]
    monkeypatch.setattr(doctor, "run_checks", lambda **kw: list(checks))
    args = argparse.Namespace(nodes=2, probe=False)
    assert doctor.command(args) == 0
    checks.append(doctor.Check(doctor.FAIL, "c", "install z"))
    assert doctor.command(args) == 1
    out = capsys.readouterr().out
    assert "FAIL c: install z" in out and "3 checks: 1 failed" in out
