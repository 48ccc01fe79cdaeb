"""controlpath and regions without a driver: a fake /dev/obmm records the ioctl sequence."""

from __future__ import annotations

import errno
from pathlib import Path
from types import TracebackType
from typing import ClassVar, cast

import pytest

import obmm
from obmm import decoder as decoder_mod
from obmm.bench import controlpath, regions
from obmm.errors import ObmmError

SZ_2M = 2 << 20


class FakeDev:
    def __init__(self, *, fail_import: bool = False, fail_export_after: int | None = None) -> None:
        self.fail_import = fail_import
        self.fail_export_after = fail_export_after
        self.next_id = 1
        self.live: dict[int, str] = {}
        self.calls: list[str] = []

    def _new(self, kind: str) -> int:
        mem_id, self.next_id = self.next_id, self.next_id + 1
        self.live[mem_id] = kind
        return mem_id

    def export(self, size: int) -> obmm.Export:
        self.calls.append("export")
        exports = self.calls.count("export")
        if self.fail_export_after is not None and exports > self.fail_export_after:
            raise ObmmError("EXPORT", errno.ENOMEM, "pool exhausted")
        mem_id = self._new("export")
        uba = decoder_mod.EMU_UBA_VALID | (mem_id << 21)
        return obmm.Export(mem_id=mem_id, tokenid=9, uba=uba, length=size)

    def import_(self, addr: int, length: int, *, scna: int, tokenid: int) -> obmm.Import:
        self.calls.append("import")
        assert (scna, tokenid) == (3, 9)
        if self.fail_import:
            raise ObmmError("IMPORT", errno.EPERM, "token mismatch")
        return obmm.Import(mem_id=self._new("import"), numa_id=-1, addr=addr, length=length)

    def unimport(self, mem_id: int) -> None:
        self.calls.append("unimport")
        assert self.live.pop(mem_id) == "import"

    def unexport(self, mem_id: int) -> None:
        self.calls.append("unexport")
        assert self.live.pop(mem_id) == "export"

    def query_pa_by_memid(self, mem_id: int, offset: int = 0) -> int:
        self.calls.append("query_pa")
        return mem_id << 21

    def query_memid_by_pa(self, pa: int) -> tuple[int, int]:
        self.calls.append("query_memid")
        return pa >> 21, 0


class FakeDecoder:
    def resolve(self, exporter_node: int, uba: int, length: int) -> int:
        node, pa = decoder_mod.emulator_uba_split(uba)
        assert node == exporter_node == 0
        return 0x80_0000_0000 + pa


class FakeMapping:
    def __init__(self, length: int) -> None:
        self.buf = memoryview(bytearray(16))
        self.length = length

    def close(self) -> None:
        self.buf.release()


class FakeShmDev:
    opened: ClassVar[list[int]] = []

    def __init__(self, mem_id: int, *, sync: bool = False) -> None:
        FakeShmDev.opened.append(mem_id)

    def mmap(self, length: int) -> FakeMapping:
        return FakeMapping(length)

    def __enter__(self) -> FakeShmDev:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass


@pytest.fixture(autouse=True)
def fake_shmdev(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeShmDev.opened = []
    monkeypatch.setattr(obmm, "ShmDev", FakeShmDev)


def measure(
    dev: FakeDev, size: int = SZ_2M, *, free: int | None = None, scna: int | None = 3
) -> controlpath.SizeResult:
    return controlpath.measure_size(
        cast(obmm.Obmm, dev),
        size,
        reps=3,
        max_seconds=30.0,
        decoder=FakeDecoder(),
        node=0,
        scna=scna,
        free=free,
    )


def test_every_op_timed_per_repetition_and_released() -> None:
    dev = FakeDev()
    res = measure(dev, free=64 << 20)
    assert sorted(res.samples) == sorted([*controlpath.OPS, *controlpath.BASE_OPS])
    assert all(len(v) == 3 for v in res.samples.values())
    assert all(x > 0 for v in res.samples.values() for x in v)
    assert res.skipped == {}
    # one repetition: export, import, map, the two queries, unimport, unexport
    assert dev.calls[:7] == [
        "export",
        "import",
        "query_pa",
        "query_memid",
        "unimport",
        "unexport",
        "export",
    ]
    assert dev.live == {}
    assert FakeShmDev.opened == [2, 4, 6]  # the import's shmdev, not the export's
    # export-to-readable spans export .. first read, so it is at least export + import
    for i in range(3):
        assert res.samples["export_to_readable"][i] >= (
            res.samples["export"][i] + res.samples["import"][i]
        )


def test_figures_and_baselines() -> None:
    res = measure(FakeDev())
    figs = {f.name: f for f in controlpath.figures([res], [0.5, 0.7])}
    assert figs["control.export.2MiB"].baseline == "control.base.mmap_populate.2MiB"
    assert figs["control.unexport.2MiB"].baseline == "control.base.munmap.2MiB"
    assert figs["control.import.2MiB"].baseline == "control.null_syscall"
    assert figs["control.query_memid.2MiB"].baseline == "control.null_syscall"
    assert figs["control.export_to_readable.2MiB"].baseline == "control.base.mmap_touch.2MiB"
    assert figs["control.null_syscall"].samples == [0.5, 0.7]
    assert figs["control.export.2MiB"].unit == "us"
    assert figs["control.export.2MiB"].params == {"op": "export", "size": SZ_2M}
    for fig in figs.values():
        assert fig.baseline is None or fig.baseline in figs


def test_size_above_free_pool_is_skipped_with_reason() -> None:
    dev = FakeDev()
    res = measure(dev, 8 << 20, free=SZ_2M)
    assert dev.calls == []
    assert set(res.skipped.values()) == {"8MiB is larger than the free export pool (2MiB)"}
    figs = controlpath.figures([res], [0.5])
    export = next(f for f in figs if f.name == "control.export.8MiB")
    assert export.skipped == "8MiB is larger than the free export pool (2MiB)"
    assert not export.ok


def test_failed_import_keeps_export_side() -> None:
    dev = FakeDev(fail_import=True)
    res = measure(dev)
    for op in controlpath.IMPORT_OPS:
        assert op not in res.samples
        assert res.skipped[op].startswith("loopback import failed: IMPORT failed: EPERM")
    assert "EPERM" in res.skipped["import"]
    assert dev.calls.count("import") == 1  # not retried on every repetition
    assert len(res.samples["export"]) == len(res.samples["query_pa"]) == 3
    assert dev.live == {}


def test_no_cna_skips_import() -> None:
    res = measure(FakeDev(), scna=None)
    assert res.skipped["import"].endswith("no local CNA (no UB controller in sysfs)")
    assert len(res.samples["unexport"]) == 3


def test_failure_after_first_repetition_keeps_samples() -> None:
    dev = FakeDev(fail_export_after=1)
    res = measure(dev)
    assert len(res.samples["export"]) == 1
    assert res.stopped.startswith("stopped after 1 repetition(s): EXPORT failed: ENOMEM")
    fig = next(f for f in controlpath.figures([res], [0.1]) if f.name == "control.export.2MiB")
    assert fig.ok and "stopped after 1 repetition(s)" in fig.note


def test_failure_on_first_repetition_skips_size() -> None:
    res = measure(FakeDev(fail_export_after=0))
    assert res.samples == {}
    assert res.skipped["export"].startswith("first 2MiB repetition failed: EXPORT failed: ENOMEM")


def test_parse_sizes() -> None:
    assert controlpath.parse_sizes("2M,8MiB,1G,4096,64k") == [
        SZ_2M,
        8 << 20,
        1 << 30,
        4096,
        64 << 10,
    ]


def test_pool_free_and_node_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OBMM_NODE_ID", raising=False)
    assert regions.pool_free(tmp_path / "missing") is None
    for name, total, used in (("obmm-0", 0x4000000, 0x400000), ("obmm-1", 0x200000, 0)):
        d = tmp_path / name
        d.mkdir()
        (d / "total").write_text(f"{total:#x}\n")
        (d / "used").write_text(f"{used}\n")
    assert regions.pool_free(tmp_path) == 0x4000000 - 0x400000 + 0x200000
    (tmp_path / "node_id").write_text("3\n")
    assert regions.node_id(tmp_path / "node_id") == 3
    assert regions.node_id(tmp_path / "nope") == 0
    # a hardware host: no obmm_emu, its number from the stage's environment
    monkeypatch.setenv("OBMM_NODE_ID", "1")
    assert regions.node_id(tmp_path / "nope") == 1
    assert regions.node_id(tmp_path / "node_id") == 3  # the emulator's own wins


def test_baseline_larger_than_available_memory_is_skipped_not_populated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 1 GiB export fits the pool, but populating 1 GiB of anonymous memory in a node with
    # less available would wake the OOM killer: the baselines are skipped with the reason.
    monkeypatch.setattr(controlpath, "mem_available", lambda: 900 << 20)
    populated: list[int] = []
    monkeypatch.setattr(controlpath.mmap, "mmap", lambda *a, **k: populated.append(1))
    res = measure(FakeDev(), 1 << 30, free=2 << 30)
    assert populated == []
    reason = "1GiB does not fit in the node's available memory (900 MiB) with 64 MiB to spare"
    assert {op: res.skipped[op] for op in controlpath.BASE_OPS} == dict.fromkeys(
        controlpath.BASE_OPS, reason
    )
    assert len(res.samples["export"]) == 3  # the OBMM side is still measured
    figs = {f.name: f for f in controlpath.figures([res], [0.5])}
    assert figs["control.base.mmap_populate.1GiB"].skipped == reason
    assert figs["control.export.1GiB"].ok


def test_mem_available_reads_proc_meminfo() -> None:
    value = controlpath.mem_available()
    assert value is not None and value > 0
