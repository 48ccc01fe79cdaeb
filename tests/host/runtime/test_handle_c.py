"""examples/c/obmm_handle.h and obmm.handle are byte-compatible, both ways."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from obmm.handle import HANDLE_SIZE, Handle

pytestmark = pytest.mark.needs_gcc

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("handle_c")
    binary = work / "driver"
    subprocess.run(
        ["gcc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", f"-I{REPO / 'examples' / 'c'}",
         "-o", str(binary), str(Path(__file__).with_name("handle_driver.c"))],
        check=True,
    )  # fmt: skip
    return binary


def _random_handles(count: int) -> list[Handle]:
    rng = random.Random(1234)
    return [
        Handle(
            mem_id=rng.getrandbits(64),
            tokenid=rng.getrandbits(32),
            length=rng.getrandbits(64),
            uba=rng.getrandbits(64),
            seid=rng.randbytes(16),
            deid=rng.randbytes(16),
            scna=rng.getrandbits(32),
            dcna=rng.getrandbits(32),
            pxm_numa=rng.randint(-(2**31), 2**31 - 1),
            base_dist=rng.getrandbits(8),
            node_id=rng.getrandbits(16),
        )
        for _ in range(count)
    ]


def _run(driver: Path, lines: list[str]) -> list[str]:
    out = subprocess.run(
        [str(driver)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def test_c_encode_equals_python(driver: Path) -> None:
    handles = _random_handles(200)
    lines = [
        f"E {h.mem_id} {h.length} {h.uba} {h.tokenid} {h.scna} {h.dcna} {h.pxm_numa} "
        f"{h.seid.hex()} {h.deid.hex()} {h.node_id} {h.base_dist}"
        for h in handles
    ]
    assert _run(driver, lines) == [h.encode().hex() for h in handles]


def test_c_decodes_python_handles(driver: Path) -> None:
    handles = _random_handles(200)
    got = _run(driver, [f"D {h.encode().hex()}" for h in handles])
    assert got == [
        f"OK {h.mem_id} {h.length} {h.uba} {h.tokenid} {h.scna} {h.dcna} {h.pxm_numa} "
        f"{h.node_id} {h.base_dist}"
        for h in handles
    ]


def test_c_rejects_what_python_rejects(driver: Path) -> None:
    good = bytearray(_random_handles(1)[0].encode())
    flipped = bytearray(good)
    flipped[50] ^= 0x01
    newer = bytearray(good)
    newer[4] = 2
    cases = {
        "truncated": bytes(good[:40]),
        "trailing": bytes(good) + b"\0",
        "magic": b"XBMH" + bytes(good[4:]),
        "newer": bytes(newer),
        "crc": bytes(flipped),
    }
    got = _run(driver, [f"D {raw.hex()}" for raw in cases.values()])
    assert got == [
        "ERR 1 handle truncated or with trailing bytes",
        "ERR 1 handle truncated or with trailing bytes",
        "ERR 2 not an obmm handle (bad magic)",
        "ERR 3 handle version is newer than this program supports",
        "ERR 6 handle CRC mismatch (corrupted)",
    ]
    assert len(good) == HANDLE_SIZE
