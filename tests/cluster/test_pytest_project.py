"""examples/pytest-project run as a user runs it, with the plugin's checks proven on it.

The project is copied to a directory outside the checkout together with
``pytest_project_bad/deliberately_bad.py`` (a test that makes the kernel WARN through
obmm_testhook.ko, one that leaks an export, one that checks the next test starts clean), and
one ``pytest`` subprocess runs it all on one 2-node cluster (restored from a snapshot when one
fits).  The project's own tests pass; the WARN fails its test with the kernel excerpt; the leak
fails its test naming the region, which the plugin removed.  Nothing is left behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from obmm.testbed.paths import repo_root, run_root
from obmm.testbed.settings import scaled
from obmm.testbed.vm.cluster import RUN_PREFIX

pytestmark = pytest.mark.emulator_only  # obmm_testhook.ko, and the plugin boots QEMU nodes

PROJECT = repo_root() / "examples" / "pytest-project"
BAD = Path(__file__).resolve().parent / "pytest_project_bad" / "deliberately_bad.py"
BUDGET_S = 90


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test name -> (passed | failed | error, the failure texts)."""
    found: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [(c.tag, (c.get("message") or "") + "\n" + (c.text or "")) for c in case]
        bad = [(tag, text) for tag, text in kinds if tag in ("failure", "error")]
        tag = "error" if any(t == "error" for t, _ in bad) else "failed" if bad else "passed"
        if any(t == "skipped" for t, _ in kinds):
            tag = "skipped"
        found[case.get("name", "")] = (tag, "\n".join(text for _, text in bad))
    return found


def test_the_example_project_passes_and_the_checks_fail_bad_tests(tmp_path: Path) -> None:
    work = tmp_path / "pytest-project"
    shutil.copytree(PROJECT, work, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    shutil.copy(BAD, work / "tests" / "test_deliberately_bad.py")
    junit = tmp_path / "junit.xml"
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        stdout, _ = proc.communicate(timeout=scaled(600))
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: pytest unwinds and the plugin stops its cluster
        stdout, _ = proc.communicate(timeout=60)
        raise
    wall = time.monotonic() - t0
    print(f"pytest examples/pytest-project (+ the bad tests): {wall:.1f} s\n{stdout[-6000:]}")
    outcomes = _outcomes(junit)
    good = [n for n in outcomes if not n.startswith(("test_a_kernel", "test_a_leaked"))]
    assert len(good) == 5, outcomes
    for name in good:
        assert outcomes[name][0] == "passed", f"{name}: {outcomes[name]}\n{stdout[-4000:]}"
    assert proc.returncode == 1, stdout[-4000:]

    warn_kind, warn_text = outcomes["test_a_kernel_warn_fails_this_test"]
    assert warn_kind == "error", warn_text  # at teardown, where the guard looks
    assert "kernel report during the test" in warn_text and "node1 kernel reports" in warn_text
    assert "WARN requested by test" in warn_text  # the kernel's own excerpt

    leak_kind, leak_text = outcomes["test_a_leaked_export_fails_the_leak_check"]
    assert leak_kind == "error", leak_text
    assert "leak check: node0: the test left regions export " in leak_text
    assert "pool used 0x0 -> 0x200000 (removed)" in leak_text
    assert "kernel report" not in leak_text
    # ...and test_the_next_test_starts_clean passed (in `good`): no region on any node.

    # Nothing left: no run directory (QEMU gone), no consoles of a green cluster.
    assert not list(run_root().glob(f"{RUN_PREFIX}pytest-{proc.pid}-*"))
    # The budget is BUDGET_S; CI hosts vary, and a busy or slower machine says so by the scale.
    assert wall < scaled(BUDGET_S * 2), f"{wall:.0f} s"
