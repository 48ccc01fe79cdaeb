"""The cluster suite's snippet agent (tests/cluster/guest_side/xnode.py): a snippet that leaves a
file of the driver open or mapped fails, naming it, and the agent closes it, so it cannot hold
the driver for every later snippet of the agent (issue 33: a later test's rmmod found the
module in use on node 0).  Checked here on files under a scratch directory standing in for
/dev/obmm."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cluster" / "guest_side"))
import xnode


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    path = tmp_path / "obmm_shmdev7"
    path.write_bytes(b"\0" * 8192)
    return path


def test_a_snippet_that_closes_what_it_opens_passes(dev: Path) -> None:
    resp = xnode.run_snippet(f"with open({str(dev)!r}, 'rb') as f:\n    print(len(f.read()))",
                             watch=str(dev))  # fmt: skip
    assert resp == {"ok": True, "out": "8192\n", "error": ""}


def test_an_fd_left_open_fails_the_snippet_and_is_closed(dev: Path) -> None:
    resp = xnode.run_snippet(f"import os\nprint(os.open({str(dev)!r}, os.O_RDONLY))",
                             watch=str(dev))  # fmt: skip
    fd = int(resp["out"])
    assert not resp["ok"]
    assert f"the snippet left fd {fd} on {dev} (the agent closed them" in resp["error"]
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_mapping_left_fails_the_snippet_and_is_unmapped(dev: Path) -> None:
    code = f"""import ctypes, os
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long)
fd = os.open({str(dev)!r}, os.O_RDONLY)
print(hex(libc.mmap(None, 8192, 1, 1, fd, 0)))
os.close(fd)
"""
    resp = xnode.run_snippet(code, watch=str(dev))
    addr = int(resp["out"], 16)
    assert not resp["ok"]
    assert f"mapping {addr:#x}-{addr + 8192:#x} of {dev}" in resp["error"]
    assert str(dev) not in Path("/proc/self/maps").read_text()


def test_a_failing_snippet_keeps_its_traceback_and_its_files_are_checked_too(dev: Path) -> None:
    code = f"import os\nfd = os.open({str(dev)!r}, os.O_RDONLY)\nraise ValueError('boom')"
    resp = xnode.run_snippet(code, watch=str(dev))
    assert not resp["ok"]
    assert "ValueError: boom" in resp["error"] and f"on {dev}" in resp["error"]


def test_a_file_object_only_a_reference_cycle_keeps_is_collected_not_reported(dev: Path) -> None:
    """A function a snippet defines holds its scope (its globals): a Python file object there
    closes when the cycle is collected, which is no leak."""
    code = f"f = open({str(dev)!r}, 'rb')\ndef keeps():\n    return f\n"
    assert xnode.run_snippet(code, watch=str(dev))["ok"]
    assert str(dev) not in "".join(os.readlink(f"/proc/self/fd/{fd}")
                                   for fd in os.listdir("/proc/self/fd")
                                   if os.path.exists(f"/proc/self/fd/{fd}"))  # fmt: skip
