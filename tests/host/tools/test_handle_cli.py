"""`obmm-testbed handle show|serve|fetch`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from obmm.handle import Handle
from obmm.testbed.cli.main import main

HANDLE = Handle(
    mem_id=3, tokenid=0xBEEF, length=4 << 20, uba=0x1_0000_0000, seid=b"\x01" * 16,
    deid=b"\x02" * 16, scna=0x10, dcna=0x11, pxm_numa=0, base_dist=20, node_id=1,
)  # fmt: skip


def test_show_json_file_and_hex(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "h.json"
    path.write_text(HANDLE.to_json())
    assert main(["handle", "show", "--hex", str(path)]) == 0
    hex_text = capsys.readouterr().out.strip()
    assert hex_text == HANDLE.encode().hex()
    assert main(["handle", "show", hex_text]) == 0
    assert Handle.from_json(capsys.readouterr().out) == HANDLE


def test_show_binary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "h.bin"
    path.write_bytes(HANDLE.encode())
    assert main(["handle", "show", str(path)]) == 0
    assert Handle.from_json(capsys.readouterr().out) == HANDLE


def test_show_corrupted_reports_why(capsys: pytest.CaptureFixture[str]) -> None:
    raw = bytearray(HANDLE.encode())
    raw[20] ^= 0xFF
    assert main(["handle", "show", raw.hex()]) == 1
    assert "error: handle CRC mismatch" in capsys.readouterr().err


def test_serve_then_fetch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "h.json"
    path.write_text(HANDLE.to_json())
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3] / "pylib"))
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "obmm.testbed.cli.main",
            "handle",
            "serve",
            f"region={path}",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        # Ctrl-C works as in a terminal even when this suite inherited SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()
        assert line.startswith("serving on 127.0.0.1:"), line
        peer = line.removeprefix("serving on ")
        assert main(["handle", "fetch", "--hex", peer, "region"]) == 0
        assert capsys.readouterr().out.strip() == HANDLE.encode().hex()
        assert main(["handle", "fetch", "--timeout", "2", peer, "missing"]) == 1
        assert "missing" in capsys.readouterr().err
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=10) == 0
