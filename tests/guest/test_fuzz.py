"""A short run of the structured fuzzer (obmm.fuzz) with fixed seeds, in the suite's node.

The long runs are ``make fuzz``; these keep a fixed budget in ``make test`` (a few seconds).
A failure shows the fuzzer's own report: the failing check, the replay command, the trace.
"""

from __future__ import annotations

import pytest

from obmm.fuzz import race
from obmm.fuzz.engine import Engine
from obmm.fuzz.ops import Op, generate

pytestmark = pytest.mark.emulator_only

SINGLE_SEED, SINGLE_OPS = 15, 150
RACE_SEED, RACE_ROUNDS = 15, 20
# Reproducers the fuzzer shrank, as their operations (kind and words: a new kind of operation
# changes what a seed draws, not what these do); each failed before its fix.
REPRODUCERS: dict[str, list[Op]] = {
    # the model let a share import overlap a declared preimport range (the driver: EEXIST);
    # --seed 2 --only 1699,1810 before the handoff vocabulary
    "import-over-preimport": [
        Op(1699, "preimport", (7172256521078132800, 5526685202851226510, 10970627503640088530,
                               5270386140926908871, 15611920840635030375, 4427344080670940171)),
        Op(1810, "import", (424215162513802867, 3620884663870494593, 3514106467793005584,
                            1279829155781587889, 12014957206903137041, 15423491363459870068)),
    ],
    # ptrace access to an untouched cacheable page mapping got EIO (kmod .access);
    # --seed 5 --only 348,361,399,413
    "ptrace-untouched-page": [
        Op(348, "export", (2625854052022349361, 11055785787304264774, 12850073176498739455,
                           3930586958832225951, 16640055097081973664, 2482188335690087196)),
        Op(361, "open", (5447142681917937972, 16400017052844160128, 15738701032352448851,
                         12999337495693539522, 12148263330363185945, 6820387692837695611)),
        Op(399, "mmap", (5336582545806399893, 16269137670716015144, 14840733825114448767,
                         2143002124027516766, 3192415073694514611, 18423071347410060017)),
        Op(413, "peek", (10982398341818446865, 6388719814447501275, 18341927189544015299,
                         10231875502269140826, 6226782335183402887, 3251895815441929166)),
    ],
    # a /proc/self/mem read of a PROT_WRITE-only PMD mapping got EIO (kmod .access);
    # --seed 1 --only 13314,13316,13324,13327
    "ptrace-read-write-only-pmd": [
        Op(13314, "export", (8231880885888152057, 15940200747645766830, 14157915133829930647,
                             4060906830000551296, 14843981843466515378, 8842792859266917436)),
        Op(13316, "open", (2348491609183776957, 1339907170890862929, 11271094180803808437,
                           1470092546086432567, 17759180039257597517, 6984220450158862342)),
        Op(13324, "mmap", (445222158835387135, 14460005674017106463, 2545975329172043981,
                           8853992192336958603, 205580471252729659, 7271499824597220839)),
        Op(13327, "peek", (11686375477505561574, 5552628653190328410, 8265636994503963618,
                           956865934166869250, 8274481199463018890, 14387877680876708322)),
    ],
}  # fmt: skip


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
    ops = REPRODUCERS[name]
    engine = Engine()
    try:
        failure = engine.run(ops)
    finally:
        engine.close()
    assert failure is None, f"{failure}\n" + "\n".join(engine.trace[-30:])
    assert engine.ops_run == len(ops)
