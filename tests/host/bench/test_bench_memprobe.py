"""memprobe.c on the host: builds warning-free, measures local memory and a shared file, and its
Engram fill / verification catches corrupted rows."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from obmm.bench.probe import (
    ENGRAM_ROW_BYTES,
    ENGRAM_TABLES,
    compile_local,
    figures_from_probe,
    parse_output,
)

pytestmark = pytest.mark.needs_gcc

SMALL = [
    "--chase-sizes",
    "4K,64K,1M",
    "--chase-loads",
    "20000",
    "--samples",
    "3",
    "--load-samples",
    "50",
    "--engram-iters",
    "5",
    "--bw-size",
    "1M",
    "--max-seconds",
    "4",
]
ROWS = 100  # rows per table in the file tests
REGION = 2 << 20
FLOATS_PER_ROW = ENGRAM_ROW_BYTES // 4


@pytest.fixture(scope="module")
def memprobe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    return compile_local(tmp_path_factory.mktemp("memprobe"), werror=True)


def run(memprobe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(memprobe), *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_compiles_with_wall_wextra_werror(memprobe: Path) -> None:
    assert memprobe.exists()
    src = memprobe.parent / "memprobe.c"
    assert src.read_text().splitlines()[0] == "// SPDX-License-Identifier: GPL-2.0-or-later"
    proc = subprocess.run(
        ["gcc", "-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_local_source_every_measurement(memprobe: Path) -> None:
    proc = run(memprobe, "--local", "4M", *SMALL)
    assert proc.returncode == 0, proc.stderr
    out = parse_output(proc.stdout)
    assert out.env["source"] == "local"
    assert out.env["length"] == 4 << 20
    assert out.env["sync"] is False
    assert out.done is not None and out.done["ok"] is True
    # local memory is filled by memprobe itself, so verification passes
    assert out.verify is not None and out.verify["ok"] is True
    assert out.verify["rows_checked"] == ENGRAM_TABLES * 4
    assert out.info["engram_rows"] == (4 << 20) // (ENGRAM_TABLES * ENGRAM_ROW_BYTES)
    for ws in (4 << 10, 64 << 10, 1 << 20):
        chase = out.values("chase", ws)
        assert len(chase) == 3
        assert all(0 < v < 10_000 for v in chase), chase  # ns per load
    for test in ("read", "write"):
        bw = out.values(test, 1 << 20)
        assert len(bw) == 3
        assert all(0.01 < v < 10_000 for v in bw), bw  # GB/s
    assert len(out.values("load", 4)) == 50
    assert len(out.values("clock", 0)) == 50
    engram = out.samples[("engram", 128)]
    assert len(engram) == 5
    for s in engram:
        assert 0 < s["value"] < 1000  # ms per prefetch
        # rows/s is exactly 128 x 12 rows over the time
        assert s["rows_per_s"] == pytest.approx(128 * 12 / (s["value"] / 1000), rel=1e-6)


def test_chase_set_larger_than_region_is_skipped(memprobe: Path) -> None:
    proc = run(memprobe, "--local", "1M", "--tests", "chase", *SMALL, "--chase-sizes", "64K,2M")
    assert proc.returncode == 0, proc.stderr
    out = parse_output(proc.stdout)
    assert len(out.values("chase", 64 << 10)) == 3
    assert out.skips == [
        {
            "kind": "skip",
            "test": "chase",
            "param": 2 << 20,
            "reason": "working set larger than the region",
        }
    ]


def test_file_fill_then_verify_in_another_process(memprobe: Path, tmp_path: Path) -> None:
    path = tmp_path / "region"
    args = ["--file", str(path), "--length", str(REGION), "--engram-rows", str(ROWS)]
    proc = run(memprobe, *args, "--fill", "--tests", "none")
    assert proc.returncode == 0, proc.stderr
    assert path.stat().st_size == REGION
    # the pattern is float element i = i * 0.001, table after table
    data = path.read_bytes()
    (v0, v1) = struct.unpack_from("=2f", data, 0)
    assert (v0, v1) == (0.0, struct.unpack("=f", struct.pack("=f", 0.001))[0])
    i = (3 * ROWS + 42) * FLOATS_PER_ROW + 7
    (got,) = struct.unpack_from("=f", data, i * 4)
    assert got == struct.unpack("=f", struct.pack("=f", i * 0.001))[0]

    proc = run(
        memprobe,
        "--file",
        str(path),
        "--engram-rows",
        str(ROWS),
        "--tests",
        "verify,engram",
        *SMALL,
    )
    assert proc.returncode == 0, proc.stderr
    out = parse_output(proc.stdout)
    assert out.env["source"] == "file"
    assert out.env["length"] == REGION  # default: the file's size
    assert out.verify == {
        "kind": "verify",
        "ok": True,
        "rows_checked": 48,
        "rows_per_table": ROWS,
    }
    assert len(out.values("engram", 128)) == 5


def test_corrupted_fill_is_detected(memprobe: Path, tmp_path: Path) -> None:
    path = tmp_path / "region"
    args = ["--file", str(path), "--length", str(REGION), "--engram-rows", str(ROWS)]
    assert run(memprobe, *args, "--fill", "--tests", "none").returncode == 0
    # corrupt float 2 of row 42 of table 3
    with path.open("r+b") as f:
        f.seek((3 * ROWS + 42) * ENGRAM_ROW_BYTES + 8)
        f.write(struct.pack("=f", -1.0))
    proc = run(memprobe, *args, "--tests", "verify,engram", *SMALL)
    assert proc.returncode == 3
    out = parse_output(proc.stdout)
    assert out.verify is not None
    assert (out.verify["ok"], out.verify["table"], out.verify["row"], out.verify["col"]) == (
        False,
        3,
        42,
        2,
    )
    assert out.verify["got"] == -1.0
    # no Engram timing on data that failed verification, and the reason is recorded
    assert ("engram", 128) not in out.samples
    assert out.skips[0]["reason"] == "verification failed"
    figs = {f.name: f for f in figures_from_probe(out, "file")}
    assert figs["engram.prefetch.file.128tok"].skipped == "verification failed"


def test_unfilled_file_fails_verification(memprobe: Path, tmp_path: Path) -> None:
    proc = run(memprobe, "--file", str(tmp_path / "zero"), "--length", "1M", "--tests", "verify")
    assert proc.returncode == 3
    out = parse_output(proc.stdout)
    assert out.verify is not None and out.verify["ok"] is False
    # row 0 col 0 is 0.0 in the pattern too, so the first mismatch is col 1
    assert (out.verify["table"], out.verify["row"], out.verify["col"]) == (0, 0, 1)


def test_max_seconds_truncates_and_records_it(memprobe: Path) -> None:
    proc = run(
        memprobe,
        "--local",
        "16M",
        "--tests",
        "chase",
        "--chase-sizes",
        "16M",
        "--chase-loads",
        "2000000",
        "--samples",
        "1000",
        "--max-seconds",
        "0.2",
    )
    assert proc.returncode == 0, proc.stderr
    out = parse_output(proc.stdout)
    n = len(out.values("chase", 16 << 20))
    assert 1 <= n < 1000
    assert out.truncated == [
        {
            "kind": "truncated",
            "test": "chase",
            "param": 16 << 20,
            "samples": n,
            "wanted": 1000,
            "reason": "max-seconds",
        },
    ]
    assert out.done is not None and out.done["elapsed_s"] < 5


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--local", "0"],
        ["--shmdev", "/dev/null"],
        ["--local", "1M", "--tests", "bogus"],
        ["--local", "1M", "--chase-sizes", "4Q"],
    ],
)
def test_bad_arguments_exit_1(memprobe: Path, args: list[str]) -> None:
    proc = run(memprobe, *args)
    assert proc.returncode == 1
    assert "usage: memprobe" in proc.stderr


def test_missing_device_exits_2(memprobe: Path, tmp_path: Path) -> None:
    proc = run(memprobe, "--shmdev", str(tmp_path / "obmm_shmdev99"), "--length", "2M")
    assert proc.returncode == 2
    assert "No such file or directory" in proc.stderr


def test_figures_pair_with_local_baseline(memprobe: Path, tmp_path: Path) -> None:
    local = parse_output(run(memprobe, "--local", "2M", *SMALL).stdout)
    shared = parse_output(
        run(memprobe, "--file", str(tmp_path / "f"), "--length", "2M", "--fill", *SMALL).stdout
    )
    lf = {f.name: f for f in figures_from_probe(local, "local", baseline_source=None)}
    sf = {f.name: f for f in figures_from_probe(shared, "file")}
    assert lf["data.chase.local.64KiB"].baseline is None
    assert sf["data.chase.file.64KiB"].baseline == "data.chase.local.64KiB"
    assert sf["data.read.file"].baseline == "data.read.local"
    assert sf["data.read.file"].higher_is_better is True
    assert sf["data.read.file"].unit == "GB/s"
    assert sf["engram.prefetch.file.128tok"].baseline == "engram.prefetch.local.128tok"
    assert sf["engram.rows_per_s.file.128tok"].higher_is_better is True
    assert "data.clock_gettime" in lf and "data.clock_gettime" not in sf
    # every baseline named by the shared-file figures exists among the local ones
    for fig in sf.values():
        assert fig.baseline in lf, fig.name
    # load samples have the clock pair subtracted and never go negative
    overhead = float(local.env["clock_overhead_ns"])
    raw = local.values("load", 4)
    assert lf["data.load.local"].samples == [max(v - overhead, 0.0) for v in raw]


def test_interleave_takes_samples_in_turn(memprobe: Path, tmp_path: Path) -> None:
    """--interleave: every source gets every sample, sample k of each round starting with the
    next source, all in one process; the output splits into one ProbeOutput per source."""
    spec = f"a=anon,b=anon-thp,c=file:{tmp_path / 'f'}"
    proc = run(memprobe, "--interleave", spec, "--length", "2M", *SMALL, "--tests", "load,chase")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(ln) for ln in proc.stdout.splitlines()]
    chase = [ln["source"] for ln in lines if ln["kind"] == "sample" and ln["test"] == "chase"]
    per_size = 3 * 3  # samples x sources
    assert len(chase) == 3 * per_size
    first = chase[:per_size]
    assert first == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # rotated each round
    loads = [ln["source"] for ln in lines if ln["kind"] == "sample" and ln["test"] == "load"]
    assert len(loads) == 50 * 3 and loads[:6] == ["a", "b", "c", "b", "c", "a"]
    outs = parse_output(proc.stdout).by_source()
    assert list(outs) == ["a", "b", "c"]
    for out in outs.values():
        assert len(out.values("chase", 64 << 10)) == 3
        assert len(out.values("load", 4)) == 50
    figs = {f.name: f for f in figures_from_probe(outs["c"], "c", baseline_source="a")}
    assert figs["data.chase.c.64KiB"].baseline == "data.chase.a.64KiB"
    assert figs["data.load.c"].baseline == "data.load.a"


def test_interleave_engram_same_tables_every_source(memprobe: Path, tmp_path: Path) -> None:
    """--interleave with engram: the process writes the tables into every source (a file
    shows what it wrote), checks each, and gives every source one sample per round, each the
    fastest of --best-of prefetches; the figures pair sample by sample with the baseline."""
    f = tmp_path / "f"
    spec = f"a=anon,b=anon-thp,c=file:{f}"
    proc = run(
        memprobe,
        *("--interleave", spec, "--length", "2M", "--tests", "engram"),
        *("--engram-rows", str(ROWS), "--engram-iters", "6", "--best-of", "3"),
        *("--engram-small-rows", "10"),
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(ln) for ln in proc.stdout.splitlines()]
    verify = [ln for ln in lines if ln["kind"] == "verify"]
    assert [(v["source"], v["ok"]) for v in verify] == [("a", True), ("b", True), ("c", True)]
    samples = [ln for ln in lines if ln["kind"] == "sample"]
    assert [s["test"] for s in samples] == ["engram"] * 18 + ["engram-small"] * 18
    assert [s["source"] for s in samples] == ["a", "b", "c"] * 12
    # no page fault while timed: every page of every source was mapped before
    info = {k: v for ln in lines if ln["kind"] == "info" for k, v in ln.items()}
    assert info["engram_faults"] == 0 and info["engram-small_faults"] == 0
    assert all(s["value"] > 0 and s["rows_per_s"] > 0 for s in samples)
    env = next(ln for ln in lines if ln["kind"] == "env")
    assert env["best_of"] == 3
    # the file holds the pattern the process wrote: float i = i * 0.001, row 42 of table 3
    data = f.read_bytes()
    off = (3 * ROWS + 42) * ENGRAM_ROW_BYTES
    got = struct.unpack_from(f"<{FLOATS_PER_ROW}f", data, off)
    first = (3 * ROWS + 42) * FLOATS_PER_ROW
    want = [struct.unpack("<f", struct.pack("<f", (first + i) * 0.001))[0] for i in range(3)]
    assert list(got[:3]) == want
    outs = parse_output(proc.stdout).by_source()
    figs = {
        x.name: x for x in figures_from_probe(outs["c"], "c", baseline_source="a", interleaved=True)
    }
    fig = figs["engram.prefetch.c.128tok"]
    assert fig.baseline == "engram.prefetch.a.128tok"
    assert fig.params["interleaved"] is True and len(fig.samples) == 6
    assert fig.params["faults"] == 0
    assert "fastest of 3 prefetches" in fig.note
    small = figs["engram.small_tables.c.128tok"]
    assert small.baseline == "engram.small_tables.a.128tok" and len(small.samples) == 6
    assert "the first 10 rows of each table" in small.note


def test_interleave_sync_kinds_need_a_path(memprobe: Path, tmp_path: Path) -> None:
    """shmdev-sync / shmdev-pmd-sync are kinds of their own (O_SYNC for that source only)."""
    for kind in ("shmdev-sync", "shmdev-pmd-sync"):
        proc = run(memprobe, "--interleave", f"a={kind}", "--length", "2M")
        assert proc.returncode == 1, kind
        proc = run(memprobe, "--interleave", f"a={kind}:{tmp_path / 'none'}", "--length", "2M")
        assert proc.returncode == 2 and "No such file" in proc.stderr, kind


@pytest.mark.parametrize(
    "spec", ["a", "a=bogus", "=anon", "a=shmdev", "a=anon:/x", ",".join(["a=anon"] * 7)]
)
def test_interleave_bad_list_exits_1(memprobe: Path, spec: str) -> None:
    proc = run(memprobe, "--interleave", spec, "--length", "2M")
    assert proc.returncode == 1
    assert "--interleave" in proc.stderr
