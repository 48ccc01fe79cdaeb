"""The composite action (.github/actions/obmm-testbed) run as a shell would run its steps.

No hosted runner is reachable, so each ``run:`` step is executed here with bash the way the
runner does it: ``${{ inputs.* }}``, ``github.action_path`` and step outputs substituted, the
step's ``env:`` set, ``$GITHUB_OUTPUT`` / ``$GITHUB_PATH`` files, and stand-ins for apt-get,
sudo, the interpreter, pip and obmm-testbed that record how they were called.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from obmm.testbed.paths import repo_root

ACTION_DIR = repo_root() / ".github" / "actions" / "obmm-testbed"
ACTION = ACTION_DIR / "action.yml"
EXPR = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


def load() -> dict[str, Any]:
    doc = yaml.safe_load(ACTION.read_text())
    assert isinstance(doc, dict)
    return doc


def _tool(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


class Runner:
    """Runs the action's steps like the Actions runner, with recording stand-ins on PATH."""

    def __init__(self, tmp: Path, inputs: dict[str, str]) -> None:
        self.tmp = tmp
        self.doc = load()
        self.inputs = {k: str(v.get("default", "")) for k, v in self.doc["inputs"].items()}
        self.inputs.update(inputs)
        self.calls = tmp / "calls.log"
        self.fake = tmp / "fake-bin"
        self.fake.mkdir()
        self.outputs: dict[str, dict[str, str]] = {}
        self.github_path = tmp / "github_path"
        self.github_path.write_text("")
        rec = f'echo "$(basename "$0") $*" >> {self.calls}\n'
        for name in ("apt-get", "sudo"):
            _tool(self.fake / name, rec)
        # The interpreter: `-m venv DIR` makes a venv of stand-ins whose python records pip
        # calls and runs every `-c` snippet (the cache key) with the real interpreter.
        venv_python = rec + f'if [ "$1" = -c ]; then exec {sys.executable} "$@"; fi\n'
        _tool(
            self.fake / "python3",
            rec + 'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; '
            f'cp {self.fake}/venv-python "$3/bin/python"; '
            f'cp {self.fake}/tool "$3/bin/obmm-testbed"; fi\n',
        )  # fmt: skip
        _tool(self.fake / "venv-python", venv_python)
        _tool(self.fake / "tool", rec)

    def value(self, expr: str) -> str:
        if expr.startswith("inputs."):
            return self.inputs[expr.removeprefix("inputs.")]
        if expr == "github.action_path":
            return str(ACTION_DIR)
        m = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr)
        if m:
            return self.outputs.get(m.group(1), {}).get(m.group(2), "")
        raise AssertionError(f"the test does not know the expression {expr!r}")

    def subst(self, text: str) -> str:
        return EXPR.sub(lambda m: self.value(m.group(1)), text)

    def run_step(self, step: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        assert step["shell"] == "bash"
        out = self.tmp / f"output-{step.get('id', 'x')}"
        out.write_text("")
        extra_path = [p for p in self.github_path.read_text().splitlines() if p]
        env = {
            "PATH": os.pathsep.join([*reversed(extra_path), str(self.fake), "/usr/bin", "/bin"]),
            "HOME": str(self.tmp),
            "RUNNER_TEMP": str(self.tmp / "runner-temp"),
            "RUNNER_OS": "Linux",
            "GITHUB_OUTPUT": str(out),
            "GITHUB_PATH": str(self.github_path),
            **{k: self.subst(str(v)) for k, v in step.get("env", {}).items()},
        }
        (self.tmp / "runner-temp").mkdir(exist_ok=True)
        cwd = self.tmp / self.subst(step.get("working-directory", "."))
        cwd.mkdir(parents=True, exist_ok=True)
        # The runner's bash: `bash --noprofile --norc -eo pipefail {0}`.
        script = self.tmp / "step.sh"
        script.write_text(self.subst(step["run"]))
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            env=env, cwd=cwd, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if "id" in step:
            pairs = (ln.split("=", 1) for ln in out.read_text().splitlines() if "=" in ln)
            self.outputs[step["id"]] = dict(pairs)
        return proc

    def run_all(self) -> list[subprocess.CompletedProcess[str]]:
        results = []
        for step in self.doc["runs"]["steps"]:
            if "uses" in step:
                continue  # actions/cache: checked in test_the_cache_step_keeps_the_image
            proc = self.run_step(step)
            results.append(proc)
            if proc.returncode:
                break
        return results

    def log(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def _makefile_packages() -> list[str]:
    text = (repo_root() / "Makefile").read_text().replace("\\\n", " ")
    m = re.search(r"^APT_PACKAGES :=(.*)$", text, re.M)
    assert m
    return m.group(1).split()


def test_the_action_is_a_composite_action_with_its_inputs() -> None:
    doc = load()
    assert doc["runs"]["using"] == "composite"
    assert {"command", "pytest", "nodes", "timeout", "working-directory"} <= set(doc["inputs"])
    assert all("description" in v for v in doc["inputs"].values())


def test_it_installs_what_make_setup_installs() -> None:
    step = load()["runs"]["steps"][0]
    assert step["env"]["PACKAGES"].split() == _makefile_packages()


def test_the_cache_step_keeps_the_image_and_the_snapshots() -> None:
    (cache,) = [s for s in load()["runs"]["steps"] if "uses" in s]
    assert cache["uses"].startswith("actions/cache@")
    paths = cache["with"]["path"].split()
    for what in ("images", "snapshots", "kheaders"):
        assert f"~/.cache/obmm-testbed/{what}" in paths
    assert cache["with"]["key"] == "${{ steps.install.outputs.cache-key }}"


def test_a_command_runs_with_obmm_testbed_run(tmp_path: Path) -> None:
    runner = Runner(tmp_path, {"command": "make check", "nodes": "3", "run-args": "--keep"})
    results = runner.run_all()
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    log = runner.log()
    assert log[0] == "apt-get update -qq"
    install = log[1].split()
    assert install[:3] == ["apt-get", "install", "-y"] and "qemu-system-x86" in install
    assert "mmdebstrap" in install  # as root: no sudo
    venv = tmp_path / "runner-temp" / "obmm-testbed-venv"
    assert f"python3 -m venv {venv}" in log
    pip = [ln for ln in log if " -m pip install -q " in ln and "--upgrade" not in ln]
    assert pip == [f"python -m pip install -q {ACTION_DIR}/../../..[test]"]
    key = runner.outputs["install"]["cache-key"]
    assert re.fullmatch(r"obmm-testbed-Linux-[0-9a-f]{20}", key), key
    assert runner.github_path.read_text().strip() == str(venv / "bin")
    assert "obmm-testbed doctor" in log
    assert log[-1] == "obmm-testbed run --nodes 3 --timeout 600 --keep -- make check"


def test_a_pytest_suite_runs_with_the_plugin(tmp_path: Path) -> None:
    runner = Runner(tmp_path, {"pytest": "-x tests", "working-directory": "proj"})
    # `python` of the venv (first on PATH through $GITHUB_PATH) is the recording stand-in.
    results = runner.run_all()
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    assert runner.log()[-1] == "python -m pytest --obmm-nodes 2 -x tests"


def test_without_command_or_pytest_it_says_so(tmp_path: Path) -> None:
    runner = Runner(tmp_path, {})
    results = runner.run_all()
    assert results[-1].returncode == 2
    assert "give 'command' or 'pytest'" in results[-1].stderr


def test_the_cache_key_is_stable(tmp_path: Path) -> None:
    keys = []
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        runner = Runner(tmp_path / sub, {"command": "true"})
        runner.run_all()
        keys.append(runner.outputs["install"]["cache-key"])
    assert keys[0] == keys[1]


@pytest.mark.parametrize(
    "path", [".github/workflows/ci.yml", ".github/actions/obmm-testbed/action.yml"]
)
def test_the_yaml_parses(path: str) -> None:
    assert isinstance(yaml.safe_load((repo_root() / path).read_text()), dict)


def test_the_projects_workflow_uses_the_action_on_the_example() -> None:
    jobs = yaml.safe_load((repo_root() / ".github/workflows/ci.yml").read_text())["jobs"]
    steps = jobs["downstream-example"]["steps"]
    (use,) = [s for s in steps if s.get("uses") == "./.github/actions/obmm-testbed"]
    assert use["with"]["working-directory"] == "examples/pytest-project"
