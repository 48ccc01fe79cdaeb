"""One thing on every node at once: the testbed's single fan-out helper."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def on_each(items: Sequence[T], fn: Callable[[T], R]) -> list[R]:
    """fn(item) for every item at once, one thread each; the results in item order.

    Every call finishes before this returns; if any raised, the first failure in item order
    is raised (the others are dropped), so a report names the lowest failing node.
    """
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        futures = [pool.submit(fn, item) for item in items]
    return [f.result() for f in futures]
