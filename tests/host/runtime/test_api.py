"""The high-level API without a device: what it puts in the structs, and its errors."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

import obmm
from obmm import abi
from obmm.errors import ObmmError


class FakeIoctl:
    """Stands in for abi.ioctl: records each call and fills outputs like a driver."""

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail = fail

    def __call__(self, fd: int, name: str, arg: Any) -> int:
        # Snapshot the struct as the kernel would read it.
        self.calls.append((name, bytes(abi.ffi.buffer(arg))))
        if self.fail:
            raise ObmmError(abi.IOCTLS[name][2], self.fail)
        if name == "OBMM_CMD_EXPORT":
            arg.mem_id, arg.tokenid, arg.uba = 7, 0x1234, 0xABC000
        elif name == "OBMM_CMD_IMPORT":
            arg.mem_id, arg.numa_id = 9, -1
        elif name == "OBMM_CMD_ADDR_QUERY":
            arg.mem_id, arg.offset, arg.pa = 3, 0x10, 0x40000010
        elif name == "OBMM_CMD_DECLARE_PREIMPORT":
            arg.numa_id = 4
        return 0


@pytest.fixture
def dev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = FakeIoctl()
    monkeypatch.setattr(abi, "ioctl", fake)
    node = tmp_path / "obmm"
    node.write_bytes(b"")
    with obmm.Obmm(str(node)) as d:
        yield d, fake


def _view(struct: str, raw: bytes) -> Any:
    buf = abi.ffi.new("char[]", raw)
    return abi.ffi.cast(f"{struct} *", buf), buf


def test_export_fills_struct(dev: Any) -> None:
    d, fake = dev
    exp = d.export([2 << 20, 4 << 20], pxm_numa=1, deid=b"\x01\x02", priv=b"hello")
    assert exp == obmm.Export(mem_id=7, tokenid=0x1234, uba=0xABC000, length=6 << 20)
    name, raw = fake.calls[0]
    assert name == "OBMM_CMD_EXPORT"
    cmd, _keep = _view("struct obmm_cmd_export", raw)
    assert list(cmd.size)[:3] == [2 << 20, 4 << 20, 0]
    assert cmd.length == 2
    assert cmd.flags == obmm.EXPORT_ALLOW_MMAP
    assert cmd.pxm_numa == 1
    assert bytes(cmd.deid) == b"\x01\x02" + b"\0" * 14
    assert cmd.priv_len == 5
    assert cmd.vendor_len == 0
    assert cmd.vendor_info == abi.ffi.NULL


def test_export_length_override_reaches_driver(dev: Any) -> None:
    d, fake = dev
    d.export(2 << 20, length=17)
    cmd, _keep = _view("struct obmm_cmd_export", fake.calls[0][1])
    assert cmd.length == 17


def test_export_refuses_more_sizes_than_the_struct_holds(dev: Any) -> None:
    d, fake = dev
    with pytest.raises(ValueError, match="17 sizes given; the struct holds 16 NUMA nodes"):
        d.export([2 << 20] * 17)
    assert fake.calls == []


def test_eid_longer_than_16_bytes_refused(dev: Any) -> None:
    d, _ = dev
    with pytest.raises(ValueError, match="seid is 17 bytes; an EID has at most 16"):
        d.import_(0x40000000, 2 << 20, scna=1, seid=b"x" * 17)


def test_import_fills_struct(dev: Any) -> None:
    d, fake = dev
    imp = d.import_(0x4000_0000, 4 << 20, scna=0x11, dcna=0x22, tokenid=5, base_dist=20)
    assert imp == obmm.Import(mem_id=9, numa_id=-1, addr=0x4000_0000, length=4 << 20)
    cmd, _keep = _view("struct obmm_cmd_import", fake.calls[0][1])
    assert (cmd.addr, cmd.length, cmd.scna, cmd.dcna) == (0x4000_0000, 4 << 20, 0x11, 0x22)
    assert (cmd.tokenid, cmd.numa_id, cmd.base_dist) == (5, -1, 20)
    assert cmd.flags == obmm.IMPORT_ALLOW_MMAP


def test_queries(dev: Any) -> None:
    d, fake = dev
    assert d.query_memid_by_pa(0x40000010) == (3, 0x10)
    assert d.query_pa_by_memid(3, 0x10) == 0x40000010
    first, _keep1 = _view("struct obmm_cmd_addr_query", fake.calls[0][1])
    second, _keep2 = _view("struct obmm_cmd_addr_query", fake.calls[1][1])
    assert first.key_type == abi.OBMM_QUERY_BY_PA
    assert second.key_type == abi.OBMM_QUERY_BY_ID_OFFSET
    assert (second.mem_id, second.offset) == (3, 0x10)


def test_preimport_and_unexport(dev: Any) -> None:
    d, fake = dev
    assert d.declare_preimport(1 << 30, 128 << 20, scna=0x11, priv=b"p") == 4
    d.undeclare_preimport(1 << 30, 128 << 20)
    d.unexport(7)
    d.unimport(9, flags=1)
    names = [name for name, _ in fake.calls]
    assert names == [
        "OBMM_CMD_DECLARE_PREIMPORT",
        "OBMM_CMD_UNDECLARE_PREIMPORT",
        "OBMM_CMD_UNEXPORT",
        "OBMM_CMD_UNIMPORT",
    ]
    pre, _keep = _view("struct obmm_cmd_preimport", fake.calls[0][1])
    assert (pre.pa, pre.length, pre.scna, pre.priv_len) == (1 << 30, 128 << 20, 0x11, 1)
    unimp, _keep2 = _view("struct obmm_cmd_unimport", fake.calls[3][1])
    assert (unimp.mem_id, unimp.flags) == (9, 1)


def test_open_missing_device_raises_obmm_error(tmp_path: Path) -> None:
    with pytest.raises(ObmmError) as info:
        obmm.Obmm(str(tmp_path / "nope"))
    assert info.value.op == "OPEN"
    assert info.value.errname == "ENOENT"
    assert str(tmp_path / "nope") in str(info.value)


def test_real_ioctl_on_a_plain_file_is_enotty(tmp_path: Path) -> None:
    """The cffi call path really reaches ioctl(2) and reports its errno."""
    node = tmp_path / "obmm"
    node.write_bytes(b"")
    with obmm.Obmm(str(node)) as d, pytest.raises(ObmmError) as info:
        d.unexport(1)
    assert (info.value.op, info.value.errno, info.value.errname) == (
        "UNEXPORT",
        errno.ENOTTY,
        "ENOTTY",
    )
    assert str(info.value) == "UNEXPORT failed: ENOTTY (unknown ioctl command for this device)"


def test_raw_ioctl_checks_struct_type(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="OBMM_CMD_IMPORT takes a 'struct obmm_cmd_import \\*'"):
        abi.ioctl(0, "OBMM_CMD_IMPORT", abi.new("struct obmm_cmd_export"))


def test_new_refuses_foreign_struct() -> None:
    with pytest.raises(KeyError, match=r"is not a struct of uapi/ub/obmm\.h"):
        abi.new("struct stat")


def _shmdev_file(tmp_path: Path, mem_id: int, size: int) -> None:
    (tmp_path / f"obmm_shmdev{mem_id}").write_bytes(b"\0" * size)


def test_shmdev_mmap_read_write_through_the_mapping(tmp_path: Path) -> None:
    _shmdev_file(tmp_path, 5, 8192)
    with obmm.ShmDev(5, dev_dir=str(tmp_path)) as shm, shm.mmap(8192) as m:
        m.write(100, b"pattern")
        assert m.read(100, 7) == b"pattern"
        assert m.buf[100] == ord("p")
    assert (tmp_path / "obmm_shmdev5").read_bytes()[100:107] == b"pattern"


def test_mapping_bounds_and_close(tmp_path: Path) -> None:
    _shmdev_file(tmp_path, 6, 4096)
    with obmm.ShmDev(6, dev_dir=str(tmp_path)) as shm:
        m = shm.mmap(4096)
        with pytest.raises(IndexError, match=r"\[4090, 4100\) is outside the 4096-byte map"):
            m.write(4090, b"0123456789")
        m.close()
        assert m.closed
        with pytest.raises(ValueError, match="mapping is closed"):
            m.read(0, 1)
        m.close()  # idempotent


def test_pmd_flag_travels_in_the_offset(tmp_path: Path) -> None:
    """A plain file rejects offset bit 63 — proving the flag reached mmap(2) intact."""
    _shmdev_file(tmp_path, 8, 4096)
    with obmm.ShmDev(8, dev_dir=str(tmp_path)) as shm, pytest.raises(ObmmError) as info:
        shm.mmap(4096, pmd=True)
    assert info.value.op == "MMAP"
    assert info.value.errname in ("EINVAL", "EOVERFLOW")


def test_readonly_fd_cannot_map_writable(tmp_path: Path) -> None:
    _shmdev_file(tmp_path, 9, 4096)
    with obmm.ShmDev(9, writable=False, dev_dir=str(tmp_path)) as shm:
        with pytest.raises(ObmmError) as info:
            shm.mmap(4096)
        assert info.value.errname == "EACCES"
        with shm.mmap(4096, prot=obmm.PROT_READ) as m:
            assert m.read(0, 4) == b"\0\0\0\0"


def test_shmdev_open_missing(tmp_path: Path) -> None:
    with pytest.raises(ObmmError) as info:
        obmm.ShmDev(42, sync=True, dev_dir=str(tmp_path))
    assert (info.value.op, info.value.errname) == ("OPEN", "ENOENT")
    assert "obmm_shmdev42" in str(info.value)


def test_import_obmm_needs_no_testbed_dependencies() -> None:
    """Guests and UB hosts have python3 + cffi only: `import obmm` must not pull paramiko."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['paramiko'] = None; sys.modules['elftools'] = None\n"
        "import obmm, obmm.handle, obmm.tools.logscan\n"
        "print(obmm.abi.OBMM_CMD_EXPORT)"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(obmm.__file__).parents[1]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(0xC0E07800)
