"""The seed's scheme-7 client benchmark (its Bench 1-3) over the Python API, run on a node.

The seed (docs/engram.md, section 3) exported a table of `rows` x `dim` fp32
(10 000 x 341: 1364 B rows) filled with float i = i x 0.001, imported it on another node,
mapped `/dev/obmm_shmdev<id>` and timed, with CLOCK_MONOTONIC around each operation:

* Bench 1: one random row copied into local memory (after 10 untimed copies of row 0);
* Bench 2: batches of 32, 64, 128 and 256 random rows, one copy per row;
* Bench 3: the Engram prefetch, 12 tables x 32, 64, 128 and 256 tokens (384 to 3072 random
  rows, all from the one table, as the seed reads them).

Here every step goes through the `obmm` package (ShmDev, Mapping) and the copies are
memoryview slice assignments, so the figures are those of a Python client: they can be put
beside the same mode run on real UB hosts (`obmm-testbed bench --scheme7 --hw`), not beside the
seed's C numbers.  Each sample is also taken from a copy of the table in local memory of the
same process, in turn with the import (the same rows, the order rotating), so every figure has
its local baseline measured under the same conditions.

    python3 -m obmm.bench.scheme7 fill MEM_ID [--rows N] [--dim D]
        writes the table into region MEM_ID through its shmdev (the exporter, like the seed's
        server) -> {"kind": "scheme7-fill", "bytes": ...}
    python3 -m obmm.bench.scheme7 client MEM_ID --source NAME [--rows N] [--dim D]
                                  [--iters I] [--sync] [--seed S]
        -> {"kind": "scheme7", "figures": [...]}

Failures print {"error": "..."} and exit 1.  Needs only python3, cffi and the obmm package.
"""

from __future__ import annotations

import argparse
import array
import json
import mmap
import random
import sys
import time
from collections.abc import Sequence

import obmm
from obmm.bench.results import Figure
from obmm.errors import ObmmError

ROWS = 10000
DIM = 341
ITERS = 200
WARMUP = 10
TABLES = 12
BATCHES = (32, 64, 128, 256)
TOKENS = (32, 64, 128, 256)
VERIFY_ROW = 42
VERIFY_FLOATS = 4
FLOAT_BYTES = 4
NS_PER_US = 1000.0
NS_PER_MS = 1_000_000.0
FILL_CHUNK = 1 << 16  # floats written per step of the fill
LOCAL_SUFFIX = "-local"


def table_bytes(rows: int, dim: int) -> int:
    return rows * dim * FLOAT_BYTES


def pattern(first: int, count: int) -> bytes:
    """Floats first .. first + count - 1 of the table: float i = i x 0.001 (fp32, host order)."""
    return array.array("f", [i * 0.001 for i in range(first, first + count)]).tobytes()


def fill(buf: memoryview, rows: int, dim: int) -> None:
    """Write the whole table into `buf`."""
    floats = rows * dim
    for first in range(0, floats, FILL_CHUNK):
        count = min(FILL_CHUNK, floats - first)
        buf[first * FLOAT_BYTES : (first + count) * FLOAT_BYTES] = pattern(first, count)


def verify(buf: memoryview, dim: int) -> None:
    """Row 42's first floats against the pattern, as the seed's client checks them."""
    first = VERIFY_ROW * dim
    got = bytes(buf[first * FLOAT_BYTES : (first + VERIFY_FLOATS) * FLOAT_BYTES])
    want = pattern(first, VERIFY_FLOATS)
    if got != want:
        shown = array.array("f", got).tolist()
        raise ValueError(
            f"row {VERIFY_ROW}[0..{VERIFY_FLOATS - 1}] is {shown}, not the table's "
            f"{array.array('f', want).tolist()}: the region does not hold the filled table"
        )


def copy_rows(src: memoryview, pairs: Sequence[tuple[int, int]], row: int, dst: memoryview) -> int:
    """Copy each (destination, source) row; the time it took in ns."""
    start = time.perf_counter_ns()
    for d, s in pairs:
        dst[d : d + row] = src[s : s + row]
    return time.perf_counter_ns() - start


Results = dict[str, tuple[str, str, float, dict[str, list[int]]]]


class Client:
    """The benches of one run: the import and its local copy, sampled in turn."""

    def __init__(self, imported: memoryview, rows: int, dim: int, seed: int) -> None:
        self.row = dim * FLOAT_BYTES
        self.rows = rows
        size = table_bytes(rows, dim)
        self._local_map = mmap.mmap(-1, size)
        self.local = memoryview(self._local_map)
        self.local[:] = imported[:size]  # the same table, in this process's memory
        self.sources = {"import": imported, "local": self.local}
        self._dst_map = mmap.mmap(-1, max(TOKENS) * TABLES * self.row)
        self.dst = memoryview(self._dst_map)
        self.rng = random.Random(seed)
        self.turn = 0

    def close(self) -> None:
        for view, backing in ((self.local, self._local_map), (self.dst, self._dst_map)):
            view.release()
            backing.close()

    def pick(self, count: int) -> list[tuple[int, int]]:
        """`count` random rows of the table, copied to consecutive rows of the buffer."""
        return [(i * self.row, self.rng.randrange(self.rows) * self.row) for i in range(count)]

    def sample(self, pairs: Sequence[tuple[int, int]]) -> dict[str, int]:
        """One copy of `pairs` from each source, the source going first taking turns (ns)."""
        order = list(self.sources)
        first = self.turn % len(order)
        self.turn += 1
        out = {}
        for name in order[first:] + order[:first]:
            out[name] = copy_rows(self.sources[name], pairs, self.row, self.dst)
        return out

    def bench(self, count: int, iters: int) -> dict[str, list[int]]:
        times: dict[str, list[int]] = {name: [] for name in self.sources}
        for _ in range(iters):
            for name, ns in self.sample(self.pick(count)).items():
                times[name].append(ns)
        return times

    def warm_up(self) -> None:
        """The seed's 10 untimed copies of row 0 before Bench 1, from each source."""
        for _ in range(WARMUP):
            self.sample([(0, 0)])


def figures(source: str, results: Results, note: str) -> list[Figure]:
    """Figures `scheme7.<bench>.<source>` and `...<source>-local`, paired sample by sample."""
    out = []
    for bench, (unit, what, scale, times) in results.items():
        for side, name in (("local", f"{source}{LOCAL_SUFFIX}"), ("import", source)):
            out.append(
                Figure(
                    name=f"scheme7.{bench}.{name}",
                    group="scheme7",
                    unit=unit,
                    samples=[ns / scale for ns in times[side]],
                    baseline=f"scheme7.{bench}.{source}{LOCAL_SUFFIX}"
                    if side == "import"
                    else None,
                    params={"test": bench, "source": name, "interleaved": True},
                    note=f"{what}; {note}",
                )
            )
    return out


def measure(imported: memoryview, rows: int, dim: int, iters: int, seed: int) -> Results:
    """Bench 1-3 on the table in `imported` and on a local copy of it, sample by sample:
    bench -> (unit, what, ns per unit, source -> times in ns)."""
    verify(imported, dim)
    client = Client(imported, rows, dim, seed)
    try:
        client.warm_up()
        results: Results = {
            "bench1.row": (
                "us",
                f"Bench 1: one random {client.row} B row",
                NS_PER_US,
                client.bench(1, iters),
            )
        }
        for batch in BATCHES:
            results[f"bench2.batch{batch}"] = (
                "us",
                f"Bench 2: a batch of {batch} random rows, one copy each",
                NS_PER_US,
                client.bench(batch, iters),
            )
        for tokens in TOKENS:
            results[f"bench3.{tokens}tok"] = (
                "ms",
                f"Bench 3: Engram prefetch, {TABLES} tables x {tokens} tokens "
                f"({TABLES * tokens} random rows)",
                NS_PER_MS,
                client.bench(TABLES * tokens, iters),
            )
    finally:
        client.close()
    return results


def run_client(mem_id: int, source: str, rows: int, dim: int, iters: int, *, sync: bool,
               seed: int) -> list[Figure]:  # fmt: skip
    """Map import `mem_id` (O_SYNC with `sync`) and measure; the figures of `source`."""
    size = table_bytes(rows, dim)
    with obmm.ShmDev(mem_id, sync=sync) as shm, shm.mmap(length=mmap_length(size)) as m:
        results = measure(m.buf, rows, dim, iters, seed)
    note = (
        f"{rows} x {dim} fp32 table, {'O_SYNC' if sync else 'cacheable'} mapping; Python "
        "client (memoryview copies); local: a copy of the table in the same process, sampled "
        "in turn with the import"
    )
    return figures(source, results, note)


def mmap_length(size: int) -> int:
    """The mapping length for a table of `size` bytes: whole pages."""
    page = mmap.PAGESIZE
    return (size + page - 1) // page * page


def run_fill(mem_id: int, rows: int, dim: int) -> int:
    """Fill and unmap: on UB the unmap writes the table back, and the client maps it only
    afterwards (docs/coherence.md, read-mostly table)."""
    size = table_bytes(rows, dim)
    with obmm.ShmDev(mem_id) as shm, shm.mmap(length=mmap_length(size)) as m:
        fill(m.buf, rows, dim)
        verify(m.buf, dim)
    return size


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m obmm.bench.scheme7", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("fill", "client"):
        s = sub.add_parser(name)
        s.add_argument("mem_id", type=int)
        s.add_argument("--rows", type=int, default=ROWS)
        s.add_argument("--dim", type=int, default=DIM)
        if name == "client":
            s.add_argument("--source", required=True, help="figure name part, e.g. cross-node")
            s.add_argument("--iters", type=int, default=ITERS)
            s.add_argument("--sync", action="store_true", help="open the shmdev O_SYNC")
            s.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.rows < VERIFY_ROW + 1 or args.dim < VERIFY_FLOATS:
        p.error(f"--rows must be > {VERIFY_ROW} and --dim >= {VERIFY_FLOATS}")
    if args.cmd == "client" and args.iters < 1:
        p.error("--iters must be >= 1")
    try:
        if args.cmd == "fill":
            out: dict[str, object] = {
                "kind": "scheme7-fill",
                "bytes": run_fill(args.mem_id, args.rows, args.dim),
            }
        else:
            figs = run_client(
                args.mem_id,
                args.source,
                args.rows,
                args.dim,
                args.iters,
                sync=args.sync,
                seed=args.seed,
            )
            out = {"kind": "scheme7", "figures": [f.to_dict() for f in figs]}
    except (ObmmError, OSError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
