"""The kernel-log guard's view of one test's messages (obmm.testbed.vm.kguard)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from obmm.testbed.vm.kguard import KernelLogGuard

WARN = "[   12.5] WARNING: CPU: 0 PID: 7 at drivers/obmm/x.c:10 f+0x1/0x2\n"


class FakeNode:
    """A node whose kernel log is a string: /dev/kmsg writes append to it."""

    name = "node0"

    def __init__(self, log: str = "") -> None:
        self.log = log

    def alive(self) -> bool:
        return True

    def run(self, command: str, **_: Any) -> SimpleNamespace:
        if "> /dev/kmsg" in command:
            self.log += command.split("'")[1] + "\n"
            return SimpleNamespace(out="0\n")
        assert command == "dmesg", command
        return SimpleNamespace(out=self.log)


def test_reports_are_this_tests_only() -> None:
    node = FakeNode("[    1.0] boot\n" + WARN)  # an earlier test's (expected) report
    guard = KernelLogGuard([node])  # type: ignore[list-item]
    guard.start("test_one")
    assert guard.reports(0) == []
    node.log += "[   13.0] obmm: fine\n" + WARN
    guard.mark("a test's own marker")  # a later marker does not hide the test's messages
    assert [r.kind for r in guard.reports(0)] == ["warn"]
    guard.start("test_two")  # the next test starts clean
    assert guard.reports(0) == []
