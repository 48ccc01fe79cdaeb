"""The Makefile spells each suite selection once (issue 33): qemu-test, real-driver-test and
debug-test take them from the same variables, the real driver's cluster suite leaves out the
fuzz-marked cross-node fuzzer as qemu-test's does, and the debug kernel's two runs are exactly
qemu-test's four selections.  What a cluster selection holds is read from pytest's collection."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from obmm import envvars
from obmm.testbed.paths import repo_root

ROOT = repo_root()
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make_var(name: str) -> list[str]:
    """A Makefile variable's value, as the shell splits it."""
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", f"print-var: ; @echo '$({name})'",
         "print-var"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return shlex.split(out.replace("'", '"'))


def collected(selection: list[str], env: dict[str, str] | None = None) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         *selection],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]
    return {ln for ln in done.stdout.splitlines() if "::" in ln}


def recipes() -> str:
    text = (ROOT / "Makefile").read_text() + (ROOT / "ci" / "debug.mk").read_text()
    return text.replace("\\\n", " ")


def test_each_selection_is_spelled_once() -> None:
    text = recipes()
    # Marker expressions of the suites live in the *_MARKS variables only.
    spelled = [ln for ln in text.splitlines() if re.search(r'-m "not ', ln)]
    assert spelled == [], spelled
    for target, selections in {
        "qemu-test": ("GUEST_JOB", "CLUSTER_JOB", "TRUST_JOB", "HW_STAGE_JOB"),
        "real-driver-test": ("GUEST_SUITE", "CLUSTER_SUITE"),
        "debug-test": ("GUEST_ALL", "CLUSTER_ALL"),
    }.items():
        for var in selections:
            assert f"$({var})" in recipe(text, target), (target, var)
    for job in ("GUEST_JOB", "CLUSTER_JOB", "TRUST_JOB", "HW_STAGE_JOB"):
        suite = job.replace("_JOB", "_SUITE")
        defined = text.split(f"\n{job} = ", 1)[1].split("\n", 1)[0]
        assert f"$({suite})" in defined, job
    assert "image kmod KBUILD_ARGS=--reuse" not in text  # one prerequisite: suite-build


def recipe(text: str, target: str) -> str:
    return text.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]


def jobs(text: str, target: str) -> list[str]:
    """The commands of a side-by-side recipe's jobs and steps (NAME=... and NAME+=...)."""
    return re.findall(r"'[\w-]+\+?=([^']*)'", recipe(text, target))


def test_make_tests_vm_stage_runs_exactly_the_jobs_of_qemu_test_and_testbed_and_hw_proof() -> None:
    """make test runs the two stages' jobs in lanes (vm-suites): each of them once, no other."""
    text = recipes()
    two = jobs(text, "qemu-test") + jobs(text, "testbed-and-hw-proof")
    lanes = jobs(text, "vm-suites")
    assert len(two) == 8 and sorted(lanes) == sorted(two)
    assert "for stage in vm-suites real-driver-test;" in text


def test_the_cluster_suites_leave_out_the_fuzzer_and_debug_test_runs_what_qemu_test_does() -> None:
    # Collecting tests/cluster loads no node (collecting tests/qemu would boot one to list the
    # guest tests: the guest selections are compared as spelled).
    cluster = collected(make_var("CLUSTER_SUITE"))
    trust = collected(make_var("TRUST_SUITE"))
    assert cluster and trust
    assert not any("test_fuzz_xnode" in item for item in cluster | trust)
    assert not any("test_ctl_trust" in item for item in cluster)
    assert collected(make_var("CLUSTER_ALL")) == cluster | trust
    guest_all, guest, hw_stage = (
        make_var(v) for v in ("GUEST_ALL", "GUEST_SUITE", "HW_STAGE_SUITE")
    )
    assert guest == [*guest_all, "--ignore=tests/qemu/test_hw_stage.py"]
    assert hw_stage == ["tests/qemu/test_hw_stage.py", *guest_all[1:]]


def test_the_cluster_suite_in_parts_takes_each_test_once_split_by_recorded_seconds(
    tmp_path,
) -> None:
    suite = make_var("CLUSTER_SUITE")
    whole = collected(suite)
    # A file that took as long as all the others together is one part, the others the other
    # part (of two).
    heavy = {t for t in whole if t.startswith("tests/cluster/test_coherence_xnode.py::")}
    rest = whole - heavy
    assert heavy and rest
    weights = {**dict.fromkeys(heavy, 600.0 / len(heavy)), **dict.fromkeys(rest, 600.0 / len(rest))}
    (tmp_path / "cluster-durations.json").write_text(json.dumps(weights))
    env = {envvars.RESULTS.name: str(tmp_path)}
    one, two = (collected(suite, {**env, envvars.CLUSTER_SHARD.name: f"{i}/2"}) for i in (1, 2))
    assert one | two == whole
    assert {frozenset(one), frozenset(two)} == {frozenset(heavy), frozenset(rest)}
    parts = [collected(suite, {**env, envvars.CLUSTER_SHARD.name: f"{i}/3"}) for i in (1, 2, 3)]
    assert sum(len(p) for p in parts) == len(whole) and set().union(*parts) == whole
