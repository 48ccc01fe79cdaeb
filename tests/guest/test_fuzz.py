"""A short run of the structured fuzzer (obmm.fuzz) with fixed seeds, in the suite's node.

The long runs are ``make fuzz``; these keep a fixed budget in ``make test`` (a few seconds).
A failure shows the fuzzer's own report: the failing check, the replay command, the trace.
"""

from __future__ import annotations

import pytest

from obmm.fuzz import race
from obmm.fuzz.engine import Engine
from obmm.fuzz.ops import generate, select

pytestmark = pytest.mark.emulator_only

SINGLE_SEED, SINGLE_OPS = 15, 150
RACE_SEED, RACE_ROUNDS = 15, 20
# Reproducers the fuzzer shrank (seed, operation indexes), replayed; each failed before its fix.
REPRODUCERS = {
    # the model let a share import overlap a declared preimport range (the driver: EEXIST)
    "import-over-preimport": (2, (1699, 1810)),
    # ptrace access to an untouched cacheable page mapping got EIO (kmod .access)
    "ptrace-untouched-page": (5, (348, 361, 399, 413)),
    # a /proc/self/mem read of a PROT_WRITE-only PMD mapping got EIO (kmod .access)
    "ptrace-read-write-only-pmd": (1, (13314, 13316, 13324, 13327)),
}


def test_fuzz_single_fixed_seed(fabric: object) -> None:
    engine = Engine()
    try:
        failure = engine.run(generate(SINGLE_SEED, SINGLE_OPS))
    finally:
        engine.close()
    assert failure is None, (
        f"{failure}\nreplay: python3 -m obmm.fuzz --seed {SINGLE_SEED} --ops {SINGLE_OPS}\n"
        + "\n".join(engine.trace[-30:])
    )
    assert engine.ops_run == SINGLE_OPS


def test_fuzz_concurrent_fixed_seed(fabric: object, capsys: pytest.CaptureFixture[str]) -> None:
    status = race.main(RACE_SEED, RACE_ROUNDS)
    out = capsys.readouterr().out
    assert status == 0, out


@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_fuzz_reproducer_passes(fabric: object, name: str) -> None:
    seed, only = REPRODUCERS[name]
    engine = Engine()
    try:
        failure = engine.run(select(generate(seed, max(only) + 1), only))
    finally:
        engine.close()
    assert failure is None, f"{failure}\n" + "\n".join(engine.trace[-30:])
    assert engine.ops_run == len(only)
