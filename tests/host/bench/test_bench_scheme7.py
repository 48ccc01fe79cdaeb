"""The seed's scheme-7 client (Bench 1-3) over the Python API: the table, the benches and
the figures, on plain memory here; the runner's choreography against the fake cluster."""

from __future__ import annotations

import array
import json
import mmap
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from obmm.bench import scheme7
from obmm.bench.results import Environment, Run

ROWS, DIM = 200, 16


def table() -> memoryview:
    buf = memoryview(mmap.mmap(-1, scheme7.table_bytes(ROWS, DIM)))
    scheme7.fill(buf, ROWS, DIM)
    return buf


def test_fill_writes_the_seeds_pattern_and_verify_checks_row_42() -> None:
    buf = table()
    floats = array.array("f", bytes(buf))
    assert len(floats) == ROWS * DIM
    for i in (0, 1, 42 * DIM + 3, ROWS * DIM - 1):
        assert floats[i] == array.array("f", [i * 0.001])[0]
    scheme7.verify(buf, DIM)
    buf[42 * DIM * 4 + 4 : 42 * DIM * 4 + 8] = b"\0\0\0\0"  # row 42, float 1
    with pytest.raises(ValueError, match="row 42"):
        scheme7.verify(buf, DIM)


def test_every_bench_has_both_sources_sample_by_sample() -> None:
    results = scheme7.measure(table(), ROWS, DIM, iters=3, seed=5)
    assert list(results) == [
        "bench1.row",
        *(f"bench2.batch{b}" for b in scheme7.BATCHES),
        *(f"bench3.{t}tok" for t in scheme7.TOKENS),
    ]
    for unit, _what, _scale, times in results.values():
        assert unit in ("us", "ms")
        assert set(times) == {"import", "local"}
        assert all(len(v) == 3 and all(ns > 0 for ns in v) for v in times.values())
    figs = scheme7.figures("cross-node", results, "test")
    run = Run(env=Environment.collect_host())
    run.add(figs)
    fig = run.figure("scheme7.bench3.128tok.cross-node")
    assert fig is not None and fig.unit == "ms" and fig.group == "scheme7"
    assert fig.baseline == "scheme7.bench3.128tok.cross-node-local"
    assert "12 tables x 128 tokens (1536 random rows)" in fig.note
    paired = run.paired_ratios(fig)
    assert paired is not None and len(paired) == 3


def test_copies_read_the_rows_they_pick() -> None:
    """A batch lands in consecutive rows of the buffer, each the table row it picked."""
    src = table()
    client = scheme7.Client(src, ROWS, DIM, seed=3)
    try:
        pairs = client.pick(40)
        client.sample(pairs)
        row = DIM * 4
        for d, s in pairs:
            assert bytes(client.dst[d : d + row]) == bytes(src[s : s + row])
    finally:
        client.close()


def test_sources_take_turns_going_first(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[int] = []
    real = scheme7.copy_rows

    def spy(src: memoryview, pairs: list[tuple[int, int]], row: int, dst: memoryview) -> int:
        order.append(id(src))
        return real(src, pairs, row, dst)

    monkeypatch.setattr(scheme7, "copy_rows", spy)
    src = table()
    client = scheme7.Client(src, ROWS, DIM, seed=3)
    try:
        for _ in range(4):
            client.sample(client.pick(2))
        imp, loc = id(client.sources["import"]), id(client.sources["local"])
        assert order == [imp, loc, loc, imp, imp, loc, loc, imp]
    finally:
        client.close()


@pytest.mark.parametrize(
    "argv",
    [
        ["client", "1"],
        ["fill", "1", "--rows", "10"],
        ["client", "1", "--source", "x", "--iters", "0"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        scheme7.main(argv)
    assert exc.value.code == 2


def test_missing_region_is_one_json_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(scheme7.obmm, "ShmDev", _missing_shmdev)
    assert scheme7.main(["client", "7", "--source", "x", "--rows", "100", "--dim", "8"]) == 1
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "obmm_shmdev7" in doc["error"]


def _missing_shmdev(mem_id: int, **_kw: object) -> object:
    raise OSError(2, f"No such file or directory: '/dev/obmm_shmdev{mem_id}'")


def test_random_rows_follow_the_seed() -> None:
    a = scheme7.Client(table(), ROWS, DIM, seed=9)
    b = scheme7.Client(table(), ROWS, DIM, seed=9)
    try:
        assert a.pick(10) == b.pick(10)
        rng = random.Random(9)
        assert [s for _d, s in scheme7.Client(table(), ROWS, DIM, seed=9).pick(3)] == [
            rng.randrange(ROWS) * DIM * 4 for _ in range(3)
        ]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["bench", "--hw"], "bench --hw runs only the scheme-7 benchmark: add --scheme7"),
        (["bench", "--scheme7", "--local-only"], "--scheme7 needs nodes with /dev/obmm"),
        (["bench", "--scheme7", "--hw"], "no hardware hosts"),
    ],
)
def test_bench_mode_misuse_is_one_line_and_status_2(
    argv: list[str], says: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HW_", "OBMM_"))}
    env.update(OBMM_TESTBED_RUN_ROOT=str(tmp_path / "run"), OBMM_TESTBED_CACHE=str(tmp_path / "c"))
    proc = subprocess.run(
        [sys.executable, "-m", "obmm.testbed.cli.main", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("obmm-testbed: ") and says in proc.stderr
