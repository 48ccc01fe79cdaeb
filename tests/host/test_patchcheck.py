"""Host tests for obmm.tools.patchcheck (the ``make patch-check`` checks)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from obmm.testbed import paths
from obmm.tools import patchcheck

SERIES = Path(__file__).resolve().parents[2] / "kmod" / "patches" / "urma-seg-mapped"
FIRST = "0001-"
NEEDS_TOOLS = pytest.mark.skipif(
    shutil.which("perl") is None or shutil.which("git") is None, reason="needs perl and git"
)


@pytest.fixture
def series(tmp_path: Path) -> Path:
    dest = tmp_path / "series"
    shutil.copytree(SERIES, dest)
    return dest


def first_patch(series: Path) -> Path:
    return next(series.glob(FIRST + "*.patch"))


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1))


def failures(series: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    report = patchcheck.run(series, None, series / "no-baseline")
    capsys.readouterr()
    return [ln for ln in report.lines if ln.startswith("FAIL")]


def test_series_layout() -> None:
    names = (SERIES / "series").read_text().split()
    assert names == sorted(p.name for p in SERIES.glob("000[1-9]-*.patch"))
    assert (SERIES / "0000-cover-letter.patch").is_file()
    assert len((SERIES / "BASE").read_text().strip()) == 40
    rows = patchcheck.read_base_files(SERIES)
    assert {r.path for r in rows} >= {
        "drivers/ub/urma/uburma/uburma_cmd.c",
        "drivers/ub/urma/ubcore/ubcore_segment.c",
        "include/ub/urma/ubcore_types.h",
    }


def test_header_and_trailers_pass_on_pristine_series() -> None:
    _, patches = patchcheck.load_series(SERIES)
    assert patches
    for i, p in enumerate(patches, 1):
        assert patchcheck.check_mbox(p, i, len(patches)) == ""
        assert patchcheck.check_header(p) == ""
        assert patchcheck.check_trailers(p) == ""


def test_missing_signoff_is_reported(series: Path) -> None:
    p = first_patch(series)
    text = p.read_text()
    p.write_text("\n".join(ln for ln in text.split("\n") if not ln.startswith("Signed-off-by:")))
    _, patches = patchcheck.load_series(series)
    assert "Signed-off-by" in patchcheck.check_trailers(patches[0])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("category: bugfix\n", "missing category line"),
        ("CVE: NA\n", "missing CVE line"),
        ("driver inclusion\n", "missing inclusion line"),
        ("bugzilla: ", "missing bugzilla line"),
    ],
)
def test_missing_header_line_is_reported(series: Path, line: str, message: str) -> None:
    p = first_patch(series)
    if line.endswith("\n"):
        edit(p, line, "")
    else:
        edit(p, line, "Link: ")
    _, patches = patchcheck.load_series(series)
    assert message in patchcheck.check_header(patches[0])


def test_missing_separator_is_reported(series: Path) -> None:
    edit(first_patch(series), "\n" + "-" * 32 + "\n", "\n")
    _, patches = patchcheck.load_series(series)
    assert "separator" in patchcheck.check_header(patches[0])


def test_bad_subject_numbering_is_reported(series: Path) -> None:
    edit(first_patch(series), "[PATCH OLK-6.6 1/5]", "[PATCH OLK-6.6 2/5]")
    _, patches = patchcheck.load_series(series)
    assert "expected 1/5" in patchcheck.check_mbox(patches[0], 1, len(patches))


def test_not_an_mbox_is_reported(series: Path) -> None:
    p = first_patch(series)
    p.write_text(p.read_text().split("\n", 1)[1])
    _, patches = patchcheck.load_series(series)
    assert "format-patch" in patchcheck.check_mbox(patches[0], 1, len(patches))


def test_missing_base_commit_fails(series: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cover = series / "0000-cover-letter.patch"
    cover.write_text(
        "\n".join(ln for ln in cover.read_text().split("\n") if not ln.startswith("base-commit:"))
    )
    report = patchcheck.run(series, None, series / "no-baseline")
    capsys.readouterr()
    assert any("base-commit" in ln and "no 'base-commit:'" in ln for ln in report.lines)
    assert report.failed


@pytest.mark.slow
@NEEDS_TOOLS
def test_pristine_series_passes_and_ksrc_steps_not_run(
    series: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = patchcheck.run(series, None, series / "no-baseline")
    out = capsys.readouterr().out
    assert not report.failed, out
    assert sum(ln.startswith("PASS    checkpatch") for ln in report.lines) == 5
    for check in ("ksrc-am", "ksrc-build", "baseline-apply"):
        line = next(ln for ln in report.lines if f" {check} " in ln)
        assert line.startswith("NOT RUN"), line
    assert patchcheck.main(["--series-dir", str(series), "--baseline", str(series)]) == 0


@pytest.mark.slow
@NEEDS_TOOLS
@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("+\tcfg.mva = arg.in.mva;\n", "+\tcfg.mva = arg.in.mva;   \n", "trailing whitespace"),
        (
            "+\tcfg.mva = arg.in.mva;\n",
            "+\tcfg.mva = arg.in.mva; /*" + "x" * 100 + " */\n",
            "line length",
        ),
    ],
)
def test_style_error_fails_checkpatch(
    series: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, message: str
) -> None:
    edit(first_patch(series), old, new)
    bad = [ln for ln in failures(series, capsys) if " checkpatch " in ln]
    assert len(bad) == 1 and FIRST in bad[0], bad
    assert message in bad[0].lower(), bad[0]


@pytest.mark.slow
@NEEDS_TOOLS
def test_baseline_apply(series: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With baseline files present: pass when pinned, fail when a file differs."""
    base = tmp_path / "baseline"
    _, patches = patchcheck.load_series(series)
    # The pinned files are third-party sources kept out of git: use the cache.
    cache = paths.cache_dir() / "olk-baseline"
    rows = patchcheck.read_base_files(series)
    if not all((cache / r.path).is_file() for r in rows):
        pytest.skip(f"pinned baseline files not in {cache}")
    shutil.copytree(cache, base)
    status, detail = patchcheck.check_baseline(series, base, patches)
    assert status == "PASS", detail
    target = base / rows[-1].path
    target.write_text(target.read_text().replace("\n", "\n ", 1))
    status, detail = patchcheck.check_baseline(series, base, patches)
    assert status == "FAIL" and "differs" in detail
    capsys.readouterr()
