"""Data path: bytes written through an export's shmdev are read through a loopback import
(the node's own decoder window) and back, in every mapping mode.
"""

from __future__ import annotations

import os

import pytest
from obmm_fixtures import SZ_2M, Fabric, exported, imported

import obmm

pytest_plugins = ["obmm_fixtures"]

pytestmark = pytest.mark.testbed_fabric


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


@pytest.mark.parametrize(
    "exp_sync,imp_sync,pmd",
    [(False, False, False), (True, True, False), (False, True, False), (False, False, True)],
    ids=["cc-cc", "wc-wc", "cc-wc", "pmd"],
)
def test_export_to_import_and_back(
    dev: obmm.Obmm, fabric: Fabric, exp_sync: bool, imp_sync: bool, pmd: bool
) -> None:
    size = 2 * SZ_2M
    with exported(dev, size) as exp, imported(dev, fabric, exp) as imp:  # noqa: SIM117
        with obmm.ShmDev(exp.mem_id, sync=exp_sync) as es, es.mmap(size, pmd=pmd) as em:
            with obmm.ShmDev(imp.mem_id, sync=imp_sync) as is_, is_.mmap(size, pmd=pmd) as im:
                data = pattern(1024, 7)
                em.write(0, data)
                em.write(size - 1024, data[::-1])
                assert im.read(0, 1024) == data
                assert im.read(size - 1024, 1024) == data[::-1]
                back = pattern(4096, 99)
                im.write(SZ_2M, back)
                assert em.read(SZ_2M, 4096) == back


def test_import_at_offset_sees_the_right_bytes(dev: obmm.Obmm, fabric: Fabric) -> None:
    with exported(dev, 4 * SZ_2M) as exp:
        with obmm.ShmDev(exp.mem_id) as es, es.mmap(4 * SZ_2M) as em:
            for i in range(4):
                em.write(i * SZ_2M, f"chunk {i}".encode())
        addr = fabric.loopback_addr(dev, exp.mem_id, 2 * SZ_2M)
        imp = dev.import_(addr, SZ_2M, scna=fabric.cna, tokenid=exp.tokenid)
        try:
            with obmm.ShmDev(imp.mem_id) as s, s.mmap(SZ_2M) as m:
                assert m.read(0, 7) == b"chunk 2"
        finally:
            dev.unimport(imp.mem_id)


def test_whole_region_random_round_trip(dev: obmm.Obmm, fabric: Fabric) -> None:
    size = 2 * SZ_2M
    data = os.urandom(size)
    with exported(dev, size) as exp, imported(dev, fabric, exp) as imp:
        with obmm.ShmDev(exp.mem_id) as es, es.mmap(size) as em:
            em.write(0, data)
        with obmm.ShmDev(imp.mem_id) as s, s.mmap(size) as m:
            assert m.read(0, size) == data


def test_mapping_at_offset(dev: obmm.Obmm, fabric: Fabric) -> None:
    with exported(dev, 2 * SZ_2M) as exp, imported(dev, fabric, exp) as imp:
        with obmm.ShmDev(exp.mem_id) as es, es.mmap(SZ_2M, SZ_2M) as em:
            em.write(16, b"second half")
        with obmm.ShmDev(imp.mem_id) as s, s.mmap(2 * SZ_2M) as m:
            assert m.read(SZ_2M + 16, 11) == b"second half"


def test_export_memory_zeroed_as_seen_by_importer(dev: obmm.Obmm, fabric: Fabric) -> None:
    with exported(dev) as exp, imported(dev, fabric, exp) as imp:  # noqa: SIM117
        with obmm.ShmDev(imp.mem_id) as s, s.mmap(SZ_2M) as m:
            assert m.read(0, SZ_2M) == bytes(SZ_2M)


def test_unmodified_c_smoke_program(tmp_path: object) -> None:
    """tests/c/smoke.c built with plain gcc against uapi/ub/obmm.h runs unchanged."""
    import shutil
    import subprocess
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "c"
    uapi = Path(__file__).resolve().parents[2] / "uapi"
    if shutil.which("gcc") is None or not (src / "smoke.c").exists():
        pytest.skip("no gcc or no tests/c in the guest")
    exe = Path(str(tmp_path)) / "smoke"
    subprocess.run(
        ["gcc", "-O2", "-Wall", "-Werror", f"-I{uapi}", "-o", str(exe), str(src / "smoke.c")],
        check=True,
    )
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "smoke: PASS" in res.stdout
