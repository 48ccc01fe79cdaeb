"""Guest side of tests/cluster/test_coherence_xnode.py (copied into every node; not a host test
module): programs of the shapes docs/coherence.md describes, run under either coherence model.

    python3 -m coherence_side publish MEM_ID GEN
        NC (O_SYNC) stores of a 4 KiB frame of generation GEN: every 64-byte line holds GEN,
        the payload lines first, the descriptor (line 0) last.
    python3 -m coherence_side consume MEM_ID DIR --gens 2,3 --way none|update_range|remap
        Map the frame cacheable, write DIR/ready with the generation seen, then for each GEN
        wait for DIR/published-<GEN> (the test's word that A has published it), poll the
        descriptor until it reaches GEN, for at most --timeout seconds from then (`way` is the
        maintenance before each look), and write DIR/gen<GEN>: {"result": ok|mixed|stale,
        "old_lines": [...]}.  The window starts at the publication, not before it: however
        long A's publish took to start on a busy host, B looks as long after it.
    python3 -m coherence_side hold MEM_ID DIR NAME --offset N --data HEX [--release unmap|handover]
        [--pmd]
        Map the region cacheable read-write (4 KiB, or 2 MiB PMD granule) and read its first
        page (the node caches it), touch DIR/filled-NAME; on DIR/write-NAME store DATA at N,
        touch DIR/written-NAME; on DIR/release-NAME unmap (or hand ownership over: UPDATE_RANGE
        to READONLY, inferred cache ops), touch DIR/released-NAME, and wait to be killed.
    python3 -m coherence_side steps MEM_ID DIR --size N
        Map N bytes of the region cacheable read-write and hold the mapping; for K = 0, 1, ...
        wait for DIR/K.json, a list of steps, do them and write DIR/K.out: the hex of each
        read.  Steps: ["write", OFF, HEX], ["read", OFF, LEN], ["update", OFF, LEN, STATE,
        CACHE_OPS] (names without OBMM_SHM_MEM_ / OBMM_SHM_CACHE_: READWRITE, INVAL, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path

import obmm
from obmm import abi

FRAME = 4096
LINE = 64
LINES = FRAME // LINE
SZ_2M = 2 << 20
POLL_S = 0.001


def frame_of(gen: int) -> bytes:
    return struct.pack("<Q", gen) * (FRAME // 8)


def publish(mem_id: int, gen: int) -> None:
    body = frame_of(gen)
    with obmm.ShmDev(mem_id, sync=True) as shm, shm.mmap(FRAME) as m:
        m.write(LINE, body[LINE:])
        m.write(0, body[:LINE])


def _wait(path: Path) -> None:
    while not path.exists():
        time.sleep(0.01)


def _put(path: Path, doc: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def consume(mem_id: int, out: Path, gens: list[int], way: str, timeout: float) -> None:
    ro = abi.OBMM_SHM_MEM_NORMAL | abi.OBMM_SHM_MEM_READONLY
    shm = obmm.ShmDev(mem_id, writable=False)
    m = shm.mmap(FRAME, prot=obmm.PROT_READ)

    def descriptor() -> int:
        return int(struct.unpack("<Q", m.read(0, 8))[0])

    _put(out / "ready", {"gen": descriptor()})
    for gen in gens:
        _wait(out / f"published-{gen}")
        deadline = time.monotonic() + timeout
        while True:
            # The maintenance a consumer on UB must do before it looks (docs/coherence.md).
            if way == "update_range":
                shm.update_range(m.addr, m.addr + FRAME, ro, abi.OBMM_SHM_CACHE_INVAL)
            elif way == "remap":
                m.close()
                m = shm.mmap(FRAME, prot=obmm.PROT_READ)
            seen = descriptor()
            if seen >= gen:
                break
            if time.monotonic() > deadline:
                _put(out / f"gen{gen}", {"result": "stale", "descriptor": seen})
                return
            time.sleep(POLL_S)
        frame = m.read(0, FRAME)
        lines = [struct.unpack_from("<Q", frame, i * LINE)[0] for i in range(LINES)]
        old = [i for i, v in enumerate(lines) if v != seen]
        _put(out / f"gen{gen}", {"result": "mixed" if old else "ok", "old_lines": old})


def hold(
    mem_id: int, out: Path, name: str, offset: int, data: bytes, release: str, pmd: bool
) -> None:
    shm = obmm.ShmDev(mem_id)
    size = SZ_2M if pmd else FRAME
    m = shm.mmap(size, pmd=pmd)
    m.read(0, FRAME)
    _put(out / f"filled-{name}", {})
    _wait(out / f"write-{name}")
    m.write(offset, data)
    _put(out / f"written-{name}", {})
    _wait(out / f"release-{name}")
    if release == "handover":
        rw_to_ro = abi.OBMM_SHM_MEM_NORMAL | abi.OBMM_SHM_MEM_READONLY
        shm.update_range(m.addr, m.addr + size, rw_to_ro, abi.OBMM_SHM_CACHE_INFER)
    else:
        m.close()
    _put(out / f"released-{name}", {})
    while True:
        time.sleep(1)


def steps(mem_id: int, out: Path, size: int) -> None:
    shm = obmm.ShmDev(mem_id)
    m = shm.mmap(size)
    for k in range(1 << 30):
        _wait(out / f"{k}.json")
        reads = []
        for kind, off, *args in json.loads((out / f"{k}.json").read_text()):
            if kind == "write":
                m.write(off, bytes.fromhex(args[0]))
            elif kind == "read":
                reads.append(m.read(off, args[0]).hex())
            else:  # update
                state = abi.OBMM_SHM_MEM_NORMAL | getattr(abi, f"OBMM_SHM_MEM_{args[1]}")
                ops = getattr(abi, f"OBMM_SHM_CACHE_{args[2]}")
                shm.update_range(m.addr + off, m.addr + off + args[0], state, ops)
        _put(out / f"{k}.out", reads)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="coherence_side")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("publish")
    p.add_argument("mem_id", type=int)
    p.add_argument("gen", type=int)
    p = sub.add_parser("consume")
    p.add_argument("mem_id", type=int)
    p.add_argument("dir", type=Path)
    p.add_argument("--gens", default="2")
    p.add_argument("--way", choices=("none", "update_range", "remap"), default="none")
    p.add_argument("--timeout", type=float, default=5.0)
    p = sub.add_parser("hold")
    p.add_argument("mem_id", type=int)
    p.add_argument("dir", type=Path)
    p.add_argument("name")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--data", default="")
    p.add_argument("--release", choices=("unmap", "handover"), default="unmap")
    p.add_argument("--pmd", action="store_true", help="a PMD-granule (2 MiB) mapping")
    p = sub.add_parser("steps")
    p.add_argument("mem_id", type=int)
    p.add_argument("dir", type=Path)
    p.add_argument("--size", type=int, default=FRAME)
    args = ap.parse_args(argv)
    if args.cmd == "steps":
        steps(args.mem_id, args.dir, args.size)
    elif args.cmd == "publish":
        publish(args.mem_id, args.gen)
    elif args.cmd == "consume":
        gens = [int(g) for g in args.gens.split(",")]
        consume(args.mem_id, args.dir, gens, args.way, args.timeout)
    else:
        data = bytes.fromhex(args.data)
        hold(args.mem_id, args.dir, args.name, args.offset, data, args.release, args.pmd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
