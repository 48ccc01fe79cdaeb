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


VMALLOC_WARN = (
    "[   20.0] ------------[ cut here ]------------\n"
    "[   20.0] WARNING: CPU: 0 PID: 140 at mm/vmalloc.c:1598 alloc_vmap_area+0x86d/0x1d10\n"
    "[   20.0] Call Trace:\n"
    "[   20.0] ---[ end trace 0000000000000000 ]---\n"
)
TAINT_W = 1 << 9  # TAINT_WARN


class TaintedNode(FakeNode):
    """A FakeNode with a taint mask, read with the log as the guard's verdict does."""

    def __init__(self) -> None:
        super().__init__("[    1.0] boot\n")
        self.taint = 0

    def run(self, command: str, **kw: Any) -> SimpleNamespace:
        if "> /dev/kmsg" in command:
            super().run(command)
            return SimpleNamespace(out=f"{self.taint}\n")
        if command.startswith("dmesg; echo "):
            sep = command.split("echo ", 1)[1].split(";", 1)[0]
            return SimpleNamespace(out=f"{self.log}{sep}\n{self.taint}\n")
        return super().run(command, **kw)


def test_a_warn_the_run_allows_explains_its_w_taint_and_nothing_else() -> None:
    """The debug-kernel campaign: `make fuzz` (run --kernel-allow fault-injection) saw the
    kernel's own WARN on an injected vmap_area failure, which the fuzzer allows; the run's
    guard reported the W taint it set.  With the rule, that WARN and its W are no failure;
    without it, or with another WARN beside it, they are."""
    from obmm.fuzz import faults

    node = TaintedNode()
    allowing = KernelLogGuard([node], allow=faults.ALLOW)  # type: ignore[list-item]
    strict = KernelLogGuard([node])  # type: ignore[list-item]
    allowing.start("run")
    strict.start("run2")
    node.log += VMALLOC_WARN
    node.taint |= TAINT_W
    assert allowing.failures() == []
    assert allowing.reports(0) == []
    got = strict.failures()
    assert len(got) == 2 and "kernel reports" in got[0] and "taint gained 'W'" in got[1], got
    node.log += WARN  # a WARN of ours: reported, and W is not excused by the allowed one
    got = allowing.failures()
    assert len(got) == 1 and "drivers/obmm/x.c" in got[0] and "mm/vmalloc.c" not in got[0], got


def test_a_w_taint_without_an_allowed_warn_in_the_log_is_a_failure() -> None:
    """A log that lost the WARN (a wrapped ring, seen before log_buf_len=16M on the debug
    kernel) cannot explain a W taint, whatever the run allows."""
    from obmm.fuzz import faults

    node = TaintedNode()
    guard = KernelLogGuard([node], allow=faults.ALLOW)  # type: ignore[list-item]
    guard.start("run")
    node.taint |= TAINT_W
    got = guard.failures()
    assert len(got) == 1 and "taint gained 'W'" in got[0], got


KASAN = (
    "[  693.3] ==================================================================\n"
    "[  693.3] BUG: KASAN: slab-out-of-bounds in obmm_vmap_release+0x1e0/0x210 [obmm]\n"
    "[  693.3] Write of size 2 at addr ffff888006a1c2f0 by task python3/133\n"
    "[  693.3] ==================================================================\n"
)


class UnreachableNode(TaintedNode):
    """A node whose SSH is gone after the start (a kernel stuck after a report), and whose
    console the host still has."""

    def __init__(self, console: str) -> None:
        super().__init__()
        self.console = console
        self.gone = False
        self.asked: list[str] = []

    def run(self, command: str, **kw: Any) -> SimpleNamespace:
        from obmm.testbed.ssh import SshError

        if self.gone:
            raise SshError("node0: ssh connection lost")
        return super().run(command, **kw)

    def console_since(self, marker: str) -> str:
        self.asked.append(marker)
        cut = self.console.rfind(marker)
        return self.console[self.console.find("\n", cut) + 1 :] if cut >= 0 else self.console


def test_a_node_whose_log_ssh_cannot_read_is_reported_with_what_its_console_shows() -> None:
    """A run whose fuzzer drove the emulator into a KASAN report said only "cannot read its
    kernel log: ssh connection lost" (fix 2 reverted, debug kernel): the report was on the
    console.  The guard now scans the console after its marker; an earlier report is not
    this run's."""
    node = UnreachableNode("")
    guard = KernelLogGuard([node])  # type: ignore[list-item]
    guard.start("run")
    node.console = f"[    0.5] {KASAN}[    2.0] {guard.marker}: {guard.tag}\n[  690.0] ok\n{KASAN}"
    node.gone = True
    got = guard.failures()
    assert len(got) == 1, got
    assert got[0].startswith("node0: cannot read its kernel log: node0: ssh connection lost")
    assert "its console shows:" in got[0] and "BUG: KASAN: slab-out-of-bounds" in got[0], got
    assert "1 kernel log report(s)" in got[0], got  # the one before the marker is not the run's
    assert node.asked == [f"{guard.marker}: {guard.tag}"]
    node.console = f"[    2.0] {guard.marker}: {guard.tag}\n[  690.0] ok\n"  # nothing on it
    assert guard.failures() == ["node0: cannot read its kernel log: node0: ssh connection lost"]
