"""The accelerator choice: TCG without a probe where KVM cannot boot the image's kernel."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from obmm.testbed.vm import accel


def _modules(root: Path, *names: str) -> Path:
    for name in names:
        (root / name / "parameters").mkdir(parents=True)
    return root


def test_pvm_alone_is_pvm(tmp_path: Path) -> None:
    assert accel.kvm_is_pvm(_modules(tmp_path / "a", "kvm", "kvm_pvm"))
    assert not accel.kvm_is_pvm(_modules(tmp_path / "b", "kvm", "kvm_amd"))
    assert not accel.kvm_is_pvm(_modules(tmp_path / "c", "kvm", "kvm_pvm", "kvm_intel"))
    assert not accel.kvm_is_pvm(tmp_path / "none")


def test_auto_on_a_pvm_host_is_tcg_without_a_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(accel, "kvm_usable", lambda: True)
    monkeypatch.setattr(accel, "SYS_MODULE", _modules(tmp_path / "sys", "kvm", "kvm_pvm"))
    monkeypatch.setattr(accel, "probe_kvm", lambda *a, **k: pytest.fail("probed a PVM host"))
    with caplog.at_level(logging.INFO, logger=accel.__name__):
        assert accel.choose(None, tmp_path / "vmlinuz", tmp_path / "cache") == "tcg"
    assert f"accelerator: tcg ({accel.PVM_REASON})" in caplog.text
    assert not (tmp_path / "cache" / "accel-probe.json").exists()


def test_kvm_asked_for_on_a_pvm_host_is_honoured_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(accel, "SYS_MODULE", _modules(tmp_path / "sys", "kvm", "kvm_pvm"))
    with caplog.at_level(logging.WARNING, logger=accel.__name__):
        assert accel.choose("kvm", tmp_path / "vmlinuz", tmp_path / "cache") == "kvm"
    assert "the guest will likely hang" in caplog.text


def test_auto_with_hardware_kvm_still_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(accel, "kvm_usable", lambda: True)
    monkeypatch.setattr(accel, "SYS_MODULE", _modules(tmp_path / "sys", "kvm", "kvm_amd"))
    probed: list[Path] = []
    monkeypatch.setattr(accel, "probe_kvm", lambda kernel, qemu: probed.append(kernel) or True)
    assert accel.choose(None, tmp_path / "vmlinuz", tmp_path / "cache") == "kvm"
    assert probed == [tmp_path / "vmlinuz"]
