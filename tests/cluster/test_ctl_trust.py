"""Trust of the shared control region: node A (hostile or buggy) writes garbage there.

Node A = 0 corrupts bytes of the control region (its own node entry and record slots, the
header) through sysfs ``resource2`` (guest_side/ctlpoke.py); node B = 1 imports from A.  What
each corruption must do (kmod/obmm_emu/README.md, "Trust of the control region"):

* A node's own entry is rewritten whole, from private state, at every beat: one stray write
  heals within a heartbeat period, A stays alive for B.
* An entry that stays unreadable (stuck odd seq) or invalid (another node id, boot id 0) is
  judged by its last good read: A is dead after the death timeout; a state other than online
  makes A offline at once.  Either way B's imports of A are revoked (SIGBUS) and new ones
  refused; once the corruption stops A is back at its next beat.
* A record an import depends on that stays unreadable for a death timeout revokes the import.
* Every record slot LIVE with a stuck seq: B's import attempt is refused in bounded time.
* A record claiming more than the window holds grants nothing outside the window.
* A header with another layout is refused at load (fabric disabled), never interpreted.

In every case B's kernel log stays free of reports (the suite's guard).  Two cases that take
the same path as a tested one are marked ``slow``: ``make qemu-test`` leaves them to
``make fuzz``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

import pytest
from xharness import ClusterHarness

pytestmark = pytest.mark.emulator_only

A, B = 0, 1
SIZE = 2 << 20
SIGBUS_STATUS = 128 + 7
# heartbeat_misses (8) x heartbeat_ms (250) + two scan periods, with TCG slack
DEATH_BUDGET_S = 15.0
HOSTILE_S = 4.0  # how long the hostile writer on A keeps at it

EXPORT = """
import json, obmm, xnode
with obmm.Obmm() as dev:
    exp = dev.export({size})
print(json.dumps({{"mem_id": exp.mem_id, "handle": xnode.handle_for(exp).to_json()}}))
"""

IMPORT = """
import json, obmm, xnode
from obmm.handle import Handle
h = Handle.from_json({handle!r})
try:
    imp = xnode.import_handle(h)
except obmm.ObmmError as exc:
    print(json.dumps({{"errno": exc.errno}}))
else:
    # Made, as the real driver makes it (it does not check the token): revoked when no live
    # export covers it (#27), where it was EACCES before.
    revoked = str(imp.mem_id) in open("/sys/kernel/obmm_emu/revoked").read().split()
    print(json.dumps({{"errno": 0, "mem_id": imp.mem_id, "revoked": revoked}}))
"""

RAW_IMPORT = """
import errno, json, obmm
from obmm.identity import local_cna
from pathlib import Path
w = Path("/sys/kernel/obmm_emu/windows")
win = {{int((d / "node").read_text(), 0): (int((d / "base").read_text(), 0),
        int((d / "size").read_text(), 0)) for d in w.iterdir()}}
base, size = win[{node}]
addr = eval({addr!r}, {{"base": base, "size": size}})
length = eval({length!r}, {{"base": base, "size": size}})
t0 = __import__("time").monotonic()
with obmm.Obmm() as dev:
    try:
        imp = dev.import_(addr, length, scna=local_cna(), tokenid={token})
    except obmm.ObmmError as exc:
        out = {{"errno": exc.errno}}
    else:
        revoked = str(imp.mem_id) in open("/sys/kernel/obmm_emu/revoked").read().split()
        dev.unimport(imp.mem_id)
        out = {{"errno": 0, "revoked": revoked}}
out["ms"] = round((__import__("time").monotonic() - t0) * 1000, 1)
print(json.dumps(out))
"""


def export_on_a(xc: ClusterHarness) -> dict[str, object]:
    doc: dict[str, object] = xc.py_json(A, EXPORT.format(size=SIZE))
    return doc


def import_on_b(xc: ClusterHarness, handle: object) -> dict[str, int]:
    doc: dict[str, int] = xc.py_json(B, IMPORT.format(handle=handle))
    return doc


def unexport_on_a(xc: ClusterHarness, mem_id: object) -> None:
    xc.py(A, f"import xnode; xnode.unexport({mem_id})")


def unimport_on_b(xc: ClusterHarness, mem_id: int) -> None:
    xc.py(B, f"import xnode; xnode.unimport({mem_id})")


@contextlib.contextmanager
def a_export(xc: ClusterHarness) -> Iterator[dict[str, object]]:
    exp = export_on_a(xc)
    try:
        yield exp
    finally:
        unexport_on_a(xc, exp["mem_id"])


def touch_on_b(xc: ClusterHarness, mem_id: int, tmp: str, tag: str, limit: float = 60) -> str:
    """A reader of B's import in the background (exits 3 after ``limit`` s unless it faults);
    the file its exit status goes to."""
    status, ready = f"{tmp}/{tag}.status", f"{tmp}/{tag}.ready"
    xc.spawn(
        B,
        f"{xc.python} -m xnode touch --mem-id {mem_id} --ready {ready} --limit {limit}; "
        f"echo $? > {status}",
        name=f"touch-{tag}",
    )
    xc.wait_file(B, ready, log=f"/tmp/touch-{tag}.log")
    return status


def wait_sigbus(xc: ClusterHarness, status: str) -> float:
    t0 = time.monotonic()
    code = int(xc.wait_file(B, status, timeout=DEATH_BUDGET_S + 60).strip())
    elapsed = time.monotonic() - t0
    assert code == SIGBUS_STATUS, f"B's reader ended with {code} after {elapsed:.1f} s, not SIGBUS"
    assert elapsed < DEATH_BUDGET_S, f"B's reader faulted only after {elapsed:.1f} s"
    return elapsed


def revoked_on_b(xc: ClusterHarness) -> list[int]:
    out = xc.run(B, "cat /sys/kernel/obmm_emu/revoked").out.split()
    return [int(t) for t in out if t.isdigit()]


def test_one_odd_seq_write_on_a_node_entry_heals_at_its_next_beat(xc: ClusterHarness) -> None:
    seq = xc.py_json(
        A,
        "import ctlpoke, json, time\n"
        "c = ctlpoke.Ctl(); off = c.node(0)\n"
        "c.set32(off, c.u32(off) | 1)\n"
        "time.sleep(3.0)\n"  # past B's death timeout (8 x 250 ms)
        "print(json.dumps(c.u32(off)))\n",
    )
    assert seq % 2 == 0, f"A's entry seq is still odd ({seq}) after a dozen beats"
    with a_export(xc) as exp:
        imp = import_on_b(xc, exp["handle"])
        assert imp["errno"] == 0, f"B refused A's export after one stray write: {imp}"
        unimport_on_b(xc, imp["mem_id"])


def test_stuck_odd_record_revokes_the_import_within_the_death_timeout(
    xc: ClusterHarness, guest_tmp: str
) -> None:
    with a_export(xc) as exp:
        imp = import_on_b(xc, exp["handle"])
        assert imp["errno"] == 0, imp
        try:
            status = touch_on_b(xc, imp["mem_id"], guest_tmp, "stuck-record")
            xc.py(
                A,
                "import ctlpoke\n"
                f"c = ctlpoke.Ctl(); off = c.record(0, c.live_slot(0, {exp['mem_id']}))\n"
                "c.set32(off, c.u32(off) | 1)\n",
            )
            elapsed = wait_sigbus(xc, status)
            print(f"stuck record: B's reader faulted {elapsed:.2f} s after the corruption")
            assert imp["mem_id"] in revoked_on_b(xc)
        finally:
            unimport_on_b(xc, imp["mem_id"])
    # A's unexport rewrote the record from its own counts: it reads stable again
    seq = xc.py_json(
        A,
        "import ctlpoke, json\nc = ctlpoke.Ctl()\n"
        "print(json.dumps([c.u32(c.record(0, s)) & 1 for s in range(1024)]))\n",
    )
    assert not any(seq), "a record of A is left with an odd seq after A rewrote it"


# node_id and boot0 take the same path as odd ("no information"): make fuzz runs them
@pytest.mark.parametrize(
    "kind",
    ["state", "odd", pytest.param("node_id", marks=pytest.mark.slow),
     pytest.param("boot0", marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_corrupted_node_entry_is_a_dead_node_not_a_crash(
    xc: ClusterHarness, guest_tmp: str, kind: str
) -> None:
    """A hostile writer on A keeps A's entry corrupted while A's kernel rewrites it every beat.

    A state other than online is read as offline: B revokes at once.  An unreadable or invalid
    entry carries no information: A is dead once no good read came for the death timeout; a
    good read between A's rewrite and the writer's next scribble keeps A alive, which is right
    too (A is alive).  Either way B's reader faults or keeps reading, B's IMPORT answers, and
    once the writer stops A is back.
    """
    with a_export(xc) as exp, a_export(xc) as other:
        imp = import_on_b(xc, exp["handle"])
        assert imp["errno"] == 0, imp
        try:
            status = touch_on_b(xc, imp["mem_id"], guest_tmp, f"hostile-{kind}", HOSTILE_S + 3)
            done = f"{guest_tmp}/ctl-{kind}.done"
            t0 = time.monotonic()
            xc.spawn(A, f"{xc.python} -m ctlpoke hostile {kind} 0 {HOSTILE_S} {done}",
                     name=f"ctl-{kind}")  # fmt: skip
            time.sleep(HOSTILE_S / 2)
            during = import_on_b(xc, other["handle"])
            assert during["errno"] == 0, during  # made; revoked if A counts as dead
            unimport_on_b(xc, during["mem_id"])
            xc.wait_file(A, done, timeout=HOSTILE_S + 30, log=f"/tmp/ctl-{kind}.log")
            code = int(xc.wait_file(B, status, timeout=60).strip())
            elapsed = time.monotonic() - t0
            print(f"{kind}: B's reader {'faulted' if code == SIGBUS_STATUS else 'read on'}, "
                  f"IMPORT revoked: {during['revoked']}, after {elapsed:.1f} s")  # fmt: skip
            assert code in (SIGBUS_STATUS, 3), f"B's reader ended with status {code}"
            if kind == "state":
                assert code == SIGBUS_STATUS, "an entry that says offline did not revoke"
                assert during["revoked"], during
        finally:
            unimport_on_b(xc, imp["mem_id"])
        time.sleep(1.0)  # a few of A's beats: its entry is whole again
        back = import_on_b(xc, exp["handle"])
        assert back["errno"] == 0, f"A did not come back once the corruption stopped: {back}"
        unimport_on_b(xc, back["mem_id"])


SAVE_RECORDS = (
    "import ctlpoke\nc = ctlpoke.Ctl()\n"
    "lo, hi = c.record(0, 0), c.record(0, ctlpoke.PER_NODE)\n"
    "open('/tmp/ctl-records.bin', 'wb').write(c.save(lo, hi - lo))\n"
)
RESTORE_RECORDS = (
    "import ctlpoke\nc = ctlpoke.Ctl()\n"
    "c.restore(c.record(0, 0), open('/tmp/ctl-records.bin', 'rb').read())\n"
)


def test_every_slot_live_with_a_stuck_seq_keeps_b_bounded(xc: ClusterHarness) -> None:
    xc.py(A, SAVE_RECORDS)
    try:
        xc.py(
            A,
            "import ctlpoke\nc = ctlpoke.Ctl()\n"
            "for s in range(ctlpoke.PER_NODE):\n"
            "    off = c.record(0, s)\n"
            "    if c.u32(off + ctlpoke.R_STATE) != 1:\n"
            "        c.set32(off + ctlpoke.R_STATE, 1); c.set32(off, c.u32(off) | 1)\n",
        )
        doc = json.loads(
            xc.py(B, RAW_IMPORT.format(node=A, addr="base", length="2 << 20", token=1)).out
        )
        print(f"IMPORT against 1024 stuck records: {doc['ms']} ms")
        assert doc["errno"] == 0 and doc["revoked"], doc  # made, revoked: no live export
        assert doc["ms"] < 10_000, doc
    finally:
        xc.py(A, RESTORE_RECORDS)


FORGE_RECORD = (
    "import ctlpoke\nc = ctlpoke.Ctl()\n"
    "boot = c.u64(c.node(0) + ctlpoke.N_BOOT_ID)\n"
    "s = [s for s in range(1024) if c.u32(c.record(0, s) + 4) != 1][-1]\n"
    "o = c.record(0, s)\n"
    "c.set64(o + ctlpoke.R_BOOT, boot); c.set64(o + ctlpoke.R_PA, {pa})\n"
    "c.set64(o + ctlpoke.R_SIZE, {size}); c.set32(o + ctlpoke.R_TOKEN, {token})\n"
    "c.set32(o + ctlpoke.R_FLAGS, 0); c.set32(o + ctlpoke.R_STATE, 1)\n"
)


def test_a_record_claiming_more_than_the_window_grants_nothing_outside_it(
    xc: ClusterHarness,
) -> None:
    """A forged live record of A, one at a time (IMPORT does not check the token, so any live
    record covering a range binds an import to it): one claiming [0, 2^63) still lets no
    import past the window's end; one that wraps past 2^64 covers nothing, so an import of the
    window's start is made revoked."""
    cases = [
        ((0, 1 << 63), "base + size - (2 << 20)", "4 << 20", 22),  # straddles the end: EINVAL
        (((1 << 64) - (2 << 20), 4 << 20), "base", "2 << 20", 0),  # covers nothing: revoked
    ]
    xc.py(A, SAVE_RECORDS)
    try:
        for (pa, size), addr, length, want in cases:
            xc.py(A, RESTORE_RECORDS)
            xc.py(A, FORGE_RECORD.format(pa=pa, size=size, token=0x12345))
            doc = json.loads(
                xc.py(B, RAW_IMPORT.format(node=A, addr=addr, length=length, token=0)).out
            )
            assert doc["errno"] == want, (addr, length, doc)
            assert want != 0 or doc["revoked"], (addr, length, doc)
    finally:
        xc.py(A, RESTORE_RECORDS)


RELOAD = (
    "import xnode\n"
    "xnode.reload_obmm()\n"
    "print(open('/sys/kernel/obmm_emu/enabled').read().strip())\n"
)


def test_a_header_of_another_layout_is_refused_at_load(xc: ClusterHarness) -> None:
    xc.py(A, "import ctlpoke\nopen('/tmp/ctl-header.bin', 'wb').write(ctlpoke.Ctl().save(0, 40))")
    try:
        xc.py(A, "import ctlpoke\nc = ctlpoke.Ctl(); c.set32(8, 99)")  # version 99
        assert xc.py(B, RELOAD).out.strip().splitlines()[-1] == "0", "B took a foreign layout"
        log = xc.run(B, "dmesg | tail -n 20").out
        assert "control region header" in log, log
        doc = xc.py_json(
            B,
            "import json, obmm\n"
            "try:\n    with obmm.Obmm() as d:\n        d.export(2 << 20)\n"
            "except obmm.ObmmError as e:\n    print(json.dumps(e.errno))\n",
        )
        assert doc == 95, doc  # EOPNOTSUPP: no fabric
        # the node already up is not affected: it never reads the header again
        with a_export(xc):
            pass
    finally:
        xc.py(
            A, "import ctlpoke\nctlpoke.Ctl().restore(0, open('/tmp/ctl-header.bin', 'rb').read())"
        )
        assert xc.py(B, RELOAD).out.strip().splitlines()[-1] == "1"
    # no magic at all: the loading node writes the header anew
    xc.py(A, "import ctlpoke\nctlpoke.Ctl().set64(0, 0)")
    assert xc.py(B, RELOAD).out.strip().splitlines()[-1] == "1"
    header = xc.py_json(
        A, "import ctlpoke, json\nprint(json.dumps(ctlpoke.Ctl().save(0, 40).hex()))"
    )
    assert bytes.fromhex(header)[:8] == b"OBMMEMU1"
