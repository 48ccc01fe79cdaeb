"""The real driver against the emulator: ``results/real-vs-emu.md`` and ``.json``
(``make real-driver-test`` writes them).

Inputs are the suites' junit files: the emulator's (``make qemu-test``: results/qemu-junit.xml,
results/cluster-junit.xml) and the real driver's (``make real-driver-test``:
results/real-qemu-junit.xml, results/real-cluster-junit.xml), and ``make fuzz-diff``'s
results/fuzz-diff.json when there is one.  Per test file: how many tests passed on both
drivers, passed on the real one where the emulator's run is missing, differ (failed or are an
expected failure on the real driver: each with its reason) or were skipped there (and why).
Per fuzz operation kind: passed on both, differs (why), skipped (why).

``python -m obmm.testbed.stages.realreport [--check-upstream [--step NAME]]``: the report from the
default files; ``--check-upstream`` instead says in one line whether an upstream tree is given
(exit 1 when not, so a make target can skip; the line, ``NAME: skipped: ...``, also goes to
:func:`obmm.testbed.paths.skipped_inputs_file`).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from obmm.testbed import paths
from obmm.testbed.builds import kbuild

EMU_JUNIT = ("qemu-junit.xml", "cluster-junit.xml")
REAL_JUNIT = ("real-qemu-junit.xml", "real-cluster-junit.xml")
FUZZ_JSON = "fuzz-diff.json"
REPORT = "real-vs-emu"
#: A reason is cut to this many characters in the markdown table (the JSON keeps it whole).
REASON_CHARS = 160


@dataclass(frozen=True)
class Result:
    """One test's outcome in one run: passed, failed, skipped or xfailed, and why."""

    outcome: str
    reason: str = ""


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _failure_reason(failure: ET.Element) -> str:
    """The assertion's line (pytest's ``E   ...``), else the message's first line."""
    for line in (failure.text or "").splitlines():
        if line.startswith("E "):
            return line[1:].strip()
    return _first_line(failure.get("message")) or "failed"


def read_junit(path: Path) -> dict[str, Result]:
    """Test id -> outcome of a junit file (guest tests are named by their guest node id)."""
    out: dict[str, Result] = {}
    if not path.is_file():
        return out
    for case in ET.parse(path).iter("testcase"):
        test = f"{test_file(case.get('classname', ''))}::{case.get('name') or ''}"
        skipped = case.find("skipped")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if skipped is not None:
            message = (skipped.get("message") or "").removeprefix("Skipped: ")
            outcome = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
            out[test] = Result(outcome, message)
        elif failure is not None:
            out[test] = Result("failed", _failure_reason(failure))
        else:
            out[test] = Result("passed")
    return out


def read_runs(directory: Path, names: Iterable[str]) -> dict[str, Result]:
    merged: dict[str, Result] = {}
    for name in names:
        merged.update(read_junit(directory / name))
    return merged


def test_file(classname: str) -> str:
    """The test file of a junit class name: a guest test's carries its path
    (``tests.qemu.guest.guestsuite.tests/guest/test_x.py``), a host-side one is dotted
    (``tests.cluster.test_xnode``, or ``...test_xnode.TestClass``)."""
    if "/" in classname:
        return classname[classname.index("tests/") :] if "tests/" in classname else classname
    parts = classname.split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()
    return "/".join(parts) + ".py" if parts else classname


@dataclass
class FileRow:
    passed_both: int = 0
    passed_real: int = 0  # the emulator's run of it is missing
    differs: dict[str, str] = field(default_factory=dict)  # test -> why
    skipped: dict[str, int] = field(default_factory=dict)  # why -> count


def compare_runs(emu: Mapping[str, Result], real: Mapping[str, Result]) -> dict[str, FileRow]:
    rows: dict[str, FileRow] = {}
    for test, got in sorted(real.items()):
        row = rows.setdefault(test.split("::")[0], FileRow())
        short = test.split("::")[-1]
        if got.outcome == "passed":
            if test in emu and emu[test].outcome == "passed":
                row.passed_both += 1
            elif test in emu:
                row.differs[short] = (
                    f"passes on the real driver, {emu[test].outcome} on the emulator"
                )
            else:
                row.passed_real += 1
        elif got.outcome == "skipped":
            row.skipped[got.reason] = row.skipped.get(got.reason, 0) + 1
        else:
            row.differs[short] = f"{got.outcome}: {got.reason}"
    return rows


def fuzz_rows(fuzz: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(fuzz.get("per_kind", {})) if fuzz else {}


def summary(rows: Mapping[str, FileRow]) -> dict[str, int]:
    total = {"passed_both": 0, "passed_real": 0, "differs": 0, "skipped": 0}
    for row in rows.values():
        total["passed_both"] += row.passed_both
        total["passed_real"] += row.passed_real
        total["differs"] += len(row.differs)
        total["skipped"] += sum(row.skipped.values())
    return total


def _cut(text: str) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def markdown(rows: Mapping[str, FileRow], fuzz: Mapping[str, Any] | None, emu_present: bool) -> str:
    total = summary(rows)
    ran = total["passed_both"] + total["passed_real"] + total["differs"]
    passed = total["passed_both"] + total["passed_real"]
    lines = [
        "# The real obmm.ko against the emulator",
        "",
        "Upstream's drivers/ub/obmm over kmod/ub_compat, against kmod/obmm_emu, on the same "
        "suites.",
        "",
        f"Tests run on the real driver (not skipped): {ran}; passed {passed}"
        + (f" ({100 * passed / ran:.1f}%)" if ran else "")
        + f"; differ {total['differs']}; skipped {total['skipped']}.",
    ]
    if not emu_present:
        lines.append("The emulator's junit files were not found: 'passed' is the real driver's.")
    lines += [
        "",
        "| test file | passed on both | passed (real; emulator not run) | differs (why) "
        "| skipped (why) |",
        "|---|---|---|---|---|",
    ]
    for name, row in sorted(rows.items()):
        differs = "<br>".join(f"{t}: {_cut(why)}" for t, why in row.differs.items()) or "0"
        skipped = "<br>".join(f"{n} {_cut(why)}" for why, n in row.skipped.items()) or "0"
        lines.append(f"| {name} | {row.passed_both} | {row.passed_real} | {differs} | {skipped} |")
    per_kind = fuzz_rows(fuzz)
    if per_kind and fuzz is not None:
        lines += [
            "",
            f"## Fuzzer operations (make fuzz-diff: seed {fuzz.get('seed')}, "
            f"{fuzz.get('compared')} of {fuzz.get('ops')} operations compared)",
            "",
            "| operation | passed on both | differs (why) | skipped (why) |",
            "|---|---|---|---|",
        ]
        for kind, entry in sorted(per_kind.items()):
            differs = "; ".join(f"{n} {w}" for w, n in entry["differs"].items()) or "0"
            skipped = "; ".join(f"{n} {w}" for w, n in entry["skipped"].items()) or "0"
            lines.append(f"| {kind} | {entry['passed']} | {differs} | {skipped} |")
        if fuzz.get("unexplained"):
            u = fuzz["unexplained"]
            lines.append(
                f"\nFirst unexplained difference: operation {u['op']} ({u['kind']}), "
                f"reproducer --only {u.get('reproducer', '?')}."
            )
    return "\n".join(lines) + "\n"


def write(results: Path, out: Path | None = None) -> tuple[Path, dict[str, int]]:
    """The report from the junit files and fuzz-diff result in ``results``."""
    emu = read_runs(results, EMU_JUNIT)
    real = read_runs(results, REAL_JUNIT)
    if not real:
        raise FileNotFoundError(f"no real-driver junit file in {results} ({', '.join(REAL_JUNIT)})")
    fuzz_path = results / FUZZ_JSON
    fuzz = json.loads(fuzz_path.read_text()) if fuzz_path.is_file() else None
    rows = compare_runs(emu, real)
    base = out or results / REPORT
    base.with_suffix(".md").write_text(markdown(rows, fuzz, bool(emu)))
    totals = summary(rows)
    doc = {
        "summary": totals,
        "files": {
            name: {
                "passed_on_both": row.passed_both,
                "passed_real_emulator_not_run": row.passed_real,
                "differs": row.differs,
                "skipped": row.skipped,
            }
            for name, row in sorted(rows.items())
        },
        "fuzz": fuzz_rows(fuzz),
    }
    base.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    return base.with_suffix(".md"), totals


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m obmm.testbed.stages.realreport", description=__doc__
    )
    p.add_argument("--check-upstream", action="store_true")
    p.add_argument("--step", default="real driver", help="who --check-upstream speaks for")
    p.add_argument("--results", type=Path, default=None)
    args = p.parse_args(argv)
    if args.check_upstream:
        try:
            tree = kbuild.check_upstream(paths.ub_upstream_dir())
        except kbuild.UpstreamMissing as exc:
            print(paths.note_input_skip(f"{args.step}: skipped: {exc}"))
            return 1
        print(f"real driver: upstream tree {tree}")
        return 0
    path, totals = write(args.results or paths.results_dir())
    print(f"{path}: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
