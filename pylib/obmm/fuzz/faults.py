"""Fault injection (failslab, fail_page_alloc) for the fuzzer, when the kernel has it.

Needs CONFIG_FAULT_INJECTION with CONFIG_FAILSLAB / CONFIG_FAIL_PAGE_ALLOC and debugfs (the
production Debian guest kernel has neither knob: :meth:`FaultInjection.detect` then returns
None and the fuzzer says so).  Failures are injected only into the task that arms them
(``task-filter``), only around one system call of an operation that asks for it, and without
the stack dump (``verbose`` 0) that the kernel-log check would otherwise read as a report.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from obmm.tools import logscan

#: The kernel's own report of an injected failure, not the module's: 6.1's __alloc_vmap_area()
#: WARNs when its GFP_NOWAIT allocation of a split vmap_area fails (mm/vmalloc.c, the WARN_ON_ONCE
#: after adjust_va_to_fit_type()), which failslab makes happen in any ioremap(): the one that holds
#: a mapped region's x86 PAT memtype reservation (kmod/obmm_emu/shmdev.c:obmm_memtype_get) sits in
#: the mmap the fuzzer arms.  That mmap then fails ENOMEM and leaves nothing (what is checked).
VMALLOC_WARN = logscan.AllowRule(
    r"\bWARNING: CPU: \d+ PID: \d+ at mm/vmalloc\.c:\d+ \w*alloc_vmap_area\b",
    "the kernel's WARN on an injected failure of a GFP_NOWAIT vmap_area allocation "
    "(mm/vmalloc.c:__alloc_vmap_area), reached through ioremap() with failslab armed",
)
#: What a run with failures injected may leave in the kernel log.
ALLOW: tuple[logscan.AllowRule, ...] = (VMALLOC_WARN,)

DEBUGFS = Path("/sys/kernel/debug")
KNOBS = ("failslab", "fail_page_alloc")
MAKE_IT_FAIL = Path("/proc/thread-self/make-it-fail")
FAIL_NTH = Path("/proc/thread-self/fail-nth")


class FaultInjection:
    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs
        # kept open: an open() while armed could itself be made to fail
        self._fd = os.open(MAKE_IT_FAIL, os.O_WRONLY)
        for d in dirs:
            for name, value in (("task-filter", "Y"), ("probability", "10"), ("interval", "1"),
                                ("times", "-1"), ("verbose", "0"), ("space", "0"),
                                ("ignore-gfp-wait", "N"), ("min-order", "0"),
                                # user pages (__GFP_HIGHMEM) keep working: the fuzzer's own
                                # page faults in the armed window must not fail
                                ("ignore-gfp-highmem", "Y")):  # fmt: skip
                knob = d / name
                if knob.exists():
                    knob.write_text(value)

    def close(self) -> None:
        """Injection off again (probability 0) for whatever runs on this kernel next."""
        for d in self.dirs:
            (d / "probability").write_text("0")
        os.close(self._fd)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.dirs]

    @classmethod
    def detect(cls) -> FaultInjection | None:
        if not (DEBUGFS / KNOBS[0]).exists() and DEBUGFS.is_dir():
            subprocess.run(["mount", "-t", "debugfs", "none", str(DEBUGFS)], capture_output=True)
        dirs = [DEBUGFS / k for k in KNOBS if (DEBUGFS / k).is_dir()]
        if not dirs or not MAKE_IT_FAIL.exists():
            return None
        return cls(dirs)

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        os.pwrite(self._fd, b"1", 0)
        try:
            yield
        finally:
            os.pwrite(self._fd, b"0", 0)

    @contextlib.contextmanager
    def nth(self, n: int) -> Iterator[Callable[[], bool]]:
        """Fail the `n`-th injection point this thread reaches (``/proc/thread-self/fail-nth``),
        whatever the probability; yields a function telling whether it was reached."""
        fd = os.open(FAIL_NTH, os.O_RDWR)
        try:
            os.pwrite(fd, str(n).encode(), 0)
            yield lambda: int(os.pread(fd, 16, 0) or b"0") == 0
        finally:
            os.pwrite(fd, b"0", 0)
            os.close(fd)


def why_absent() -> str:
    if not DEBUGFS.is_dir():
        return "no debugfs"
    return "the kernel has no failslab / fail_page_alloc (CONFIG_FAULT_INJECTION)"
