"""obmm.tools.printk_formats: the format strings of a C file's log calls, and the emulator's
lines that claim the real driver's format, compared with the pinned upstream source.

The upstream tree is an input given by path (:func:`obmm.testbed.paths.ub_upstream_dir`);
without it the comparison skips with one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from obmm.testbed import paths
from obmm.tools.printk_formats import log_calls, tree_log_calls

EMU = Path(__file__).resolve().parents[3] / "kmod" / "obmm_emu"
UPSTREAM_OBMM = (paths.ub_upstream_dir() or Path("/nonexistent")) / "drivers" / "ub" / "obmm"
MISSING = paths.ub_upstream_missing("test_printk_formats", "drivers/ub/obmm")
NEEDS_TREE = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

#: Lines the emulator logs in the real driver's format (kmod/obmm_emu/FIDELITY.md): real file,
#: emulator file, level, format.
SAME_FORMAT = [
    ("obmm_core.c", "core.c", "info", "obmm_module: init started"),
    ("obmm_core.c", "core.c", "info", "ub_feature: %#llx, obmm_enabled: %ld"),
    ("obmm_core.c", "core.c", "info", "obmm_module: init completed"),
    ("obmm_core.c", "core.c", "info", "obmm_module: exit started"),
    ("obmm_core.c", "core.c", "info", "obmm_module: exit completed"),
]

SAMPLE = r"""
#define pr_fmt(fmt) "X: " fmt
/* pr_err("in a comment\n"); */
static void f(int a)
{
    pr_err("two " "literals %d\n", a);   // pr_info("nor here")
    pr_warn_ratelimited("rate " EID_FMT " id\n", a);
    pr_info(fmt_var, a);
    my_log("OP", -EINVAL, "wrapped %s",
           "x");
}
"""


def test_log_calls_joins_literals_expands_macros_and_skips_comments(tmp_path: Path) -> None:
    src = tmp_path / "a.c"
    src.write_text(SAMPLE)
    calls = log_calls(src, macros={"EID_FMT": "%#llx"}, wrappers={"my_log": ("err", 2)})
    assert [(c.line, c.level, c.fmt) for c in calls] == [
        (6, "err", r"two literals %d\n"),
        (7, "warn", r"rate %#llx id\n"),
        (9, "err", "wrapped %s"),
    ]
    assert calls[0].text == "two literals %d"
    # an unknown macro is kept by name, so a comparison cannot match it by accident
    assert log_calls(src)[1].fmt == r"rate <EID_FMT> id\n"


@NEEDS_TREE
def test_the_real_formats_the_emulator_claims_are_the_real_drivers() -> None:
    """Each line FIDELITY.md calls the same: the format is in the real file at that level, and
    the emulator's file logs exactly it at that level."""
    for real_file, emu_file, level, fmt in SAME_FORMAT:
        real = {(c.level, c.text) for c in log_calls(UPSTREAM_OBMM / real_file)}
        ours = {(c.level, c.text) for c in log_calls(EMU / emu_file)}
        assert (level, fmt) in real, (real_file, fmt)
        assert (level, fmt) in ours, (emu_file, fmt)


@NEEDS_TREE
def test_the_pinned_driver_has_the_refusal_lines_users_grep_for() -> None:
    """The extraction reads the whole pinned driver (the input of a full comparison)."""
    calls = tree_log_calls(UPSTREAM_OBMM.glob("*.c"))
    texts = {c.text for c in calls if c.level == "err"}
    assert "%#x is not a known scna, lookup ret=%pe" in texts
    assert "obmm feature not enabled" in texts
    assert len(calls) > 100
