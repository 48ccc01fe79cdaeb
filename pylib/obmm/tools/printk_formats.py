"""The format strings of a C source's kernel log calls (pr_err(), pr_info(), ...).

Used to compare what the emulated driver logs with what the real one does: both are read from
their sources, the real driver's from a tree given by path (never part of this project).

A call's format is the concatenation of its string literals, as they are written (escapes
left as they are), with the named macros expanded (``EID_FMT64`` and the like); an argument
that is neither is kept as ``<NAME>``.  Comments are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: printk wrappers whose first argument is the format, by level.
LEVELS = {
    "pr_emerg": "emerg",
    "pr_alert": "alert",
    "pr_crit": "crit",
    "pr_err": "err",
    "pr_warn": "warn",
    "pr_notice": "notice",
    "pr_info": "info",
    "pr_debug": "debug",
}
CALL = re.compile(r"\b(pr_[a-z]+?)(?:_ratelimited|_once)?\s*\(")
STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class LogCall:
    """One log call: where, its level, and its format."""

    path: str
    line: int
    level: str
    fmt: str

    @property
    def text(self) -> str:
        """The format without its trailing newline (printk ends a line either way)."""
        return self.fmt.removesuffix("\\n")


def _strip_comments(text: str) -> str:
    """Comments blanked out (newlines kept, so line numbers stay), strings untouched."""
    out, pos = [], 0
    for m in re.finditer(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', text, re.S):
        out.append(text[pos : m.start()])
        piece = m.group(0)
        out.append(piece if piece.startswith('"') else re.sub(r"[^\n]", " ", piece))
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def _arguments(text: str, start: int) -> list[str]:
    """The top-level arguments of the call whose '(' is just before `start`."""
    args, depth, cur, i = [], 0, [], start
    while i < len(text):
        c = text[i]
        if c == '"':
            m = STRING.match(text, i)
            if not m:
                break
            cur.append(m.group(0))
            i = m.end()
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                args.append("".join(cur))
                return args
            depth -= 1
        elif c == "," and depth == 0:
            args.append("".join(cur))
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    return args


def format_of(arg: str, macros: Mapping[str, str]) -> str:
    """A format argument as one string: its literals joined, known macros expanded."""
    parts = []
    pos = 0
    arg = arg.strip()
    while pos < len(arg):
        if arg[pos].isspace():
            pos += 1
            continue
        m = STRING.match(arg, pos)
        if m:
            parts.append(m.group(1))
            pos = m.end()
            continue
        m = IDENT.match(arg, pos)
        if m:
            name = m.group(0)
            parts.append(macros.get(name, f"<{name}>"))
            pos = m.end()
            continue
        parts.append(arg[pos])
        pos += 1
    return "".join(parts)


def log_calls(
    path: Path,
    *,
    macros: Mapping[str, str] | None = None,
    wrappers: Mapping[str, tuple[str, int]] | None = None,
) -> list[LogCall]:
    """Every log call of one C file.  `wrappers` names functions or macros of the file's own
    that log (name -> (level, index of the format argument))."""
    text = _strip_comments(path.read_text(errors="replace"))
    macros = macros or {}
    calls = []
    names = dict(wrappers or {})
    pattern = CALL
    if names:
        pattern = re.compile(
            r"\b(" + "|".join(map(re.escape, names)) + r"|pr_[a-z]+?)(?:_ratelimited|_once)?\s*\("
        )
    for m in pattern.finditer(text):
        name = m.group(1)
        if name in names:
            level, index = names[name]
        elif name in LEVELS:
            level, index = LEVELS[name], 0
        else:
            continue
        args = _arguments(text, m.end())
        if len(args) <= index or '"' not in args[index]:
            continue  # a definition or a call with a computed format
        line = text.count("\n", 0, m.start()) + 1
        calls.append(LogCall(str(path), line, level, format_of(args[index], macros)))
    return calls


def tree_log_calls(
    files: Iterable[Path],
    *,
    macros: Mapping[str, str] | None = None,
    wrappers: Mapping[str, tuple[str, int]] | None = None,
) -> list[LogCall]:
    return [c for f in sorted(files) for c in log_calls(f, macros=macros, wrappers=wrappers)]
