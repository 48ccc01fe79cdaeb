"""obmm_emu's test-only module parameters exist only in the build the project's suites load.

``test_*`` parameters widen race windows for guest tests (a delay before EXPORT_PID pins, the
zero worker holding its granule, module exit pausing after the fabric's teardown).  Writable at
run time in the module users load, they could stall an unload for minutes or hold another
process's mm; so each is compiled only under ``#ifdef OBMM_EMU_TEST``, which the suites' build
sets (``OBMM_EMU_TEST=y`` -> Kbuild -> ``-DOBMM_EMU_TEST``; obmm.testbed.provision).
"""

from __future__ import annotations

import re
from pathlib import Path

from obmm.testbed import provision

KMOD = Path(__file__).resolve().parents[3] / "kmod" / "obmm_emu"
PARAM_RE = re.compile(r"^\s*module_param(?:_named)?\(\s*(test_\w+)")


def test_no_test_param_outside_the_test_build() -> None:
    found: dict[str, list[str]] = {}
    for path in sorted(KMOD.glob("*.c")):
        depth: list[bool] = []  # one entry per open #if: inside the test build only?
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith("#if"):
                depth.append(stripped == "#ifdef OBMM_EMU_TEST")
            elif stripped.startswith("#else"):
                depth[-1] = False
            elif stripped.startswith("#endif"):
                depth.pop()
            m = PARAM_RE.match(line)
            if m:
                where = "test build" if any(depth) else "every build"
                found.setdefault(where, []).append(f"{path.name}:{lineno} {m.group(1)}")
    assert "every build" not in found, found["every build"]
    # the hooks the guest tests use are there, in the test build
    names = {entry.split()[-1] for entry in found.get("test build", [])}
    assert {
        "test_pin_delay_ms",
        "test_zero_delay_ms",
        "test_exit_delay_ms",
        "test_mmap_delay_ms",
        "test_map_fail",
    } <= names


def test_the_suites_build_sets_the_flag_kbuild_reads() -> None:
    kbuild = (KMOD / "Kbuild").read_text()
    ((var, value),) = provision.TEST_HOOKS_VARS.items()
    assert f"ccflags-$({var}) += -DOBMM_EMU_TEST" in kbuild
    assert value == "y"
