"""The upstream inputs (the UB driver tree, libobmm) are given by path only: the variable, else
nothing (no default place is looked in); what needs one skips with one line that says how to give
it, and that line is collected for the end of ``make test``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from obmm import envvars
from obmm.testbed import paths

INPUTS = [
    (paths.ub_upstream_dir, paths.ub_upstream_missing, envvars.UB_UPSTREAM.name),
    (paths.libobmm_source_dir, paths.libobmm_missing, envvars.LIBOBMM_SOURCE.name),
]
IDS = ["ub-upstream", "libobmm"]


@pytest.mark.parametrize(("find", "missing", "var"), INPUTS, ids=IDS)
def test_the_variable_names_the_tree(find: Callable[[], Path | None],
                                     missing: Callable[[str], str | None], var: str,
                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                     ) -> None:  # fmt: skip
    monkeypatch.setenv(var, str(tmp_path / "elsewhere"))
    assert find() == tmp_path / "elsewhere"


@pytest.mark.parametrize(("find", "missing", "var"), INPUTS, ids=IDS)
def test_not_given_is_none_even_with_a_tree_beside_the_checkout(
    find: Callable[[], Path | None], missing: Callable[[str], str | None], var: str,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("ub-os-component-dkms-65ba333", "libobmm-4c59568"):
        (tmp_path / "inputs" / name / "drivers" / "ub").mkdir(parents=True)
    monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(envvars.ROOT.name, str(root))
    assert find() is None
    line = missing("some-step")
    assert line is not None and line.startswith("some-step: skipped: no ")
    assert f"(set {var}=" in line and paths.is_input_skip(line)
    assert "\n" not in line


@pytest.mark.parametrize(("find", "missing", "var"), INPUTS, ids=IDS)
def test_a_given_path_that_is_no_tree_names_it(find: Callable[[], Path | None],
                                               missing: Callable[[str], str | None], var: str,
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:  # fmt: skip
    monkeypatch.setenv(var, str(tmp_path / "absent"))
    line = missing("step")
    assert line is not None and f"at {tmp_path / 'absent'} (set {var}=" in line


def test_a_given_tree_is_no_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dkms" / "drivers" / "ub" / "obmm").mkdir(parents=True)
    (tmp_path / "libobmm").mkdir()
    (tmp_path / "libobmm" / "libobmm.c").write_text("")
    monkeypatch.setenv(envvars.UB_UPSTREAM.name, str(tmp_path / "dkms"))
    monkeypatch.setenv(envvars.LIBOBMM_SOURCE.name, str(tmp_path / "libobmm"))
    assert paths.ub_upstream_missing("s", "drivers/ub/obmm") is None
    assert paths.libobmm_missing("s") is None
    assert paths.ub_upstream_missing("s", "drivers/ub/ubus") is not None


def test_skip_lines_are_collected_once_each_in_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(envvars.UB_UPSTREAM.name, raising=False)
    line = paths.ub_upstream_missing("real-driver-test")
    assert line is not None
    listed = tmp_path / "results" / "skipped-inputs.txt"
    assert paths.note_input_skip(line, listed) == line
    paths.note_input_skip(line, listed)
    assert listed.read_text() == f"{line}\n{line}\n"  # the list printed dedupes


def test_a_skip_reason_that_is_not_about_an_input_is_not_collected() -> None:
    assert not paths.is_input_skip("needs perl and git")
    assert not paths.is_input_skip("emulator_only: the real driver differs")
