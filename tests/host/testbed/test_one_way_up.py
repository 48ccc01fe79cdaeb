"""One bring-up: every front end comes up through obmm.testbed.session.bring_up, and nothing else
repeats its sequence (start a cluster, provision it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
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
#: Steps of the sequence that only bring_up (and the modules that define them) may call.  A
#: call counts however it is spelled: `load_modules(...)`, `provision.load_modules(...)`.
STEPS = ("Cluster.start", "provision.prepare", "load_modules", "unload_modules", "push_payload")


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


def steps_called(path: Path) -> list[str]:
    """The steps of the sequence `path` calls, by the dotted names of its calls."""
    used = calls(path)
    return [
        step
        for step in STEPS
        if any(name == step or name.endswith("." + step) for name in used)
        or (step == "provision.prepare" and "prepare" in used and _imports_prepare(path))
    ]


def _imports_prepare(path: Path) -> bool:
    return any(
        isinstance(n, ast.ImportFrom)
        and (n.module or "").endswith("provision")
        and any(a.name == "prepare" for a in n.names)
        for n in ast.walk(ast.parse(path.read_text(), str(path)))
    )


def test_no_module_but_the_session_repeats_a_step_of_the_sequence() -> None:
    """Reloading the modules (`obmm-testbed dev`) or refreshing an attached cluster's payload
    (the guest suite's attach) go through Session methods too."""
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
        offenders += [f"{rel}: {step}" for step in steps_called(path)]
    assert offenders == []


@pytest.mark.parametrize(
    "source",
    [
        "from obmm.testbed import provision\nprovision.load_modules(n, t, kos)\n",
        "from obmm.testbed.provision import load_modules\nload_modules(n, t, kos)\n",
        "import obmm.testbed.provision\nobmm.testbed.provision.unload_modules(n, kos)\n",
        "from obmm.testbed.provision import prepare\nprepare(nodes, t, kos)\n",
        "from obmm.testbed import provision\nprovision.push_payload(nodes, kos)\n",
    ],
)
def test_the_checker_sees_a_step_however_it_is_spelled(tmp_path: Path, source: str) -> None:
    """A reload outside the session is caught with or without the module's name in front
    (before, only a bare `load_modules(...)` was)."""
    path = tmp_path / "elsewhere.py"
    path.write_text(source)
    assert steps_called(path) != []


def test_the_session_reloads_the_modules_on_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """Session.reload_modules: each node unloads, then loads the new modules with the
    parameters and the settings' driver; the session then names the new modules."""
    from obmm.testbed import provision, session
    from obmm.testbed.settings import Settings
    from obmm.testbed.topology import Topology

    done: list[tuple[str, object, tuple[str, ...]]] = []
    monkeypatch.setattr(
        provision, "unload_modules", lambda node, kos: done.append(("unload", node, ()))
    )
    monkeypatch.setattr(
        provision,
        "load_modules",
        lambda node, topology, kos, *, params, driver: done.append(
            ("load", node, (topology.nodes, *params, driver))
        ),
    )

    class FakeCluster:
        topology = Topology(nodes=2)

    nodes = ["n0", "n1"]
    s = session.Session(
        Settings(driver="emu"),
        FakeCluster(),  # type: ignore[arg-type]
        nodes,  # type: ignore[arg-type]
        guard=object(),  # type: ignore[arg-type]
    )
    kos = [Path("a.ko")]
    s.reload_modules(kos, ["p=1"])
    for n in nodes:
        assert [d for d in done if d[1] == n] == [("unload", n, ()), ("load", n, (2, "p=1", "emu"))]
    assert s.modules == kos


def test_the_checker_sees_a_call() -> None:
    assert "bring_up" in calls(ROOT / FRONT_ENDS["obmm-testbed run"])
    assert "Cluster.start" in calls(ROOT / "pylib/obmm/testbed/session.py")


#: A module load or unload as a command: `rmmod obmm...`, `insmod <file>.ko`, or an argv item.
RELOAD = re.compile(
    r"\b(rmmod|modprobe)\s+(-\S+\s+)*(obmm|ub_compat)|\binsmod\s+\S+\.ko|[\"'](rmmod|insmod|modprobe)[\"']"
)


def test_the_cluster_suite_reloads_the_driver_only_through_xnode_reload_obmm() -> None:
    """One copy of a reload on a cluster node (tests/cluster/guest_side/xnode.py:reload_obmm,
    with its fabric parameters and its wait for holders): the cross-node fuzzer's own shell
    copy still named the module obmm_emu after it became obmm, and only `make fuzz` ran it."""
    own = ROOT / "tests" / "cluster" / "guest_side" / "xnode.py"
    spelled = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "tests" / "cluster").rglob("*.py"))
        if path != own
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if RELOAD.search(line)
    ]
    assert spelled == [], spelled
