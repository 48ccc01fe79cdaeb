"""The cause table, its copy in docs/causes.md, ObmmError messages and the bindings-only CLI."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from obmm.causes import CAUSES, causes, render_markdown
from obmm.errors import ObmmError, errno_name
from obmm.tools.cli import main

REPO = Path(__file__).resolve().parents[2]
CAUSES_PAGE = REPO / "docs" / "causes.md"


def test_the_causes_page_carries_the_cause_table() -> None:
    assert render_markdown() in CAUSES_PAGE.read_text(), (
        "docs/causes.md's 'what can go wrong' table is stale: run `python3 ci/sync_docs.py`"
    )


def test_generated_tables_are_fresh() -> None:
    """The cause, variable and fidelity tables (kmod/obmm_emu/FIDELITY.md), each on its page."""
    out = subprocess.run(
        [sys.executable, str(REPO / "ci" / "sync_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


def test_every_errno_name_is_real() -> None:
    for _op, name in CAUSES:
        assert hasattr(errno, name), name


def test_causes_put_the_operation_first() -> None:
    found = causes("IMPORT", "EFAULT")
    assert found[-1].startswith("the argument (or priv / vendor_info) pointer")
    assert causes("IMPORT", "EEXIST")[0].startswith("the PA range overlaps")


def test_error_message_names_op_errno_and_cause() -> None:
    err = ObmmError("IMPORT", errno.EEXIST, "range overlaps mem_id 3")
    assert str(err) == (
        "IMPORT failed: EEXIST (the PA range overlaps an existing import or preimport "
        "(the docs say EBUSY; the driver returns EEXIST)) [range overlaps mem_id 3]"
    )
    assert isinstance(err, OSError)
    assert err.errno == errno.EEXIST


def test_unlisted_errno_falls_back_to_strerror() -> None:
    assert str(ObmmError("UNEXPORT", errno.EIO)) == "UNEXPORT failed: EIO (Input/output error)"


def test_errno_aliases_use_kernel_names() -> None:
    assert errno_name(errno.EOPNOTSUPP) == "EOPNOTSUPP"
    assert errno_name(errno.EAGAIN) == "EAGAIN"
    assert errno_name(4242) == "errno 4242"


def test_cli_abi_prints_reference_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["abi"]) == 0
    out = capsys.readouterr().out
    assert "struct obmm_cmd_export: size 224, align 8" in out
    assert "struct obmm_cmd_preimport: size 80, align 16" in out
    assert "OBMM_CMD_EXPORT                0xc0e07800" in out


def test_cli_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "import", "17"]) == 0
    assert "IMPORT failed with EEXIST" in capsys.readouterr().out
    assert main(["explain", "unexport", "EXDEV"]) == 1
    assert main(["explain", "frobnicate", "EINVAL"]) == 2
    assert "unknown operation 'FROBNICATE'" in capsys.readouterr().out
