"""Host side of the fuzzer (obmm.fuzz): its runs are reproducible and its shrinker is minimal.

The fuzzer itself drives /dev/obmm inside a node (tests/guest/test_fuzz.py, make fuzz); what
must hold without a kernel is checked here: a seed names one list of operations on every
machine, ``--only`` replays a subset exactly, and ddmin finds the minimal failing subset.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from obmm.fuzz.__main__ import parse
from obmm.fuzz.ops import KINDS, Op, generate, select
from obmm.fuzz.shrink import ddmin


def test_a_seed_names_one_list() -> None:
    assert generate(7, 50) == generate(7, 50)
    assert generate(7, 50) != generate(8, 50)


def test_a_longer_run_extends_a_shorter_one() -> None:
    """--ops N+M starts with the N operations of --ops N: a failure at step k replays."""
    assert generate(3, 100)[:40] == generate(3, 40)


def test_every_kind_is_drawn_and_has_a_handler() -> None:
    from obmm.fuzz.engine import Engine

    drawn = {op.kind for op in generate(1, 5000)}
    assert drawn == set(KINDS)
    for kind in KINDS:
        assert callable(getattr(Engine, f"_op_{kind}"))


def test_the_golden_first_ops_of_seed_1() -> None:
    """Pinned: a change of the generator silently changes every recorded replay command."""
    first = [op.kind for op in generate(1, 6)]
    assert first == GOLDEN_SEED_1


# Changed once, on purpose, with the handoff vocabulary (tests/guest/test_fuzz.py keeps its
# reproducers as operations, not as seed and indexes).
GOLDEN_SEED_1 = ["unexport", "data", "close", "mmap", "close", "export"]


def test_select_replays_the_named_operations() -> None:
    ops = generate(5, 30)
    picked = select(ops, [3, 17, 29])
    assert [op.index for op in picked] == [3, 17, 29]
    assert picked[1] == ops[17]
    with pytest.raises(ValueError, match="beyond --ops"):
        select(ops, [30])


def test_ddmin_finds_the_two_operations_that_matter() -> None:
    ops = generate(9, 64)
    culprits = {ops[11].index, ops[50].index}

    def fails(candidate: Sequence[Op]) -> bool:
        return culprits <= {op.index for op in candidate}

    small, runs = ddmin(ops, fails)
    assert {op.index for op in small} == culprits
    assert runs < 200


def test_ddmin_keeps_order() -> None:
    ops = generate(2, 20)

    def fails(candidate: Sequence[Op]) -> bool:
        idx = [op.index for op in candidate]
        return 4 in idx and 9 in idx and idx.index(4) < idx.index(9)

    small, _ = ddmin(ops, fails)
    assert [op.index for op in small] == [4, 9]


def test_cli_defaults_and_modes() -> None:
    args = parse(["--seed", "4", "--ops", "10", "--mode", "concurrent"])
    assert (args.seed, args.ops, args.mode) == (4, 10, "concurrent")
    assert parse([]).mode == "single"


def test_suffix_first_finds_a_short_failing_tail() -> None:
    from obmm.fuzz.shrink import suffix_first

    ops = generate(4, 1000)
    needed = {ops[990].index, ops[999].index}

    def fails(candidate: Sequence[Op]) -> bool:
        return needed <= {op.index for op in candidate}

    tail, runs = suffix_first(ops, fails, budget_s=10)
    assert len(tail) == 32 and runs == 2


def test_a_call_under_fault_injection_may_fail_with_enomem_whatever_the_op() -> None:
    """On the debug kernel a shmdev open under failslab got ENOMEM, which the open handler's
    errno set did not list (seeds 5 and 6): every call made armed may fail its allocation."""
    import errno

    from obmm.fuzz.engine import Engine, Failure

    engine = Engine.__new__(Engine)  # the errno check only; no /dev/obmm on the host
    engine.trace, engine.log, engine.record = [], False, False
    armed = Op(0, "open", (5 << 32,) * 6)  # word 5: chance(5, 20) holds
    unarmed = Op(1, "open", (50 << 32,) * 6)
    engine.faults = object()  # type: ignore[assignment]
    engine.expect(armed, "open", errno.ENOMEM, {0})
    with pytest.raises(Failure):
        engine.expect(unarmed, "open", errno.ENOMEM, {0})
    engine.faults = None
    with pytest.raises(Failure):
        engine.expect(armed, "open", errno.ENOMEM, {0})


class _Clocked:
    """Engine.run's collaborators: each step takes one tick of a fake monotonic clock."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.stepped: list[int] = []
        self.checked: list[int | None] = []

    def step(self, op: Op) -> None:
        self.stepped.append(op.index)
        self.clock[0] += 1.0

    def check(self, op: Op | None) -> None:
        self.checked.append(None if op is None else op.index)

    def reset(self) -> None:
        pass


def test_no_operation_starts_past_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """--seconds: the operation running at the deadline is the last, checked, then the reset."""
    from obmm.fuzz import engine as engine_mod

    clock = [100.0]
    monkeypatch.setattr("obmm.fuzz.engine.time", SimpleNamespace(monotonic=lambda: clock[0]))
    ops = generate(5, 50)
    fake = _Clocked(clock)
    assert engine_mod.Engine.run(fake, ops, check_every=10, deadline=103.5) is None  # type: ignore[arg-type]
    assert fake.stepped == [op.index for op in ops[:4]]
    assert fake.checked == [ops[3].index, None]
    fake = _Clocked(clock)
    assert engine_mod.Engine.run(fake, ops[:3], deadline=None) is None  # type: ignore[arg-type]
    assert fake.stepped == [op.index for op in ops[:3]]


def test_seconds_is_an_option() -> None:
    assert parse(["--seconds", "90"]).seconds == 90.0
    assert parse([]).seconds == 0.0


def test_a_handoff_never_touches_an_address_the_mapping_does_not_let_it_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handoff touches the address first, as a program would; on a PROT_NONE mapping (or one
    an UPDATE_RANGE made NO_ACCESS) that touch is a SIGSEGV that killed the fuzzer (fuzz-diff,
    seed 1, once #27's ownership and #24's handoffs met)."""
    from obmm.fuzz import engine as engine_mod
    from obmm.fuzz.model import NO_ACCESS, File, Map, Model, Region

    touched: list[int] = []
    monkeypatch.setattr(engine_mod.target, "read_word", lambda addr: touched.append(addr))
    engine = engine_mod.Engine.__new__(engine_mod.Engine)
    engine.trace, engine.log, engine.record = [], False, False
    engine.model = Model()
    engine.model.regions[1] = Region(mem_id=1, kind="export", size=2 << 20, pa=1 << 32)
    f = File(fid=1, fd=-1, mem_id=1, read=True, write=True, sync=False)
    engine.model.maps.append(Map(addr=1 << 30, length=2 << 20, mem_id=1, file=f, offset=0,
                                 writable=True, granu=2 << 20, access=[NO_ACCESS]))  # fmt: skip
    engine._op_handoff(Op(0, "handoff", (0,) * 6))
    assert touched == []


def _engine_with_map(file_write: bool, pieces: int, granu: int = 4 << 10):  # type: ignore[no-untyped-def]
    from obmm.fuzz import engine as engine_mod
    from obmm.fuzz.model import File, Map, Model, Region

    engine = engine_mod.Engine.__new__(engine_mod.Engine)
    engine.trace, engine.log, engine.record, engine.faults = [], False, False, None
    engine.model = Model()
    engine.model.regions[1] = Region(mem_id=1, kind="export", size=pieces * granu, pa=1 << 32)
    f = File(fid=1, fd=-1, mem_id=1, read=True, write=file_write, sync=False)
    m = Map(addr=1 << 30, length=pieces * granu, mem_id=1, file=f, offset=0,
            writable=file_write, granu=granu, access=[0x8] * pieces)  # fmt: skip
    engine.model.maps.append(m)
    return engine_mod, engine, m


def test_a_read_only_fds_mapping_never_writes_whatever_its_state() -> None:
    """Issue 36: an UPDATE_RANGE to READWRITE does not make a MAP_SHARED mapping of a read-only
    fd writable (its VMA has no VM_SHARED); the fuzzer must not write there (SIGSEGV)."""
    _, _, m = _engine_with_map(file_write=False, pieces=2)
    assert m.can_read(0) and not m.can_write(0)
    _, _, rw = _engine_with_map(file_write=True, pieces=2)
    assert rw.can_write(0)


def test_munmap_splits_a_mapping_with_madvise_and_mremap_then_faults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The split vocabulary (issue 36): one munmap in three or so cuts whole granules inside the
    mapping with madvise instead, which splits its VMA (armed: EAGAIN allowed); a move of a
    split mapping is EFAULT (more than one VMA) or, as before, EOPNOTSUPP."""
    import contextlib
    import errno
    import mmap

    engine_mod, engine, m = _engine_with_map(file_write=True, pieces=4)
    calls: list[tuple[int, ...]] = []
    unmapped: list[tuple[int, ...]] = []

    def recorder(into: list[tuple[int, ...]]):  # type: ignore[no-untyped-def]
        def call(*args: int) -> int:
            into.append(args)
            return 0

        return call

    monkeypatch.setattr(engine_mod.target, "madvise", recorder(calls))
    monkeypatch.setattr(engine_mod.target, "munmap", recorder(unmapped))
    # word 4: chance(4, 30) holds; word 1: first granule 1; word 2: two granules; word 3: advice
    engine._op_munmap(Op(0, "munmap", (0, 1, 1, 0, 5 << 32, 50 << 32)))
    assert calls == [(m.addr + (4 << 10), 2 * (4 << 10), mmap.MADV_RANDOM)]
    assert unmapped == [] and m.split and m.length == 4 * (4 << 10)
    # the whole mapping is cut once at least
    calls.clear()
    engine._op_munmap(Op(1, "munmap", (0, 0, 3, 1, 5 << 32, 50 << 32)))
    assert calls == [(m.addr, 3 * (4 << 10), mmap.MADV_SEQUENTIAL)]
    # armed (word 5), the split's allocation may fail: madvise says EAGAIN
    engine.faults = SimpleNamespace(armed=contextlib.nullcontext)
    monkeypatch.setattr(engine_mod.target, "madvise", lambda *a: errno.EAGAIN)
    engine._op_munmap(Op(2, "munmap", (0, 1, 0, 0, 5 << 32, 5 << 32)))
    engine.faults = None
    # ... and its first cut may stay: the mapping counts as split (the debug-kernel campaign,
    # seed 2, op 24473: a later move was EFAULT)
    m.split = False
    engine.faults = SimpleNamespace(armed=contextlib.nullcontext)
    engine._op_munmap(Op(2, "munmap", (0, 1, 0, 0, 5 << 32, 5 << 32)))
    engine.faults = None
    assert m.split
    with pytest.raises(engine_mod.Failure):
        engine._op_munmap(Op(3, "munmap", (0, 1, 0, 0, 5 << 32, 50 << 32)))
    # an armed munmap of the tail (word 1: a cut; word 2: keep one granule) that fails ENOMEM
    # may have made its cut: split too (the campaign, seed 1, op 17899: a later move EFAULT)
    m.split = False
    monkeypatch.setattr(engine_mod.target, "munmap", lambda *a: errno.ENOMEM)
    engine.faults = SimpleNamespace(armed=contextlib.nullcontext)
    engine._op_munmap(Op(3, "munmap", (0, 0, 0, 50 << 32, 50 << 32, 5 << 32)))
    engine.faults = None
    assert m.split and m.length == 4 * (4 << 10)
    m.split = False  # a failed munmap of all of it cuts nothing
    engine.faults = SimpleNamespace(armed=contextlib.nullcontext)
    engine._op_munmap(Op(3, "munmap", (0, 50 << 32, 0, 50 << 32, 50 << 32, 5 << 32)))
    engine.faults = None
    assert not m.split
    m.split = True
    monkeypatch.setattr(engine_mod.target, "mmap", lambda *a: (1 << 31, 0))
    monkeypatch.setattr(engine_mod.target, "mremap", lambda *a: (0, errno.EFAULT))
    engine._op_mremap(Op(4, "mremap", (0, 2, 0, 0, 0, 0)))  # "move"
    m.split = False
    with pytest.raises(engine_mod.Failure):
        engine._op_mremap(Op(5, "mremap", (0, 2, 0, 0, 0, 0)))


def test_a_ptrace_poke_of_a_page_made_read_only_is_eio(monkeypatch: pytest.MonkeyPatch) -> None:
    """PTRACE_POKEDATA goes through the VMA's .access, which writes only where the page is
    writable: after an UPDATE_RANGE to READONLY of a writable mapping it is EIO (the
    debug-kernel campaign, seed 1, op 25765: the model allowed only success)."""
    from obmm.fuzz.model import READWRITE

    engine_mod, engine, m = _engine_with_map(file_write=True, pieces=2)
    engine.handoffs, engine.fabric = {}, SimpleNamespace(own_base=0)
    m.access = [0x0, READWRITE]  # page 0 READONLY (0x0), page 1 READWRITE
    monkeypatch.setattr(engine_mod.handoff, "PATHS", {})  # the only handoff: ptrace_poke
    monkeypatch.setattr(engine_mod.target, "read_word", lambda addr: b"\0" * 8)
    monkeypatch.setattr(engine, "_expected_word", lambda m, off: None)
    pokes: list[int] = []

    def poke(addr: int, poke: bytes) -> tuple[bytes, int]:
        pokes.append(addr)
        return b"", errno.EIO if addr < m.addr + (4 << 10) else 0

    monkeypatch.setattr(engine_mod.handoff, "ptrace_peek", poke)
    engine._op_handoff(Op(0, "handoff", (0, 0, 0, 0)))  # offset 0: EIO
    engine._op_handoff(Op(1, "handoff", (0, 0, 4 << 10, 0)))  # offset 4K: written
    assert pokes == [m.addr, m.addr + (4 << 10)]
    monkeypatch.setattr(engine_mod.handoff, "ptrace_peek", lambda addr, poke: (b"", 0))
    with pytest.raises(engine_mod.Failure):  # a write to the read-only page is a failure
        engine._op_handoff(Op(2, "handoff", (0, 0, 0, 0)))


def test_the_rmmod_bound_scales_with_the_timeout_scale() -> None:
    """A debug kernel on a loaded host unloads slower (5.5 s seen against 5 s): the bound the
    reload op holds rmmod to is UNLOAD_S times $OBMM_TESTBED_TIMEOUT_SCALE, which make fuzz
    passes to the guests."""
    from pathlib import Path

    from obmm.fuzz.target import Module

    assert Module.unload_bound({}) == Module.UNLOAD_S
    assert Module.unload_bound({"OBMM_TESTBED_TIMEOUT_SCALE": "3"}) == 3 * Module.UNLOAD_S
    makefile = (Path(__file__).resolve().parents[3] / "Makefile").read_text()
    fuzz = next(ln for ln in makefile.splitlines() if ln.startswith("FUZZ = "))
    assert "OBMM_TESTBED_TIMEOUT_SCALE=$(OBMM_TESTBED_TIMEOUT_SCALE)" in fuzz


def test_the_fault_allow_list_takes_only_the_vmalloc_warn() -> None:
    """With failures injected the fuzzer allows the kernel's WARN in __alloc_vmap_area (its
    reaction to a failed GFP_NOWAIT allocation under an ioremap), and nothing else."""
    from obmm.fuzz import faults
    from obmm.tools import logscan

    warn = (
        "------------[ cut here ]------------\n"
        "WARNING: CPU: 1 PID: 4242 at mm/vmalloc.c:1547 __alloc_vmap_area+0x2d5/0x3a0\n"
        "Modules linked in: obmm(OE)\n"
        "---[ end trace 0000000000000000 ]---\n"
    )
    ours = warn.replace("mm/vmalloc.c:1547 __alloc_vmap_area", "obmm_emu/shmdev.c:99 obmm_vm_fault")
    allow = logscan.DEFAULT_ALLOW + faults.ALLOW
    assert logscan.scan(warn)
    assert not logscan.scan(warn, allow=allow)
    assert logscan.scan(ours, allow=allow)


def test_record_mode_makes_a_valid_update_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """fuzz-diff: a successful UPDATE_RANGE is compared, not left out; obmm_emu applies its
    effect to the page tables as the real driver does (FIDELITY: UPDATE_RANGE effect)."""
    import obmm

    _, engine, m = _engine_with_map(file_write=True, pieces=2)
    engine.model.regions[1].ownership = True
    engine.model.files.append(m.file)
    m.file.fd, m.access = 3, [0, 0]
    calls: list[tuple[int, int, int, int]] = []
    monkeypatch.setattr(
        obmm.ShmDev, "update_range", lambda _shm, *args: calls.append(args), raising=False
    )
    engine.record, engine._outcome = True, {"op": 0, "kind": "update_range", "errnos": []}
    # every word picks the first choice (a multiple of each choice list's length) and passes
    # no chance (50 of 100): the mapping's first granule, state 0x9 (READWRITE), cache ops 4
    word = 252 * ((50 << 32) // 252 + 1)
    engine._op_update_range(Op(0, "update_range", (word,) * 6))
    assert calls == [(m.addr, m.addr + (4 << 10), 0x9, 4)]
    assert "skipped" not in engine._outcome and engine._outcome["errnos"] == ["ok"]
    assert m.access == [0x8, 0]


class _FakeDev:
    """A /dev/obmm for the race scenarios of the borrow vocabulary: EXPORT, a block-aligned
    PA, borrows that answer `borrow_errno`, UNEXPORT and UNIMPORT that succeed."""

    def __init__(self, borrow_errno: int) -> None:
        self.borrow_errno = borrow_errno
        self.calls: list[str] = []

    def export(self, length: int) -> SimpleNamespace:
        self.calls.append(f"export {length:#x}")
        return SimpleNamespace(mem_id=len(self.calls), length=length, tokenid=1)

    def query_pa_by_memid(self, mem_id: int) -> int:
        return 128 << 20

    def import_(self, addr: int, length: int, **kw: object) -> SimpleNamespace:
        self.calls.append(f"borrow {addr:#x}")
        if self.borrow_errno:
            raise OSError(self.borrow_errno, "refused")
        return SimpleNamespace(mem_id=99, numa_id=1)

    def unexport(self, mem_id: int) -> None:
        self.calls.append(f"unexport {mem_id}")

    def unimport(self, mem_id: int) -> None:
        self.calls.append(f"unimport {mem_id}")


def _race_round(monkeypatch: pytest.MonkeyPatch, dev: _FakeDev, seed: int, quarantined: int):  # type: ignore[no-untyped-def]
    import random

    from obmm.fuzz import race

    monkeypatch.setattr(race.target, "quarantined", lambda: quarantined)
    monkeypatch.setattr(race.target, "pool_total", lambda: 256 << 20)
    monkeypatch.setattr(race.target, "pool_used", lambda: 0)
    monkeypatch.setattr(race, "REUSE_S", 0.0)
    monkeypatch.setattr(race.time, "sleep", lambda s: None)
    engine = SimpleNamespace(dev=dev, fabric=SimpleNamespace(own_base=0, cna=1))
    return race, race.Round(0, "borrow", random.Random(seed), engine)  # type: ignore[arg-type]


def test_the_borrow_vocabulary_is_in_the_concurrent_mode() -> None:
    """Issue 36: borrows of mapped exports and a pipe holding a page of borrowed memory."""
    from obmm.fuzz import race

    assert {"borrow_of_mapped_export", "pinned_borrow_vs_reuse"} <= set(race.SCENARIOS)


def test_a_borrow_of_a_mapped_export_must_be_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 4's property: while the export is mapped (page or PMD) the borrow is EACCES;
    never mapped, or unmapped again, it is made.  A driver that borrows mapped memory is
    reported, and so is one that refuses memory nobody maps."""
    import errno

    from obmm.fuzz.engine import Failure

    monkeypatch.setattr("obmm.ShmDev", _FakeShm)
    for borrow_errno in (0, errno.EACCES):
        outcomes = set()
        for seed in range(40):
            race, rd = _race_round(monkeypatch, _FakeDev(borrow_errno), seed, 0)
            how = random_choice(seed)
            try:
                race.borrow_of_mapped_export(rd)
                outcomes.add((how, "ok"))
            except Failure:
                outcomes.add((how, "failure"))
        if borrow_errno:  # the fixed driver
            assert outcomes == {("never", "failure"), ("unmapped", "failure"), ("page", "ok"),
                                ("pmd", "ok"), ("racing", "ok")}  # fmt: skip
        else:  # finding 4 unfixed
            assert outcomes == {("never", "ok"), ("unmapped", "ok"), ("page", "failure"),
                                ("pmd", "failure"), ("racing", "ok")}  # fmt: skip


def random_choice(seed: int) -> str:
    import random

    rng = random.Random(seed)
    return rng.choice(("never", "page", "pmd", "racing", "unmapped"))


class _FakeShm:
    def __init__(self, mem_id: int) -> None:
        pass

    def __enter__(self) -> _FakeShm:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def mmap(self, length: int, *, pmd: bool = False) -> _FakeShm:
        return self

    def read(self, offset: int, size: int) -> bytes:
        return b"\0" * size


def test_memory_unexported_beside_a_stuck_borrow_must_come_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finding 5's property: with a borrow stuck on a pinned page, more than its block still
    quarantined after the later unexports is reported; only its block is not."""
    import subprocess

    from obmm.fuzz.engine import Failure

    class _Pinner:
        def __init__(self, *a: object, **kw: object) -> None:
            self.stdout = SimpleNamespace(readline=lambda: "pinned\n")
            self.stdin = SimpleNamespace(close=lambda: None)

        def wait(self, timeout: float) -> int:
            return 0

    monkeypatch.setattr(subprocess, "Popen", _Pinner)
    # _block_export first finds the quarantine empty (two reads), then the borrow's block stays
    for held, fails in ((128 << 20, False), ((128 << 20) + (2 << 20), True)):
        race, rd = _race_round(monkeypatch, _FakeDev(0), 1, 0)
        values = iter([0, 0] + [held] * 1000)
        monkeypatch.setattr(race.target, "quarantined", lambda v=values: next(v))
        if fails:
            with pytest.raises(Failure, match="quarantined"):
                race.pinned_borrow_vs_reuse(rd)
        else:
            race.pinned_borrow_vs_reuse(rd)
        assert rd.engine.dev.calls[-1] == "unimport 99"


class _BusyDev(_FakeDev):
    """EXPORT ends `errnos` in turn (0: made), as a driver whose quarantine a peer has not
    acknowledged ends it EBUSY."""

    def __init__(self, *errnos: int) -> None:
        super().__init__(0)
        self.errnos = list(errnos)

    def export(self, length: int) -> SimpleNamespace:
        err = self.errnos.pop(0) if self.errnos else 0
        if err:
            self.calls.append(f"refused {length:#x}")
            raise OSError(err, os.strerror(err))
        return super().export(length)


def test_a_setup_export_waits_out_a_quarantine_and_skips_the_round_if_it_stays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The campaign's race rounds ended in a traceback: a round's setup EXPORT met memory the
    last round unexported, not yet acknowledged by a peer (EBUSY).  It retries while memory is
    quarantined, the round is skipped if it stays so, and an EBUSY with nothing quarantined is
    still the error it is."""
    from obmm.fuzz import race

    race_mod, rd = _race_round(monkeypatch, _BusyDev(errno.EBUSY, errno.EBUSY), 1, 2 << 20)
    monkeypatch.setattr(race_mod, "wait_unquarantined", lambda *a, **kw: True)
    assert rd.export(2 << 20).length == 2 << 20
    assert rd.dev.calls == ["refused 0x200000", "refused 0x200000", "export 0x200000"]

    monkeypatch.setattr(race_mod, "QUARANTINE_S", 0.0)
    _, rd = _race_round(monkeypatch, _BusyDev(*[errno.EBUSY] * 100), 1, 2 << 20)
    with pytest.raises(race.Skip, match="EBUSY with 0x200000 bytes still quarantined"):
        rd.export(2 << 20)

    _, rd = _race_round(monkeypatch, _BusyDev(errno.EBUSY), 1, 0)
    with pytest.raises(OSError) as info:
        rd.export(2 << 20)
    assert info.value.errno == errno.EBUSY


@pytest.mark.parametrize("raised", ["skip", "einval"])
def test_a_round_that_cannot_start_is_skipped_and_an_unexpected_errno_is_a_failure(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    raised: str,
) -> None:
    """A skipped round is counted as not run and the run goes on; an errno from a call the
    scenario does not race is reported as a fuzz failure with its replay line, not a traceback."""
    import json

    from obmm.fuzz import race

    checked: list[int] = []
    engine = SimpleNamespace(dev=_FakeDev(0), reload_ok=False, close=lambda: None,
                             check=lambda op: checked.append(op.index))  # fmt: skip

    def scenario(rd: race.Round) -> None:
        if raised == "skip":
            raise race.Skip("EXPORT 0x200000: EBUSY")
        raise OSError(errno.EINVAL, "Invalid argument")

    hugepages = tmp_path / "nr_hugepages"
    hugepages.write_text("0")
    monkeypatch.setattr(race, "Engine", lambda **kw: engine)
    monkeypatch.setattr(race.target, "NR_HUGEPAGES", hugepages)
    monkeypatch.setattr(race.target, "sysfs_ids", lambda: set())
    monkeypatch.setattr(race, "SCENARIOS", {"setup": scenario})
    status = race.main(5, 3)
    out = capsys.readouterr().out
    result = json.loads(out.split("fuzz-result ", 1)[1])
    if raised == "skip":
        assert status == 0 and checked == [0, 1, 2]
        assert result["rounds"] == 3 and result["rounds_run"] == {"setup": 0}
        assert result["rounds_skipped"] == {"setup": 3}
        assert "fuzz: round 0 (setup) not run: EXPORT 0x200000: EBUSY" in out
    else:
        assert status == 1 and checked == [] and result["failed"]
        assert result["rounds_skipped"] == {}
        assert "FUZZ FAILURE" in out and "unexpected [Errno 22] Invalid argument" in out
        assert "replay: python3 -m obmm.fuzz --mode concurrent --seed 5 --ops 1" in out


class _NoIoctl:
    """A /dev/obmm the test holds every call to: the call's name, then ENOENT."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def ioctl(self, name: str, _cmd: object) -> None:
        import errno

        self.calls.append(name)
        raise OSError(errno.ENOENT, name)


def _recording_engine():  # type: ignore[no-untyped-def]
    from obmm.fuzz import engine as engine_mod
    from obmm.fuzz.model import Model
    from obmm.fuzz.target import Fabric

    engine = engine_mod.Engine.__new__(engine_mod.Engine)
    engine.trace, engine.log, engine.record, engine.faults = [], False, True, None
    engine.model = Model()
    engine.fabric = Fabric(0, 1, {0: (1 << 32, 1 << 30)}, 3 << 28, 1 << 28, 2 << 20)
    engine.dev = _NoIoctl()
    engine.peers, engine.skip_exports = [], set()
    return engine


def test_record_mode_leaves_out_a_declaration_whose_bitmap_the_real_driver_warns_on() -> None:
    """fuzz-diff op 1457: the real driver's bitmap_zalloc() of a huge DECLARE_PREIMPORT trips
    the page allocator's WARN (no __GFP_NOWARN); left out on both, not called."""
    engine = _recording_engine()
    engine._outcome = {"op": 0, "kind": "declare_big", "errnos": []}
    engine._op_declare_big(Op(0, "declare_big", (0,) * 6))  # 1 << 57 at the window's base
    assert "KMALLOC_MAX_SIZE" in str(engine._outcome["skipped"]) and engine.dev.calls == []
    engine._outcome = {"op": 1, "kind": "declare_big", "errnos": []}
    engine._op_declare_big(Op(1, "declare_big", (5,) * 6))  # 1 << 45: a bitmap kmalloc gives
    assert "skipped" not in engine._outcome
    assert engine.dev.calls == ["OBMM_CMD_DECLARE_PREIMPORT"]


def test_record_mode_keeps_an_export_under_a_numa_import() -> None:
    """fuzz-diff op 194: a NUMA_REMOTE import has no dep, yet keeps its PA range; an UNEXPORT
    under it is left out too, so no later export lands under a live import on one driver only."""
    from obmm.fuzz.model import Region

    engine = _recording_engine()
    base = engine.fabric.own_base
    engine.model.regions[1] = Region(mem_id=1, kind="export", size=4 << 20, pa=3 << 28)
    engine.model.regions[2] = Region(
        mem_id=2, kind="import", size=4 << 20, pa=base + (3 << 28), numa=True, allow_mmap=False
    )
    engine._outcome = {"op": 0, "kind": "unexport", "errnos": []}
    # passes no chance (99 of 100): export 1, the only one, with flags 0
    engine._op_unexport(Op(0, "unexport", (99 << 32,) * 6))
    assert engine._outcome.get("skipped") == "UNEXPORT under an import: revokes"
    assert engine.dev.calls == []


def test_record_mode_unexports_and_leaves_out_an_export_not_in_one_physical_run() -> None:
    """An export whose granules the pool did not place in one ascending run (the real driver's
    pool can): unexported again, its outcome marked scattered; one run kept; an operation the
    other driver's run found scattered is left out without a call."""
    from obmm.fuzz.engine import SCATTERED

    engine = _recording_engine()
    g = engine.fabric.granu
    placed = {7: [0, 2 * g], 8: [0, g]}  # mem_id -> the PA of each granule

    class Dev(_NoIoctl):
        def ioctl(self, name: str, cmd: object) -> None:
            self.calls.append(name)
            if name == "OBMM_CMD_EXPORT":
                cmd.mem_id = 7 if len(self.calls) == 1 else 8  # type: ignore[attr-defined]

        def query_pa_by_memid(self, mem_id: int, offset: int = 0) -> int:
            return (3 << 28) + placed[mem_id][offset // g]

    engine.dev = Dev()
    engine.pool_total = 1 << 28
    op = Op(0, "export", (99 << 32 | 2,) * 6)  # 2 granules, flags 1, no chance taken
    engine._outcome = {"op": 0, "kind": "export", "errnos": []}
    engine._op_export(op)
    assert engine._outcome == {"op": 0, "kind": "export", "errnos": [], "skipped": SCATTERED,
                               "scattered": True}  # fmt: skip
    assert engine.dev.calls == ["OBMM_CMD_EXPORT", "OBMM_CMD_UNEXPORT"] and not engine.model.regions
    engine._outcome = {"op": 0, "kind": "export", "errnos": []}
    engine._op_export(op)
    assert engine._outcome["mem_id"] == 8 and 8 in engine.model.regions
    engine.skip_exports = {3}
    engine._outcome = {"op": 3, "kind": "export", "errnos": []}
    engine._op_export(Op(3, "export", op.words))
    assert engine._outcome["skipped"] == SCATTERED and len(engine.dev.calls) == 3


def test_record_mode_fast_export_waits_for_the_pool_and_says_when_it_never_settles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fuzz-diff seed 1, op 279: a FAST EXPORT got ENOMEM on the real driver, whose pool had not
    refilled and cleared in the 5 s the fuzzer waited on a loaded host, and the difference was
    taken for the driver's.  It waits SETTLE_S now, and a pool that never settles is a failure
    that says so, with no call made."""
    from obmm.fuzz import engine as engine_mod
    from obmm.fuzz import target

    waited: list[float] = []
    settles = [False]
    monkeypatch.setattr(
        target, "settle_pool", lambda want, timeout: waited.append(timeout) or settles[0]
    )
    engine = _recording_engine()
    engine.pool_total = 1 << 28
    op = Op(0, "export", (99 << 32 | 3 << 16 | 1,) * 6)  # 1 granule, FAST|ALLOW_MMAP
    engine._outcome = {"op": 0, "kind": "export", "errnos": []}
    with pytest.raises(engine_mod.Failure, match="not whole and cleared within 60 s"):
        engine._op_export(op)
    assert waited == [engine_mod.SETTLE_S] and engine.dev.calls == []
    settles[0] = True
    engine._op_export(op)
    assert engine.dev.calls == ["OBMM_CMD_EXPORT"]


def test_record_mode_leaves_out_an_import_past_its_export() -> None:
    """fuzz-diff op 1180 (seed 1): an import at an export's address but 1 GiB long overlaps
    another import on one driver and nothing on the other (where the pools put the exports):
    left out on both, not called."""
    from obmm.fuzz.model import Region

    engine = _recording_engine()
    engine.model.regions[1] = Region(mem_id=1, kind="export", size=2 << 20, pa=3 << 28)
    engine._outcome = {"op": 0, "kind": "import", "errnos": []}
    # no chance taken (99 of 100) but word 3's chance(3, 20): a length from the list, its
    # choice 4 of 7 (the window's size), at the export's address
    length = 15 << 32
    length += (4 - length % 7) % 7
    engine._op_import(Op(0, "import", (99 << 32,) * 3 + (length,) + (99 << 32,) * 2))
    assert engine._outcome.get("skipped") == "IMPORT past its export: overlap depends on placement"
    assert engine.dev.calls == []


def _sequence_engine(monkeypatch: pytest.MonkeyPatch, mmap_errs: list[int]):  # type: ignore[no-untyped-def]
    """An engine whose one region (two 4 KiB granules) nothing maps, and the calls its
    UPDATE_RANGE sequences make, recorded (mmap_errs: the errno of each mmap, in turn)."""
    engine_mod, engine, _ = _engine_with_map(file_write=True, pieces=2)
    engine.model.maps.clear()
    calls: list[tuple[object, ...]] = []

    def fake_open(path: str, flags: int) -> int:
        calls.append(("open", path, flags & 3))
        return 100 + sum(1 for c in calls if c[0] == "open")

    def fake_mmap(
        addr: int, length: int, prot: int, flags: int, fd: int, raw: int
    ) -> tuple[int, int]:
        calls.append(("mmap", length, prot, fd, raw))
        return (1 << 30, mmap_errs.pop(0) if mmap_errs else 0)

    def fake_update(shm: object, start: int, end: int, state: int, cache: int) -> None:
        calls.append(("update", shm.fd, start - (1 << 30), end - (1 << 30), state))  # type: ignore[attr-defined]

    monkeypatch.setattr(engine_mod.os, "open", fake_open)
    monkeypatch.setattr(engine_mod.os, "close", lambda fd: calls.append(("close", fd)))
    monkeypatch.setattr(engine_mod.target, "mmap", fake_mmap)

    def fake_munmap(addr: int, length: int) -> int:
        calls.append(("munmap", length))
        return 0

    def fake_madvise(addr: int, length: int, advice: int) -> int:
        calls.append(("madvise", addr - (1 << 30), length, advice))
        return 0

    def fake_read(addr: int) -> bytes:
        calls.append(("read", addr - (1 << 30)))
        return bytes(8)

    monkeypatch.setattr(engine_mod.target, "munmap", fake_munmap)
    monkeypatch.setattr(engine_mod.target, "madvise", fake_madvise)
    monkeypatch.setattr(engine_mod.target, "read_word", fake_read)
    monkeypatch.setattr(engine_mod.obmm.ShmDev, "update_range", fake_update)
    return engine_mod, engine, calls


# word 2: chance(2, 20) takes the sequence; word 3: the region, page granule; word 5: which
RO_FD = Op(0, "update_range", (0, 0, 5 << 32, 50 << 32, 0, 0))
SPLIT = Op(1, "update_range", (0, 0, 5 << 32, 50 << 32, 0, 1))


def test_update_range_maps_a_read_only_fd_and_makes_it_read_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 36, finding 1, whole in one operation: PROT_READ MAP_SHARED from a read-only fd,
    UPDATE_RANGE READWRITE through a read-write fd of the region, a touch of each granule."""
    import mmap

    _, engine, calls = _sequence_engine(monkeypatch, [])
    engine._op_update_range(RO_FD)
    path = "/dev/obmm_shmdev1"
    assert calls == [
        ("open", path, os.O_RDWR), ("open", path, os.O_RDONLY),
        ("mmap", 8 << 10, mmap.PROT_READ, 102, 0),
        ("update", 101, 0, 8 << 10, 0x9),
        ("read", 0), ("read", 4 << 10),
        ("munmap", 8 << 10), ("close", 101), ("close", 102),
    ]  # fmt: skip
    r = engine.model.regions[1]
    assert (r.granu, r.mode, r.ownership) == (4 << 10, "cc", True)


def test_update_range_splits_between_updates_then_maps_writable_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 36, finding 6, whole in one operation: a writable mapping made READONLY, split by
    a madvise, made READWRITE, unmapped; then a writable mmap again, which must succeed: the
    unfixed driver's EPERM (its writable-mapping count at -1) is a failure."""
    import mmap

    engine_mod, engine, calls = _sequence_engine(monkeypatch, [])
    engine._op_update_range(SPLIT)
    rw = mmap.PROT_READ | mmap.PROT_WRITE
    assert calls == [
        ("open", "/dev/obmm_shmdev1", os.O_RDWR),
        ("mmap", 8 << 10, rw, 101, 0),
        ("update", 101, 0, 8 << 10, 0x1),
        ("madvise", 4 << 10, 4 << 10, mmap.MADV_RANDOM),
        ("update", 101, 0, 8 << 10, 0x9),
        ("munmap", 8 << 10),
        ("mmap", 8 << 10, rw, 101, 0),
        ("munmap", 8 << 10), ("close", 101),
    ]  # fmt: skip
    _, engine, calls = _sequence_engine(monkeypatch, [0, errno.EPERM])
    with pytest.raises(engine_mod.Failure, match="writable mmap again"):
        engine._op_update_range(SPLIT)
    assert calls[-1] == ("close", 101)  # nothing left open


def test_update_range_sequences_need_a_region_nothing_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every region mapped already, the operation is an ordinary UPDATE_RANGE."""
    _, engine, calls = _sequence_engine(monkeypatch, [])
    engine.model.maps.append(SimpleNamespace(mem_id=1))
    assert not engine._update_sequence(RO_FD)
    assert calls == []


def test_record_mode_leaves_out_the_read_only_fd_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    """fuzz-diff: finding 1's sequence is left out on both drivers: on the real driver each
    one takes its pages off the process's data_vm until it underflows and the fuzzer's own
    allocations fail (MemoryError at op 15179 of seed 1, twice).  The split sequence runs."""
    engine_mod, engine, calls = _sequence_engine(monkeypatch, [])
    engine.record, engine._outcome = True, {"op": 0, "kind": "update_range", "errnos": []}
    assert engine._update_sequence(RO_FD)
    assert calls == [] and engine._outcome["skipped"] == engine_mod.RO_FD_WRITABLE
    engine._outcome = {"op": 1, "kind": "update_range", "errnos": []}
    assert engine._update_sequence(SPLIT)
    assert "skipped" not in engine._outcome and any(c[0] == "madvise" for c in calls)


def test_record_mode_keeps_what_ran_when_the_run_raises(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """fuzz-diff reads the record file after the run: an exception part way keeps the
    outcomes before it (the 20,000-op run lost 16 minutes of them to one)."""
    import json

    from obmm.fuzz import __main__ as fuzz_main

    class Raising:
        def __init__(self, **kw: object) -> None:
            self.outcomes: list[dict[str, object]] = []
            self.closed = False

        def run(self, ops: object) -> None:
            self.outcomes.append({"op": 0, "kind": "export", "errnos": ["ok"]})
            raise KeyError(7)

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(fuzz_main, "Engine", Raising)
    out = tmp_path / "records.jsonl"
    with pytest.raises(KeyError):
        fuzz_main.main(["--seed", "1", "--ops", "3", "--record", str(out)])
    assert [json.loads(ln) for ln in out.read_text().splitlines()] == [
        {"op": 0, "kind": "export", "errnos": ["ok"]}
    ]
