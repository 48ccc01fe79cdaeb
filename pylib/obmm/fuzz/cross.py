"""The cross-node mode's guest side: an exporter's regions and an importer's reader.

The host (tests/cluster/test_fuzz_xnode.py, ``make fuzz``) drives two nodes: the exporter
exports a region filled with a pattern; the importer imports it and runs :func:`reader_main`,
which maps it and, in a child process, reads, writes and hands its addresses to other kernel
paths (:mod:`obmm.fuzz.handoff`); meanwhile the host makes the exporter unexport, stop
(SIGSTOP of its QEMU, shorter or longer than the death timeout), reload its module or die,
and the exporter gives the withdrawn memory to a new export filled with poison
(:func:`reuse`).  The invariant the reader checks on every read: a word is the pattern the
export was filled with or what the reader itself wrote there, never anything written to the
memory after it was withdrawn (poison, or the zeros of the pool's clearing).  The reader ends
by SIGBUS (revoked) or at its time limit, then unimports; the host checks that both nodes are
idle again and that no kernel reported anything.

Standard library and the package's runtime only: it runs in the guests.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import obmm
from obmm import decoder
from obmm.fuzz import handoff, target
from obmm.identity import local_cna

PAGE = 4096
MASK64 = (1 << 64) - 1


def pattern_word(seed: int, offset: int) -> bytes:
    """The word a region filled with ``seed`` holds at ``offset`` (a page start): distinct
    per seed and offset, never zero (the pool's clearing writes zeros)."""
    x = (seed * 0x9E3779B97F4A7C15 + offset * 0xC2B2AE3D27D4EB4F) & MASK64
    x ^= x >> 29
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 32
    return (x | 1).to_bytes(8, "little")


def fill(mem_id: int, size: int, seed: int) -> None:
    """Write the pattern of ``seed`` at every page start of export ``mem_id``."""
    with obmm.ShmDev(mem_id) as shm, shm.mmap(size) as m:
        for off in range(0, size, PAGE):
            m.write(off, pattern_word(seed, off))


def export_fill(size: int, seed: int) -> dict[str, int]:
    """An export of ``size`` filled with the pattern of ``seed``: what the importer needs."""
    with obmm.Obmm() as dev:
        exp = dev.export(size)
        pa = dev.query_pa_by_memid(exp.mem_id)
    fill(exp.mem_id, size, seed)
    node = int((target.EMU / "node_id").read_text(), 0)
    return {"mem_id": exp.mem_id, "uba": exp.uba, "tokenid": exp.tokenid, "pa": pa,
            "node": node, "length": size}  # fmt: skip


def reuse(pa: int, size: int, poison_seed: int, timeout: float) -> dict[str, object]:
    """After an UNEXPORT at ``pa``: export ``size`` until the withdrawn memory comes back
    (quarantine ends once every live peer acknowledged), then fill it with the poison of
    ``poison_seed``.  Every export made stays (the host unexports them)."""
    made: list[int] = []
    reused = False
    deadline = time.monotonic() + timeout
    with obmm.Obmm() as dev:
        while time.monotonic() < deadline and not reused:
            try:
                exp = dev.export(size)
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.ENOMEM):
                    raise
                time.sleep(0.1)
                continue
            made.append(exp.mem_id)
            if dev.query_pa_by_memid(exp.mem_id) == pa:
                fill(exp.mem_id, size, poison_seed)
                reused = True
            elif target.pool_total() - target.pool_used() < size:
                break  # the pool is full of our own exports: the memory did not come back
    return {"reused": reused, "mem_ids": made}


def unexport_all() -> list[int]:
    """UNEXPORT every export of this node; their ids."""
    gone = []
    with obmm.Obmm() as dev:
        for mem_id in sorted(target.sysfs_ids()):
            kind = (target.SHMDEV_SYSFS / f"obmm_shmdev{mem_id}" / "type").read_text().strip()
            if kind == "export":
                dev.unexport(mem_id)
                gone.append(mem_id)
    return gone


def state() -> dict[str, object]:
    """What must be the same before a round and after it (nothing left behind)."""
    return {
        "regions": sorted(target.sysfs_ids()),
        "devices": sorted(target.shmdev_ids()),
        "used": target.pool_used(),
        "quarantined": target.quarantined(),
        "revoked": sorted(target.revoked_ids()),
        "iomem": target.iomem_others(),
        "memids": sorted(target.iomem_memids()[0]),
        "refcnt": target.module_refcnt(),
    }


# ---- the importer's reader ----

#: Paths the reader's child hands its addresses to (those of obmm.fuzz.handoff that neither
#: pin user memory for long nor change the mapping).
READER_PATHS = ("futex_wake", "futex_wait", "vmsplice", "process_vm_readv", "process_vm_writev",
                "o_direct_write", "o_direct_read", "ptrace_peek")  # fmt: skip


def _reader_child(mem_id: int, size: int, pmd: bool, seed: int, ops_seed: int, limit: float,
                  report: int) -> int:  # fmt: skip
    """Map the import and read, write and hand off its addresses until SIGBUS or ``limit``
    seconds; one JSON line every twenty operations to ``report``.  Exit 5 on a violation."""
    rng = random.Random(ops_seed)
    own: dict[int, bytes] = {}
    counts = {"reads": 0, "writes": 0, "handoffs": 0}

    def say(doc: Mapping[str, object]) -> None:
        os.write(report, (json.dumps(doc) + "\n").encode())

    with obmm.ShmDev(mem_id) as shm, shm.mmap(size, pmd=pmd) as m:
        say({"mapped": m.addr})
        end = time.monotonic() + limit
        while time.monotonic() < end:
            off = rng.randrange(0, size, PAGE)
            want = own.get(off, pattern_word(seed, off))
            what = rng.random()
            if what < 0.6:
                got = m.read(off, 8)
                counts["reads"] += 1
                if got != want:
                    say({"violation": f"offset {off:#x} reads {got.hex()}, "
                         f"the export held {want.hex()}", **counts})  # fmt: skip
                    return 5
            elif what < 0.8:
                word = bytes([0xEE]) + rng.getrandbits(56).to_bytes(7, "little")
                m.write(off, word)
                own[off] = word
                counts["writes"] += 1
            else:
                name = rng.choice(READER_PATHS)
                if name == "ptrace_peek":
                    got, err = handoff.ptrace_peek(m.addr + off)
                    if not err and got != want:
                        say({"violation": f"ptrace peek of offset {off:#x}: {got.hex()}, "
                             f"the export held {want.hex()}", **counts})  # fmt: skip
                        return 5
                else:
                    handoff.call(name, m.addr + off, PAGE, fd=shm.fd, value=0)
                counts["handoffs"] += 1
            if sum(counts.values()) % 20 == 0:
                say(counts)
    say(counts)
    return 0


def reader_main(argv: list[str]) -> int:
    """``python3 -c 'from obmm.fuzz import cross; cross.reader_main(sys.argv[1:])' NODE UBA
    LENGTH TOKENID SEED PMD OPS_SEED LIMIT OUT``: import, read until revoked or LIMIT seconds,
    unimport; the outcome as JSON in OUT (OUT.ready once the mapping reads)."""
    node, uba, length, tokenid, seed, pmd, ops_seed = (int(a, 0) for a in argv[:7])
    limit, out = float(argv[7]), Path(argv[8])
    addr = decoder.default_decoder().resolve(node, uba, length)
    doc: dict[str, object] = {"ended": "", "violation": ""}
    with obmm.Obmm() as dev:
        try:
            imp = dev.import_(addr, length, scna=local_cna(), tokenid=tokenid)
        except OSError as exc:  # the exporter may already be going: nothing to read
            doc.update(ended="import refused", errno=errno.errorcode.get(exc.errno or 0, ""))
            out.write_text(json.dumps(doc))
            return 0
        doc["mem_id"] = imp.mem_id
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.close(r)
            status = 1
            try:
                status = _reader_child(imp.mem_id, length, bool(pmd), seed, ops_seed, limit, w)
            finally:
                os._exit(status)
        os.close(w)
        last: dict[str, object] = {}
        with os.fdopen(r) as lines:
            for line in lines:
                msg = json.loads(line)
                if "mapped" in msg:
                    out.with_name(out.name + ".ready").write_text(str(imp.mem_id))
                    continue
                last = msg
        _, status = os.waitpid(pid, 0)
        doc.update({k: v for k, v in last.items() if k != "violation"})
        doc["violation"] = str(last.get("violation", ""))
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            doc["ended"] = "SIGBUS" if sig == signal.SIGBUS else f"signal {sig}"
        else:
            code = os.WEXITSTATUS(status)
            doc["ended"] = {0: "limit", 5: "violation"}.get(code, f"exit {code}")
        doc["revoked"] = imp.mem_id in target.revoked_ids()
        deadline = time.monotonic() + 30
        while True:
            try:
                dev.unimport(imp.mem_id)
                doc["unimport"] = "ok"
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    doc["unimport"] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                    break
                time.sleep(0.05)
    out.write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":  # pragma: no cover
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(reader_main(sys.argv[1:]))
