"""The fuzzer's operations: drawn from the seed before the run, resolved when they run."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: Random words each operation carries (what they mean is up to its kind).
NWORDS = 6

#: kind -> weight.  Creation is weighted so that a run keeps a few regions alive.
KINDS: dict[str, int] = {
    "export": 10,
    "export_pid": 4,
    "unexport": 6,
    "import": 10,
    "unimport": 5,
    "addr_query": 4,
    "preimport": 2,
    "bad_ioctl": 2,
    "open": 10,
    "close": 6,
    "mmap": 12,
    "munmap": 6,
    "mprotect": 2,
    "mremap": 3,
    "update_range": 6,
    "data": 10,
    "peek": 3,
    "fork": 2,
    "sysfs": 3,
    "reload": 2,
    "drain": 1,
    # a mapped address handed to other kernel paths (obmm.fuzz.handoff)
    "handoff": 12,
    # DECLARE_PREIMPORT of lengths up to 2^63 (the block bitmap's size)
    "declare_big": 1,
}


@dataclass(frozen=True)
class Op:
    index: int
    kind: str
    words: tuple[int, ...]

    def word(self, i: int) -> int:
        return self.words[i % len(self.words)]

    def pick(self, i: int, choices: Sequence[T]) -> T:
        return choices[self.word(i) % len(choices)]

    def chance(self, i: int, percent: int) -> bool:
        return (self.word(i) >> 32) % 100 < percent


def generate(seed: int, count: int) -> list[Op]:
    """The run ``--seed seed --ops count``: the same list on every machine and every Python."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    weights = [KINDS[k] for k in kinds]
    ops = []
    for i in range(count):
        kind = rng.choices(kinds, weights)[0]
        ops.append(Op(i, kind, tuple(rng.getrandbits(64) for _ in range(NWORDS))))
    return ops


def select(ops: Sequence[Op], only: Sequence[int]) -> list[Op]:
    """The operations of ``ops`` at the indexes ``only`` (a replayed reproducer)."""
    by_index = {op.index: op for op in ops}
    missing = [i for i in only if i not in by_index]
    if missing:
        raise ValueError(f"--only names operations beyond --ops: {missing}")
    return [by_index[i] for i in only]
