"""Every refusal path of kmod/obmm_emu logs the real driver's line for its check, as the table of
facts :mod:`obmm.driver_log` lists them, or a line of its own that the table says why; and the
table holds against an upstream tree when one is given (skipped with one line otherwise).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from obmm import driver_log
from obmm.testbed import paths
from obmm.tools.csource import functions
from obmm.tools.printk_formats import LogCall, log_calls

EMU = Path(__file__).resolve().parents[3] / "kmod" / "obmm_emu"
UPSTREAM_OBMM = (paths.ub_upstream_dir() or Path("/nonexistent")) / "drivers" / "ub" / "obmm"
MISSING = paths.ub_upstream_missing("test_refusal_lines", "drivers/ub/obmm")
NEEDS_TREE = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

#: The refusal log's macros (obmm_emu.h): the real line (obmm_refuse, and obmm_klog for a
#: second line) or the emulator's own (obmm_refuse_emu); the format's argument index.
WRAPPERS = {"obmm_refuse": ("real", 2), "obmm_klog": ("real", 0), "obmm_refuse_emu": ("own", 2)}
EMU_MACROS = {"OBMM_EID_FMT64": driver_log.MACROS["EID_FMT64"]}


def refusal_calls() -> list[LogCall]:
    calls = []
    for f in sorted(EMU.glob("*.c")):
        found = log_calls(f, macros=EMU_MACROS, wrappers=WRAPPERS)
        calls += [c for c in found if c.level in ("real", "own")]
    return calls


def where(c: LogCall) -> str:
    return f"{Path(c.path).name}:{c.line}"


def test_every_refusal_path_logs_a_line_of_the_table() -> None:
    calls = refusal_calls()
    assert len(calls) > 100  # the scan sees the refusal paths
    real = driver_log.real_formats()
    wrong = [
        (where(c), c.text)
        for c in calls
        if (c.level == "real" and c.text not in real)
        or (c.level == "own" and c.text not in driver_log.EMULATOR_OWN)
    ]
    assert wrong == []


def test_every_fact_of_the_table_is_logged_somewhere() -> None:
    used = {(c.level, c.text) for c in refusal_calls()}
    assert [f for f in driver_log.real_formats() if ("real", f) not in used] == []
    assert [f for f in driver_log.EMULATOR_OWN if ("own", f) not in used] == []


def test_the_table_is_well_formed() -> None:
    assert not set(driver_log.real_formats()) & set(driver_log.EMULATOR_OWN)
    for line in driver_log.REAL:
        assert line.level == "err"
        assert not line.fmt.endswith("\\n"), line.fmt
        assert line.where and all(re.fullmatch(r"\w+\.c:\w+", w) for w in line.where), line


def test_the_emulator_logs_with_the_real_prefix_and_level() -> None:
    header = (EMU / "obmm_emu.h").read_text()
    m = re.search(r'#define OBMM_LOG_PREFIX\s+"([^"]*)"', header)
    assert m and m.group(1) == driver_log.PREFIX
    assert re.search(r"printk_ratelimited\(KERN_ERR OBMM_LOG_PREFIX fmt", header)
    # the own lines say so, with the operation and the errno
    assert '"emulator: %s refused (%pe): " fmt' in header


@NEEDS_TREE
def test_the_table_is_the_real_drivers() -> None:
    """Each fact: the cited function of the cited file logs that format at that level."""
    missing = []
    for line in driver_log.REAL:
        for w in line.where:
            file, func = w.split(":")
            src = UPSTREAM_OBMM / file
            bodies = [f for f in functions(src) if f.name == func] if src.is_file() else []
            spans = [(f.line, f.line + f.body.count("\n")) for f in bodies]
            calls = log_calls(src, macros=driver_log.MACROS) if src.is_file() else []
            if not any(
                c.level == line.level
                and c.text == line.fmt
                and any(a <= c.line <= b for a, b in spans)
                for c in calls
            ):
                missing.append((w, line.fmt))
    assert missing == []


@NEEDS_TREE
def test_the_pinned_prefix_is_the_real_drivers() -> None:
    assert (
        f'#define pr_fmt(fmt) "{driver_log.PREFIX}" fmt'
        in (UPSTREAM_OBMM / "obmm_core.h").read_text()
    )


def test_a_sub_prefix_is_its_files() -> None:
    """The addr_check: lines are obmm_addr_check.c's, and the emulator logs them whole."""
    subbed = [line for line in driver_log.REAL if line.sub]
    assert subbed
    for line in subbed:
        assert line.sub == driver_log.ADDR_CHECK and line.files == {"obmm_addr_check.c"}, line
        assert line.text == line.sub + line.fmt
    used = {c.text for c in refusal_calls() if c.level == "real"}
    assert "addr_check:failed to occupy PA range: ret=%pe" in used


@NEEDS_TREE
def test_the_sub_prefixes_are_the_real_files_pr_fmt() -> None:
    for line in driver_log.REAL:
        for file in line.files:
            text = (UPSTREAM_OBMM / file).read_text()
            has_own = re.search(r"#define pr_fmt\(fmt\)", text)
            if line.sub:
                assert f'#define pr_fmt(fmt) "{driver_log.PREFIX}{line.sub}" fmt' in text, line
            else:
                assert not has_own or f'"{driver_log.PREFIX}" fmt' in text, (file, line)
