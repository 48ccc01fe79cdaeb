"""The errnos each user-visible operation of a driver's source can return, derived from the code.

Reads the C files of one driver directory (the upstream OBMM driver,
:func:`obmm.testbed.paths.ub_upstream_dir` ``/drivers/ub/obmm``: an input given by path, never
part of the project) and answers, per operation, which ``-EXXX`` constants its code can hand
back.  ``tests/host/runtime/test_causes_derived.py`` compares the answer with :mod:`obmm.causes`.

How:

* Entry points come from the driver's own tables: every ``struct file_operations`` and
  ``struct vm_operations_struct`` initializer names its handlers (``.mmap``, ``.open``,
  ``.mprotect``, ...; :data:`ENTRY_FIELDS` says which operation each field is).  An
  ``.unlocked_ioctl`` handler is split at its ``switch``: each ``case OBMM_CMD_X:`` /
  ``case OBMM_SHMDEV_X:`` block is operation ``X``; the rest of the handler (the checks before
  the switch, the ``default:``) is :data:`ANY_OP`, what every command of that device can get.
* Function bodies are found by brace matching at file level, after comments, string and
  character literals and preprocessor lines are blanked out.
* An errno counts when ``-EXXX`` appears in a body anywhere but in a comparison
  (``ret != -EBUSY``): in ``return -E..``, ``ret = -E..``, ``ERR_PTR(-E..)``, ``c ? -E.. : x``.
* Calls are followed, transitively, into functions defined in the driver's files (a ``static``
  one in the caller's file first), where the call's value is used: assigned, returned, tested
  or passed on.  A call made as a bare statement (``f(x);``, ``(void)f(x);``,
  ``WARN_ON(f(x));``) drops its value, so its errnos cannot reach the caller and it is not
  followed.

Limits (it over- and under-approximates; the test's allowlist names each case it meets):

* Errnos of kernel APIs the driver calls (``-ENOMEM`` from ``kmalloc`` failing inside a helper
  that passes its ``ret`` on, ``-EINTR`` from a killable wait, ``-EFAULT`` of ``pin_user_pages``,
  the VFS's own checks before a handler runs) appear only where the driver names them.
* Paths are not followed: an errno is counted when it is anywhere in a reachable body, also
  when the caller maps it to another errno, logs it and returns 0, or only reaches it from a
  state user space cannot make.  A used value is followed whatever the caller does with it.
* Calls through function pointers (ops tables inside the driver, callbacks) and macros that
  expand to calls are not followed; a function whose name is a driver function but is called
  through a macro of the same name would be.
* Bodies under ``#if``/``#else`` are all read, both branches.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from obmm.testbed import paths
from obmm.tools.csource import Function, blank, functions, match_bracket

#: What every command of an ioctl device can get (matches :data:`obmm.causes.ANY_OP`).
ANY_OP = "*"

#: (ops struct type, field) -> the operation a handler in that field serves.
ENTRY_FIELDS: Mapping[tuple[str, str], str] = {
    ("file_operations", "open"): "OPEN",
    ("file_operations", "mmap"): "MMAP",
    ("file_operations", "flush"): "CLOSE",
    ("vm_operations_struct", "mprotect"): "MPROTECT",
    ("vm_operations_struct", "mremap"): "MPROTECT",
    ("vm_operations_struct", "may_split"): "MUNMAP",
}
#: Prefixes of ioctl command macros, stripped to name the operation.
CMD_PREFIXES = ("OBMM_CMD_", "OBMM_SHMDEV_")

ERRNO = re.compile(r"-\s*(E[A-Z0-9]+)\b")
CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


@dataclass
class Derivation:
    """Per operation: the errnos found, and for each, the functions (``file:function``) that
    name it, so a report can cite where an errno comes from."""

    errnos: dict[str, dict[str, set[str]]] = field(default_factory=dict)

    def ops(self) -> list[str]:
        return sorted(self.errnos)

    def of(self, op: str) -> set[str]:
        return set(self.errnos.get(op, {}))

    def where(self, op: str, errno: str) -> list[str]:
        return sorted(self.errnos.get(op, {}).get(errno, ()))


def errnos_in(body: str) -> set[str]:
    """The ``-EXXX`` constants of a body, comparisons (``== -E``, ``!= -E``) left out."""
    out = set()
    for m in ERRNO.finditer(body):
        before = body[: m.start()].rstrip()
        if before.endswith(("==", "!=")):
            continue
        out.add(m.group(1))
    return out


def _value_dropped(body: str, call_start: int) -> bool:
    """Whether the call starting at `call_start` is a bare statement (its value unused)."""
    before = body[:call_start].rstrip()
    warn = re.search(r"\bWARN_ON(?:_ONCE)?\s*\($", before)
    if warn:
        # `WARN_ON(f(x));` only warns: f's value goes no further than the statement does
        return _value_dropped(body, warn.start())
    if before.endswith("(void)"):
        before = before[: -len("(void)")].rstrip()
    if not before or before[-1] in ";{}:":
        return True
    if before.endswith("else"):
        return True
    if before.endswith(")"):
        # `if (x) f();` drops f's value; `(int)f()` (a cast) does not
        open_at = _open_of(before, len(before) - 1)
        keyword = before[:open_at].rstrip()
        return bool(re.search(r"\b(?:if|while|for)$", keyword))
    return False


def _open_of(text: str, close_at: int) -> int:
    """Index of the ``(`` matching the ``)`` at `close_at`."""
    depth = 0
    for i in range(close_at, -1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            depth -= 1
            if depth == 0:
                return i
    return 0


def calls_in(body: str, known: Iterable[str]) -> set[str]:
    """Names of `known` functions a body calls with its value used."""
    names = set(known)
    return {
        m.group(1)
        for m in CALL.finditer(body)
        if m.group(1) in names and not _value_dropped(body, m.start())
    }


class Driver:
    """The functions and ops tables of one driver directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = sorted(root.glob("*.c"))
        self.by_name: dict[str, list[Function]] = {}
        for path in self.files:
            for fn in functions(path):
                self.by_name.setdefault(fn.name, []).append(fn)

    def resolve(self, name: str, from_file: str) -> Function | None:
        """The definition a call from `from_file` reaches: the static one in that file, else
        the non-static one."""
        defs = self.by_name.get(name, [])
        for fn in defs:
            if fn.static and fn.path == from_file:
                return fn
        return next((fn for fn in defs if not fn.static), None)

    def reach(self, body: str, from_file: str, origin: str, into: dict[str, set[str]]) -> None:
        """Errnos of `body` and of every driver function it reaches, with where each is."""
        todo = [(body, from_file, origin)]
        seen: set[tuple[str, str]] = set()
        while todo:
            text, path, where = todo.pop()
            for e in errnos_in(text):
                into.setdefault(e, set()).add(where)
            for name in calls_in(text, self.by_name):
                fn = self.resolve(name, path)
                if fn is None or (fn.path, fn.name) in seen:
                    continue
                seen.add((fn.path, fn.name))
                todo.append((fn.body, fn.path, f"{fn.path}:{fn.name}"))

    def ops_tables(self) -> list[tuple[str, str, str, str]]:
        """(file, struct type, field, handler) for every ops-table initializer."""
        rows = []
        for path in self.files:
            text = blank(path.read_text(errors="replace"))
            init = r"struct\s+(file_operations|vm_operations_struct)\s+\w+\s*=\s*\{"
            for m in re.finditer(init, text):
                table = text[m.end() - 1 : match_bracket(text, m.end() - 1, "{", "}")]
                for f in re.finditer(r"\.(\w+)\s*=\s*([A-Za-z_]\w*)", table):
                    rows.append((path.name, m.group(1), f.group(1), f.group(2)))
        return rows

    def ioctl_cases(self, handler: Function) -> tuple[dict[str, str], str]:
        """The handler's ``case`` blocks by operation, and the rest of its body."""
        sw = re.search(r"\bswitch\s*\(", handler.body)
        if sw is None:
            return {}, handler.body
        brace = handler.body.index("{", sw.end())
        end = match_bracket(handler.body, brace, "{", "}")
        inner = handler.body[brace + 1 : end - 1]
        labels = list(re.finditer(r"\b(case\s+([A-Za-z_]\w*)|default)\s*:", inner))
        cases: dict[str, str] = {}
        rest = handler.body[:brace] + handler.body[end:]
        for i, lab in enumerate(labels):
            stop = labels[i + 1].start() if i + 1 < len(labels) else len(inner)
            block = inner[lab.end() : stop]
            name = lab.group(2)
            if name is None:
                rest += block
                continue
            for prefix in CMD_PREFIXES:
                name = name.removeprefix(prefix)
            cases[name] = block
        return cases, rest


def derive(root: Path) -> Derivation:
    """Per operation, the errnos the driver in `root` can return (see the module's limits)."""
    drv = Driver(root)
    out = Derivation()
    for path, struct, fld, handler in drv.ops_tables():
        fn = drv.resolve(handler, path)
        if fn is None:
            continue  # a kernel helper (thp_get_unmapped_area) or THIS_MODULE
        where = f"{fn.path}:{fn.name}"
        if fld == "unlocked_ioctl":
            cases, rest = drv.ioctl_cases(fn)
            for op, block in cases.items():
                drv.reach(block, fn.path, where, out.errnos.setdefault(op, {}))
            drv.reach(rest, fn.path, where, out.errnos.setdefault(ANY_OP, {}))
        elif (struct, fld) in ENTRY_FIELDS:
            drv.reach(fn.body, fn.path, where, out.errnos.setdefault(ENTRY_FIELDS[struct, fld], {}))
    return out


def main() -> None:
    """Print the derivation of a driver directory
    (``python -m obmm.testbed.stages.errno_sources DIR``)."""
    tree = paths.ub_upstream_dir()
    if len(sys.argv) > 1:
        root = Path(sys.argv[1])
    elif tree is not None:
        root = tree / "drivers" / "ub" / "obmm"
    else:
        sys.exit(f"errno_sources: no driver directory given ({paths.UB_UPSTREAM_HINT}, or DIR)")
    d = derive(root)
    for op in d.ops():
        for e in sorted(d.of(op)):
            print(f"{op:20} {e:16} {', '.join(d.where(op, e))}")


if __name__ == "__main__":
    main()
