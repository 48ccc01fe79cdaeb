"""C source scanning for the project's checkers (a leaf: stdlib only).

Comments, literals and preprocessor lines are blanked (newlines kept), then function definitions
are found by brace matching at file level.  No C parser: kernel code (attributes, macros that
expand to definitions, GNU extensions) defeats the ones on PyPI, and the checkers need only where
each function starts and what its body says.  Used by :mod:`obmm.tools.ccalls` (the call graph
between a module's files) and :mod:`obmm.testbed.stages.errno_sources` (the errnos an upstream
driver's operations can return).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LITERALS_AND_COMMENTS = re.compile(
    r'"(?:[^"\\\n]|\\.)*"'  # string literal
    r"|'(?:[^'\\\n]|\\.)*'"  # char literal
    r"|//[^\n]*|/\*.*?\*/"  # comments
    r"|^[ \t]*#(?:[^\n]|\\\n)*",  # preprocessor lines, continuations included
    re.S | re.M,
)
KEYWORDS = frozenset({"if", "for", "while", "switch", "return", "sizeof", "else", "do"})


@dataclass(frozen=True)
class Function:
    """One function definition: its file, name, first line and body (blanked text)."""

    path: str
    name: str
    line: int
    body: str
    static: bool


def blank(text: str) -> str:
    """Comments, string and char literals and preprocessor lines replaced by spaces (newlines
    kept, so line numbers stay): braces and ``-EXXX`` inside them do not count."""

    def spaces(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    return re.sub(LITERALS_AND_COMMENTS, spaces, text)


def match_bracket(text: str, pos: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes the one at `pos`."""
    depth = 0
    for i in range(pos, len(text)):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced {open_!r} at offset {pos}")


HEAD = re.compile(r"\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*(?:__\w+\s*(?:\([^)]*\))?\s*)*$", re.S)


def functions(path: Path) -> list[Function]:
    """Every function defined at file level in `path` (a ``{`` at depth 0 whose head is a
    name and a parameter list; initializers, which have ``=`` before the brace, are not)."""
    text = blank(path.read_text(errors="replace"))
    found: list[Function] = []
    pos = 0
    while (brace := text.find("{", pos)) >= 0:
        head = text[max(text.rfind(";", 0, brace), text.rfind("}", 0, brace)) + 1 : brace]
        end = match_bracket(text, brace, "{", "}")
        m = HEAD.search(head)
        if m and "=" not in head and m.group(1) not in KEYWORDS:
            found.append(
                Function(
                    path=path.name,
                    name=m.group(1),
                    line=text.count("\n", 0, brace) + 1,
                    body=text[brace:end],
                    static=bool(re.search(r"\bstatic\b", head[: m.start()])),
                )
            )
        pos = end
    return found
