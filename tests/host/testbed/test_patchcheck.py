"""Host tests for obmm.testbed.stages.patchcheck (the ``make patch-check`` checks).

The tests that apply the series need an upstream tree (an input given by path, never part of the
project, :func:`obmm.testbed.paths.ub_upstream_dir`); without it they skip with one line.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from obmm import envvars
from obmm.testbed import paths
from obmm.testbed.stages import patchcheck

SERIES = Path(__file__).resolve().parents[3] / "kmod" / "patches" / "urma-seg-mapped"
FIRST = "0001-"
NEEDS_TOOLS = pytest.mark.skipif(
    shutil.which("perl") is None or shutil.which("git") is None, reason="needs perl and git"
)
UPSTREAM = paths.ub_upstream_dir() or Path("/nonexistent")
MISSING = paths.ub_upstream_missing("test_patchcheck (the series on the tree)", ".")
NEEDS_TREE = pytest.mark.skipif(
    MISSING is not None or shutil.which("git") is None, reason=MISSING or "needs git"
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
    report = patchcheck.run_static(series, series / "no-baseline")
    capsys.readouterr()
    return [ln for ln in report.lines if ln.startswith("FAIL")]


def test_series_layout() -> None:
    names = (SERIES / "series").read_text().split()
    assert names == sorted(p.name for p in SERIES.glob("000[1-9]-*.patch"))
    assert (SERIES / "0000-cover-letter.patch").is_file()
    assert len((SERIES / "BASE").read_text().strip()) == 40
    assert len((SERIES / "BASE-TREE").read_text().strip()) == 40
    rows = patchcheck.read_base_files(SERIES)
    assert {r.path for r in rows} >= {
        "drivers/ub/urma/uburma/uburma_cmd.c",
        "drivers/ub/urma/ubcore/ubcore_segment.c",
        "include/ub/urma/ubcore_types.h",
    }
    base = (SERIES / "BASE").read_text().strip()
    assert {r.commit for r in rows} == {base}


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
    report = patchcheck.run_static(series, series / "no-baseline")
    capsys.readouterr()
    assert any("base-commit" in ln and "no 'base-commit:'" in ln for ln in report.lines)
    assert report.failed


def test_hunks_are_listed_with_their_file() -> None:
    _, patches = patchcheck.load_series(SERIES)
    hunks = patches[2].hunks()
    assert hunks
    assert {f for f, _ in hunks} <= {
        "drivers/ub/urma/ubcore/ubcore_segment.c",
        "include/ub/urma/ubcore_types.h",
    }
    assert all(h.startswith("@@ -") for _, h in hunks)


def test_an_am_failure_names_the_patch_and_its_hunk() -> None:
    _, patches = patchcheck.load_series(SERIES)
    file, header = patches[2].hunks()[1]
    line = header.split()[1].split(",")[0].lstrip("-")
    output = (
        "Applying: ub: ubcore: honour URMA_SEG_MAPPED in ubcore_import_seg\n"
        "Using index info to reconstruct a base tree...\n"
        f"error: patch failed: {file}:{line}\n"
        f"error: {file}: patch does not apply\n"
        "Patch failed at 0003 ub: ubcore: honour URMA_SEG_MAPPED in ubcore_import_seg\n"
    )
    detail = patchcheck.describe_am_failure(output, patches)
    assert detail == f"{patches[2].name}: hunk '{header}' of {file} does not apply"


def test_recipients_come_from_the_matching_maintainers_entries() -> None:
    text = """\
List of maintainers

UB URMA
M:\tAlice Core <alice@example.org>
R:\tRita Review <rita@example.org>
L:\tkernel@openeuler.org
S:\tMaintained
F:\tdrivers/ub/urma/
F:\tinclude/ub/urma/

UB URMA UDMA DRIVER
M:\tUma Dee <uma@example.org>
F:\tdrivers/ub/urma/hw/udma/

UB OBMM
M:\tOtto Bmm <otto@example.org> (the OBMM driver)
L:\tkernel@openeuler.org
F:\tdrivers/ub/obmm/
X:\tdrivers/ub/obmm/excluded.c

THE REST
M:\tAlice Core <alice@example.org>
F:\tdrivers/ub/*.c
"""
    got = patchcheck.maintainers(
        text, ["drivers/ub/urma/ubcore/ubcore_seg_map.c", "include/ub/urma/ubcore_api.h"]
    )
    assert got.to == ("Alice Core <alice@example.org>",)
    assert got.cc == ("Rita Review <rita@example.org>", "kernel@openeuler.org")
    assert got.sections == ("UB URMA",)
    assert patchcheck.maintainers(text, ["drivers/ub/obmm/excluded.c"]).to == ()
    assert patchcheck.maintainers(text, ["drivers/ub/obmm/obmm_core.c"]).to == (
        "Otto Bmm <otto@example.org>",
    )
    # A wildcard does not reach into subdirectories, as get_maintainer.pl reads F: lines.
    assert patchcheck.maintainers(text, ["drivers/ub/x/y.c"]).to == ()
    top = patchcheck.maintainers(text, ["drivers/ub/y.c"])
    assert top.to == ("Alice Core <alice@example.org>",)


def test_the_testing_block_replaces_the_last_one_before_the_signoff() -> None:
    body = "Text.\n\nSigned-off-by: A B <a@example.org>\n"
    once = patchcheck.with_testing(body, ["  tree: one"])
    twice = patchcheck.with_testing(once, ["  tree: two", "  kernel: k"])
    assert twice == (
        "Text.\n\n"
        f"{patchcheck.TESTING_HEADER}\n  tree: two\n  kernel: k\n\n"
        "Signed-off-by: A B <a@example.org>\n"
    )
    assert patchcheck.strip_testing(twice) == body


def test_the_cover_text_is_its_subject_and_body_without_the_testing_block() -> None:
    cover, _ = patchcheck.load_series(SERIES)
    assert cover is not None
    subject, body = patchcheck.cover_text(cover)
    assert subject == "ub: make URMA_SEG_MAPPED segment imports work"
    assert patchcheck.TESTING_HEADER not in body
    assert body.startswith("URMA lets an importer")
    assert body.rstrip().endswith(">")  # the sign-off, not the shortlog
    assert "(5):" not in body


@pytest.mark.slow
@NEEDS_TOOLS
def test_pristine_series_passes_and_baseline_skips_without_a_tree(
    series: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = patchcheck.run_static(series, series / "no-baseline")
    out = capsys.readouterr().out
    assert not report.failed, out
    assert sum(ln.startswith("PASS    checkpatch") for ln in report.lines) == 5
    line = next(ln for ln in report.lines if " baseline-apply " in ln)
    assert line.startswith("NOT RUN"), line


@pytest.mark.slow
@NEEDS_TOOLS
def test_without_the_tree_the_command_says_so_in_one_line_and_passes(
    series: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-tree"
    assert patchcheck.main(["--series-dir", str(series), "--upstream", str(missing)]) == 0
    out = capsys.readouterr().out.splitlines()
    about_tree = [ln for ln in out if str(missing) in ln or "baseline-apply" in ln]
    assert about_tree == [patchcheck.skip_line(missing)]
    assert about_tree[0].startswith("NOT RUN") and envvars.UB_UPSTREAM.name in about_tree[0]
    # ... and the line make test lists at its end.
    (noted,) = paths.skipped_inputs_file().read_text().splitlines()
    assert noted.startswith("patch-check (") and paths.is_input_skip(noted), noted
    assert out[-1] == "patch-check: 22 passed, 0 failed, 1 not run"


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


@NEEDS_TREE
def test_baseline_apply(series: Path, tmp_path: Path) -> None:
    """Against the pinned tree: pass when its files are the pinned ones, fail when one differs."""
    base = tmp_path / "baseline"
    _, patches = patchcheck.load_series(series)
    rows = patchcheck.read_base_files(series)
    for r in rows:
        (base / r.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(UPSTREAM / r.path, base / r.path)
    status, detail = patchcheck.check_baseline(series, base, patches)
    assert status == "PASS", detail
    target = base / rows[-1].path
    target.write_text(target.read_text().replace("\n", "\n ", 1))
    status, detail = patchcheck.check_baseline(series, base, patches)
    assert status == "FAIL" and "differs" in detail


@NEEDS_TREE
def test_the_series_applies_to_the_pinned_tree_with_git_am(
    series: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = patchcheck.Report()
    tree = patchcheck.run_upstream_am(series, UPSTREAM, tmp_path / "tree", report)
    capsys.readouterr()
    assert tree is not None, report.lines
    assert tree.pinned and tree.commit == (series / "BASE").read_text().strip()
    assert report.lines[-1].startswith("PASS    upstream-am")
    log = subprocess.run(
        ["git", "-C", str(tree.path), "log", "--format=%s", f"{tree.base}..HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert len(log) == 5 and log[-1].startswith("ub: uburma: pass the import flag")
    added = patchcheck.added_lines(tree)
    new_file = "drivers/ub/urma/ubcore/ubcore_seg_map.c"
    assert added[new_file] == set(range(1, len((tree.path / new_file).read_text().split("\n"))))
    uburma = added["drivers/ub/urma/uburma/uburma_cmd.c"]
    assert 0 < len(uburma) < 20


@NEEDS_TREE
def test_a_broken_hunk_fails_git_am_naming_the_hunk(
    series: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One context line of one hunk of patch 3 no longer matches the tree: that hunk is named,
    and the scratch tree is left at its base (the am is aborted)."""
    patch = next(series.glob("0003-*.patch"))
    _, patches = patchcheck.load_series(series)
    file, header = next(h for h in patches[2].hunks() if "ubcore_import_seg" in h[1])
    text = patch.read_text()
    hunk_at = text.index(header)
    context = text.index("\n \t", hunk_at) + 1  # the hunk's first context line
    patch.write_text(text[:context] + " \t/* not in the tree */" + text[context + 2 :])

    report = patchcheck.Report()
    tree = patchcheck.run_upstream_am(series, UPSTREAM, tmp_path / "tree", report)
    capsys.readouterr()
    assert tree is None
    line = report.lines[-1]
    assert line.startswith("FAIL    upstream-am"), line
    assert f"{patch.name}: hunk '{header}' of {file} does not apply" in line


@NEEDS_TREE
def test_the_generated_set_carries_testing_recipients_and_the_base(
    series: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """format_series + write_series_files on a copy of the pinned tree given a MAINTAINERS:
    a series directory that passes the checks again, with To/Cc and the Testing block."""
    upstream = tmp_path / "upstream"
    # Its files only: a git checkout's clone would leave out the uncommitted MAINTAINERS.
    shutil.copytree(UPSTREAM, upstream, ignore=shutil.ignore_patterns(".git"))
    (upstream / "MAINTAINERS").write_text(
        "UB URMA\nM:\tAlice Core <alice@example.org>\nL:\tlist@example.org\nF:\tdrivers/ub/urma/\n"
    )
    report = patchcheck.Report()
    tree = patchcheck.run_upstream_am(series, upstream, tmp_path / "tree", report)
    assert tree is not None, report.lines
    assert not tree.pinned  # the MAINTAINERS file makes it another tree
    cover, _ = patchcheck.load_series(series)
    assert cover is not None
    maintainers = (tree.path / "MAINTAINERS").read_text()
    modified, added = patchcheck.changed_files(tree)
    recipients = patchcheck.maintainers(maintainers, modified + added)
    base = (series / "BASE").read_text().strip()
    out = tmp_path / "outgoing"
    files = patchcheck.format_series(
        tree, cover, out, testing=["  tree: here"], recipients=recipients, base_commit=base
    )
    patchcheck.write_series_files(tree, out, base)
    assert [f.name for f in files] == sorted(p.name for p in series.glob("0*.patch"))
    letter = (out / "0000-cover-letter.patch").read_text()
    assert "Subject: [PATCH OLK-6.6 0/5] ub: make URMA_SEG_MAPPED segment imports work" in letter
    assert f"\n{patchcheck.TESTING_HEADER}\n  tree: here\n\nSigned-off-by:" in letter
    assert "To: Alice Core <alice@example.org>" in letter and "Cc: list@example.org" in letter
    assert f"base-commit: {base}" in letter
    assert (out / "series").read_text() == (series / "series").read_text()
    for f in files[1:]:
        # The patches themselves are the series' own, byte for byte below the mail headers.
        assert (
            f.read_text().split("\n\n", 1)[1] == (series / f.name).read_text().split("\n\n", 1)[1]
        )
    capsys.readouterr()
    again = patchcheck.run_static(out, upstream, patchcheck.Report(quiet=True))
    assert not again.failed, again.lines
