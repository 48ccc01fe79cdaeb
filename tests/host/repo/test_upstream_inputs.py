"""The pinned upstream inputs (the UB driver tree, libobmm) are found by path: the variable,
else ``shared/upstream/<pin>`` beside the checkout or above it; never part of the project."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from obmm import envvars
from obmm.testbed import paths

INPUTS = [
    (paths.ub_upstream_dir, envvars.UB_UPSTREAM.name, paths.UB_UPSTREAM_PIN),
    (paths.libobmm_source_dir, envvars.LIBOBMM_SOURCE.name, paths.LIBOBMM_PIN),
]
IDS = ["ub-upstream", "libobmm"]


@pytest.mark.parametrize(("find", "var", "pin"), INPUTS, ids=IDS)
def test_the_variable_wins(find: Callable[[], Path], var: str, pin: str, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv(var, str(tmp_path / "elsewhere"))
    assert find() == tmp_path / "elsewhere"


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize(("find", "var", "pin"), INPUTS, ids=IDS)
def test_the_pinned_copy_beside_or_above_the_checkout(
    find: Callable[[], Path], var: str, pin: str, depth: int, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    root = tmp_path / "work" / "wt" / "checkout" if depth == 2 else tmp_path / "checkout"
    pinned = (tmp_path / "work" if depth == 2 else tmp_path) / "shared" / "upstream" / pin
    pinned.mkdir(parents=True)
    root.mkdir(parents=True)
    monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(envvars.ROOT.name, str(root))
    assert find() == pinned


@pytest.mark.parametrize(("find", "var", "pin"), INPUTS, ids=IDS)
def test_absent_is_the_path_beside_the_checkout(find: Callable[[], Path], var: str, pin: str,
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:  # fmt: skip
    monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(envvars.ROOT.name, str(tmp_path / "checkout"))
    found = find()
    assert found == tmp_path / "shared" / "upstream" / pin and not found.exists()
