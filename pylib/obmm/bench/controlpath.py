"""Control-path latency: every OBMM ioctl, per region size, timed with perf_counter_ns.

Runs on a node (guest or real UB host) with python3, cffi and the obmm package:

    python3 -m obmm.bench.controlpath [--sizes 2M,8M,...] [--reps 10] [--max-seconds 20]

and prints one JSON document {"kind": "controlpath", "figures": [...]} (the figures of
`obmm.bench.results`, every sample in microseconds).  Per size and repetition:

    export -> resolve decoder address -> import (loopback) -> open shmdev + mmap + first read
    (= export-to-readable) -> addr_query by id and by PA -> munmap -> unimport -> unexport

then the baselines of the same size: an anonymous mmap with MAP_POPULATE (allocating and
zeroing that much local memory, what export does) and its munmap, and an anonymous mmap + first
read (what open + mmap + first touch of a shmdev compares with).  The size-independent ioctls
(import, unimport, addr_query) are paired with a null system call through the same Python path.
Sizes larger than the free pool are recorded as skipped with the reason, never dropped.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import obmm
from obmm import decoder as decoder_mod
from obmm import identity
from obmm.bench.regions import node_id, pool_free
from obmm.bench.results import Figure, size_label
from obmm.errors import ObmmError

SIZES = (2 << 20, 8 << 20, 32 << 20, 128 << 20, 512 << 20, 1 << 30)
MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0x8000)  # same value on x86_64 and arm64
NULL_SYSCALL_REPS = 1000
NS_PER_US = 1000.0

# op -> (baseline, what the op is)
OPS: dict[str, tuple[str, str]] = {
    "export": ("base.mmap_populate", "OBMM_CMD_EXPORT ioctl (allocates and zeroes the region)"),
    "import": ("null_syscall", "OBMM_CMD_IMPORT ioctl of a loopback import"),
    "shmdev_open_mmap_touch": ("base.mmap_touch", "open /dev/obmm_shmdev + mmap + first read"),
    "export_to_readable": (
        "base.mmap_touch",
        "export + decoder resolve + import + open + mmap + first read",
    ),
    "query_pa": ("null_syscall", "OBMM_CMD_ADDR_QUERY by mem_id + offset"),
    "query_memid": ("null_syscall", "OBMM_CMD_ADDR_QUERY by PA"),
    "unimport": ("null_syscall", "OBMM_CMD_UNIMPORT ioctl"),
    "unexport": ("base.munmap", "OBMM_CMD_UNEXPORT ioctl (frees the region)"),
}
BASE_OPS: dict[str, str] = {
    "base.mmap_populate": "anonymous mmap with MAP_POPULATE (local allocate + zero)",
    "base.munmap": "munmap of the populated anonymous mapping",
    "base.mmap_touch": "anonymous mmap + first read",
}
IMPORT_OPS = ("import", "shmdev_open_mmap_touch", "export_to_readable", "unimport")


def _us(t0: int, t1: int) -> float:
    return (t1 - t0) / NS_PER_US


@dataclass
class SizeResult:
    size: int
    samples: dict[str, list[float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # op -> reason
    stopped: str = ""  # why the repetitions ended early, if they did

    def add(self, op: str, value: float) -> None:
        self.samples.setdefault(op, []).append(value)


def null_syscall_samples(reps: int = NULL_SYSCALL_REPS) -> list[float]:
    """getppid() through Python: the floor every timed ioctl call here stands on."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        os.getppid()
        out.append(_us(t0, time.perf_counter_ns()))
    return out


def mem_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# Populating a baseline this close to MemAvailable would wake the OOM killer.
BASELINE_HEADROOM = 64 << 20


def _baselines(res: SizeResult) -> None:
    size = res.size
    available = mem_available()
    if available is not None and size + BASELINE_HEADROOM > available:
        reason = (
            f"{size_label(size)} does not fit in the node's available memory "
            f"({available >> 20} MiB) with {BASELINE_HEADROOM >> 20} MiB to spare"
        )
        for op in BASE_OPS:
            res.skipped[op] = reason
        return
    t0 = time.perf_counter_ns()
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | MAP_POPULATE)
    t1 = time.perf_counter_ns()
    m.close()
    t2 = time.perf_counter_ns()
    res.add("base.mmap_populate", _us(t0, t1))
    res.add("base.munmap", _us(t1, t2))
    t0 = time.perf_counter_ns()
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    m[0]  # first touch
    t1 = time.perf_counter_ns()
    m.close()
    res.add("base.mmap_touch", _us(t0, t1))


def _one_rep(
    dev: obmm.Obmm, res: SizeResult, decoder: decoder_mod.Decoder, node: int, scna: int | None
) -> None:
    size = res.size
    t0 = time.perf_counter_ns()
    exp = dev.export(size)
    t1 = time.perf_counter_ns()
    res.add("export", _us(t0, t1))
    imp: obmm.Import | None = None
    try:
        if "import" not in res.skipped:
            try:
                if scna is None:
                    raise decoder_mod.DecoderError("no local CNA (no UB controller in sysfs)")
                addr = decoder.resolve(node, exp.uba, size)
                i0 = time.perf_counter_ns()
                imp = dev.import_(addr, size, scna=scna, tokenid=exp.tokenid)
                i1 = time.perf_counter_ns()
            except (ObmmError, decoder_mod.DecoderError) as exc:
                for op in IMPORT_OPS:
                    res.skipped[op] = f"loopback import failed: {exc}"
            else:
                res.add("import", _us(i0, i1))
                o0 = time.perf_counter_ns()
                with obmm.ShmDev(imp.mem_id) as shm:
                    mapping = shm.mmap(size)
                    mapping.buf[0]  # first touch
                    o1 = time.perf_counter_ns()
                    mapping.close()
                res.add("shmdev_open_mmap_touch", _us(o0, o1))
                res.add("export_to_readable", _us(t0, o1))
        q0 = time.perf_counter_ns()
        pa = dev.query_pa_by_memid(exp.mem_id, 0)
        q1 = time.perf_counter_ns()
        dev.query_memid_by_pa(pa)
        q2 = time.perf_counter_ns()
        res.add("query_pa", _us(q0, q1))
        res.add("query_memid", _us(q1, q2))
    finally:
        if imp is not None:
            u0 = time.perf_counter_ns()
            dev.unimport(imp.mem_id)
            res.add("unimport", _us(u0, time.perf_counter_ns()))
        u0 = time.perf_counter_ns()
        dev.unexport(exp.mem_id)
        res.add("unexport", _us(u0, time.perf_counter_ns()))


def measure_size(
    dev: obmm.Obmm,
    size: int,
    *,
    reps: int,
    max_seconds: float,
    decoder: decoder_mod.Decoder,
    node: int,
    scna: int | None,
    free: int | None,
) -> SizeResult:
    res = SizeResult(size)
    if free is not None and size > free:
        reason = f"{size_label(size)} is larger than the free export pool ({size_label(free)})"
        for op in (*OPS, *BASE_OPS):
            res.skipped[op] = reason
        return res
    end = time.monotonic() + max_seconds
    for rep in range(reps):
        if rep and time.monotonic() > end:
            break
        try:
            _one_rep(dev, res, decoder, node, scna)
        except ObmmError as exc:
            if rep:  # keep what was measured; say why it stopped
                res.stopped = f"stopped after {rep} repetition(s): {exc}"
                break
            for op in (*OPS, *BASE_OPS):
                res.skipped.setdefault(op, f"first {size_label(size)} repetition failed: {exc}")
            return res
        _baselines(res)
    return res


def figures(results: Sequence[SizeResult], null_samples: Sequence[float]) -> list[Figure]:
    figs = [
        Figure(
            name="control.null_syscall",
            group="control",
            unit="us",
            samples=list(null_samples),
            params={"op": "null_syscall"},
            note="getppid() timed through the same Python path as the ioctls",
        )
    ]
    for res in results:
        label = size_label(res.size)
        for op in (*OPS, *BASE_OPS):
            if op in OPS:
                base, what = OPS[op]
                base_name = "control.null_syscall" if base == "null_syscall" else None
                base_name = base_name or f"control.{base}.{label}"
            else:
                base_name, what = None, BASE_OPS[op]
            samples = res.samples.get(op, [])
            reason = res.skipped.get(op) if not samples else None
            if not samples and reason is None:
                reason = "no samples"
            figs.append(
                Figure(
                    name=f"control.{op}.{label}",
                    group="control",
                    unit="us",
                    samples=samples,
                    baseline=base_name,
                    params={"op": op, "size": res.size},
                    note="; ".join(x for x in (what, res.stopped) if x),
                    skipped=reason,
                )
            )
    return figs


def run(
    sizes: Sequence[int] = SIZES,
    *,
    reps: int = 10,
    max_seconds: float = 20.0,
    decoder: decoder_mod.Decoder | None = None,
    node: int | None = None,
) -> list[Figure]:
    """Measure every size on this node; returns the figures (never raises for a skipped size)."""
    decoder = decoder or decoder_mod.default_decoder()
    node = node_id() if node is None else node
    try:
        scna: int | None = identity.local_cna()
    except decoder_mod.DecoderError:
        scna = None
    results = []
    null = null_syscall_samples()
    with obmm.Obmm() as dev:
        for size in sizes:
            results.append(
                measure_size(
                    dev,
                    size,
                    reps=reps,
                    max_seconds=max_seconds,
                    decoder=decoder,
                    node=node,
                    scna=scna,
                    free=pool_free(),
                )
            )
    return figures(results, null)


def parse_sizes(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().upper().removesuffix("B").removesuffix("I")
        shift = {"K": 10, "M": 20, "G": 30}.get(part[-1:], 0)
        out.append(int(part[:-1] if shift else part, 0) << shift)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m obmm.bench.controlpath",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", type=parse_sizes, default=list(SIZES), help="e.g. 2M,8M,1G")
    p.add_argument("--reps", type=int, default=10, help="repetitions per size (10)")
    p.add_argument("--max-seconds", type=float, default=20.0, help="budget per size (20)")
    p.add_argument("--node", type=int, default=None, help="this node's fabric id (sysfs)")
    args = p.parse_args(argv)
    try:
        figs = run(args.sizes, reps=args.reps, max_seconds=args.max_seconds, node=args.node)
    except ObmmError as exc:
        print(json.dumps({"kind": "controlpath", "error": str(exc), "figures": []}))
        return 1
    print(json.dumps({"kind": "controlpath", "figures": [f.to_dict() for f in figs]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
