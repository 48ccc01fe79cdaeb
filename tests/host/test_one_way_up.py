"""One bring-up: every front end comes up through obmm.testbed.session.bring_up, and nothing else
repeats its sequence (start a cluster, provision it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The front ends the issue of one bring-up names, by file.
FRONT_ENDS = {
    "guest suite": "pylib/obmm/testbed/suite/guest_suite.py",
    "cluster suite": "tests/cluster/conftest.py",
    "pytest plugin": "pylib/obmm/testbed/usercluster.py",
    "obmm-testbed run": "pylib/obmm/testbed/cli/run.py",
    "obmm-testbed up": "pylib/obmm/testbed/cli/commands.py",
    "bench": "pylib/obmm/bench/cluster_hook.py",
    "patch-check KUnit": "pylib/obmm/testbed/stages/kunitguest.py",
    "obmm-testbed dev": "pylib/obmm/testbed/cli/dev.py",
}
#: Steps of the sequence that only bring_up (and the modules that define them) may call.
STEPS = {"start": "Cluster.start", "prepare": "provision.prepare", "load_modules": "load_modules"}


def calls(path: Path) -> set[str]:
    """Dotted names of everything called in the file (`a.b(...)` -> "a.b", `f(...)` -> "f")."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            parts = []
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            if isinstance(func, ast.Name):
                parts.append(func.id)
            found.add(".".join(reversed(parts)))
    return found


def test_every_front_end_calls_bring_up() -> None:
    missing = [name for name, rel in FRONT_ENDS.items() if "bring_up" not in calls(ROOT / rel)]
    assert missing == []


def test_no_module_but_the_session_repeats_a_step_of_the_sequence() -> None:
    allowed = {
        "pylib/obmm/testbed/session.py",  # the sequence
        "pylib/obmm/testbed/vm/cluster.py",  # Cluster.start restarts itself after a bad snapshot
        "pylib/obmm/testbed/provision.py",  # defines the steps
    }
    offenders = []
    for path in sorted([*ROOT.glob("pylib/obmm/**/*.py"), *ROOT.glob("tests/cluster/*.py")]):
        rel = str(path.relative_to(ROOT))
        if rel in allowed:
            continue
        used = calls(path)
        offenders += [f"{rel}: {step}" for step in STEPS.values() if step in used]
    assert offenders == []


def test_the_checker_sees_a_call() -> None:
    assert "bring_up" in calls(ROOT / FRONT_ENDS["obmm-testbed run"])
    assert "Cluster.start" in calls(ROOT / "pylib/obmm/testbed/session.py")
