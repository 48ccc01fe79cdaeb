"""The one base of every testbed failure, so the CLI can report any of them the same way.

A step that fails for a reason the user can act on (no image, a build warning, a node that will
not boot, a host that refuses the login) raises a subclass of :class:`TestbedError` whose first
line says what failed and what to do; `obmm-testbed` prints that line and exits 2.  Subclasses
keep their older bases too (``RuntimeError``, ``ValueError``) so existing handlers still match.
"""

from __future__ import annotations

import importlib.util

from obmm.tools.interrupts import EXIT_INTERRUPTED as EXIT_INTERRUPTED

EXIT_TESTBED_ERROR = 2


class TestbedError(Exception):
    """A testbed step failed; ``str(exc)`` starts with a one-line summary."""

    __test__ = False  # not a pytest test class, despite the name

    @property
    def summary(self) -> str:
        """The first line of the message (the rest is detail: build output, console tails)."""
        lines = str(self).strip().splitlines()
        return lines[0] if lines else type(self).__name__


def require_package(name: str) -> None:
    """ModuleNotFoundError (the CLI prints one line naming the package and its extra) unless
    the optional Python package `name` is installed."""
    if importlib.util.find_spec(name) is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
