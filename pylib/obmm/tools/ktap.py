"""KTAP (the kernel's test output format) from a kernel log, as per-test results.

KUnit prints its results as KTAP version 1 (Documentation/dev-tools/ktap.rst): a version line,
a plan ``1..N``, then one ``ok N name`` / ``not ok N name`` line per test, a ``# SKIP`` directive
on skipped ones; a suite is a subtest: its own version line, ``# Subtest: name`` and plan,
indented four spaces, before the result line that closes it.  Diagnostic lines (``# ...``, and
the indented text of a failed expectation) come before the result they belong to.

:func:`parse` reads that from a kernel log (``dmesg`` timestamps and unrelated messages
between the lines are fine) into a tree of :class:`Test`; :func:`cases` flattens it to the
leaves, named ``suite.case``; :func:`verdict` compares them with the cases the sources declare,
so a case that never reported (a crash, a suite that did not run) counts as missing, never as
passed.  Pure Python, no dependencies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

INDENT = 4
_STAMP = re.compile(r"^\[\s*\d+\.\d+\] ?")
_VERSION = re.compile(r"^(?:KTAP version \d+|TAP version \d+)\s*$")
_PLAN = re.compile(r"^1\.\.(\d+)\s*$")
_RESULT = re.compile(r"^(ok|not ok) (\d+)(?: -)?(?: ([^#]*?))?\s*(?:#\s*(.*))?$")
_SUBTEST = re.compile(r"^# Subtest: (.+?)\s*$")

PASS = "pass"
FAIL = "fail"
SKIP = "skip"


@dataclass
class Test:
    """One result line, with the subtests printed before it and its diagnostics."""

    number: int
    name: str
    status: str  # PASS, FAIL or SKIP
    directive: str = ""
    diagnostics: list[str] = field(default_factory=list)
    subtests: list[Test] = field(default_factory=list)
    plan: int | None = None  # the subtests' plan, if any


@dataclass
class Document:
    """A (sub)test document: its plan and the results at one indentation."""

    indent: int
    name: str = ""
    plan: int | None = None
    tests: list[Test] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # diagnostics for the next result


def _strip(line: str) -> str:
    return _STAMP.sub("", line.rstrip("\n")).expandtabs(8).rstrip()


def parse(text: str) -> Document:
    """The KTAP document in `text` (the outermost one; an empty one if there is none)."""
    stack: list[Document] = []
    root: Document | None = None
    for raw in text.splitlines():
        line = _strip(raw)
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        if not body:
            continue
        if _VERSION.match(body):
            while stack and stack[-1].indent > indent:
                stack.pop()  # a subtest document never closed by its parent's result
            if stack and stack[-1].indent == indent and root is not stack[-1]:
                stack.pop()
            doc = Document(indent)
            if root is None:
                root = doc
            stack.append(doc)
            continue
        if root is None:
            continue  # log lines before the first version line
        current = _document_at(stack, indent)
        if current is None:
            continue
        doc = current
        if m := _SUBTEST.match(body):
            doc.name = m.group(1)
        elif m := _PLAN.match(body):
            doc.plan = int(m.group(1))
        elif m := _RESULT.match(body):
            _close_result(stack, doc, m)
        else:
            doc.pending.append(body)  # a diagnostic, or a kernel message in between
    _close_unfinished(stack)
    return root or Document(0)


def _close_unfinished(stack: list[Document]) -> None:
    """Subtests the output ended inside (the kernel died, the log was cut): kept, under a
    failed result of their own, so the cases that did report still count."""
    while len(stack) > 1:
        child = stack.pop()
        parent = stack[-1]
        parent.tests.append(
            Test(
                len(parent.tests) + 1,
                child.name or "(unnamed subtest)",
                FAIL,
                diagnostics=[*child.pending, "the output ends inside this subtest"],
                subtests=child.tests,
                plan=child.plan,
            )
        )


def _document_at(stack: list[Document], indent: int) -> Document | None:
    """The open document a line at `indent` belongs to: the innermost at or above it."""
    for doc in reversed(stack):
        if doc.indent <= indent:
            return doc
    return None


def _close_result(stack: list[Document], doc: Document, m: re.Match[str]) -> None:
    ok, number, name, directive = m.group(1), int(m.group(2)), m.group(3) or "", m.group(4) or ""
    status = PASS if ok == "ok" else FAIL
    if directive.upper().startswith("SKIP"):
        status = SKIP
    test = Test(number, name.strip(), status, directive.strip(), doc.pending)
    doc.pending = []
    # A deeper document still open is this test's subtests.
    while stack and stack[-1] is not doc and stack[-1].indent > doc.indent:
        child = stack.pop()
        if child.indent == doc.indent + INDENT or not test.subtests:
            test.subtests = child.tests
            test.plan = child.plan
            test.diagnostics = child.pending + test.diagnostics
    doc.tests.append(test)


@dataclass(frozen=True)
class Case:
    """A leaf result: ``suite.case`` and how it ended."""

    name: str
    status: str
    detail: str = ""


def cases(doc: Document, depth: int = 2) -> list[Case]:
    """Every test `depth` levels down (KUnit's ``suite.case``; a parameterised case's
    parameters are its subtests and its own result sums them up), in order."""
    found: list[Case] = []

    def walk(tests: Sequence[Test], prefix: str, level: int) -> None:
        for t in tests:
            name = f"{prefix}{t.name}"
            if t.subtests and level < depth:
                walk(t.subtests, name + ".", level + 1)
            else:
                detail = (
                    re.sub(r"^SKIP\s*", "", t.directive, flags=re.I)
                    if t.status == SKIP
                    else "\n".join(t.diagnostics)
                )
                found.append(Case(name, t.status, detail))

    walk(doc.tests, "", 1)
    return found


def plan_gaps(doc: Document) -> list[str]:
    """Where a plan promised more results than were printed (``suite: 5 of 6 reported``)."""
    gaps: list[str] = []

    def check(tests: Sequence[Test], plan: int | None, where: str) -> None:
        if plan is not None and len(tests) < plan:
            gaps.append(f"{where}: {len(tests)} of {plan} reported")
        for t in tests:
            if t.subtests or t.plan is not None:
                check(t.subtests, t.plan, f"{where}.{t.name}" if where != "(top)" else t.name)

    check(doc.tests, doc.plan, "(top)")
    return gaps


@dataclass(frozen=True)
class Verdict:
    """The expected cases held against the results."""

    expected: tuple[str, ...]
    passed: tuple[str, ...]
    failed: tuple[Case, ...]
    skipped: tuple[Case, ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    gaps: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return (
            bool(self.expected)
            and len(self.passed) == len(self.expected)
            and not (self.failed or self.skipped or self.missing or self.unexpected or self.gaps)
        )

    def summary(self) -> str:
        """``6/6 passed``, with what is wrong after it when it is not."""
        text = f"{len(self.passed)}/{len(self.expected)} passed"
        extra = [
            f"{len(self.failed)} failed" if self.failed else "",
            f"{len(self.skipped)} skipped" if self.skipped else "",
            f"missing: {', '.join(self.missing)}" if self.missing else "",
            f"not declared: {', '.join(self.unexpected)}" if self.unexpected else "",
            f"plan: {'; '.join(self.gaps)}" if self.gaps else "",
        ]
        extra = [e for e in extra if e]
        return text + (f" ({'; '.join(extra)})" if extra else "")


def verdict(doc: Document, expected: Iterable[str]) -> Verdict:
    """`expected` (``suite.case`` names) against what `doc` reports."""
    wanted = tuple(expected)
    got = {c.name: c for c in cases(doc)}
    return Verdict(
        expected=wanted,
        passed=tuple(n for n in wanted if n in got and got[n].status == PASS),
        failed=tuple(got[n] for n in wanted if n in got and got[n].status == FAIL),
        skipped=tuple(got[n] for n in wanted if n in got and got[n].status == SKIP),
        missing=tuple(n for n in wanted if n not in got),
        unexpected=tuple(n for n in got if n not in wanted),
        gaps=tuple(plan_gaps(doc)),
    )


_SUITE_STRUCT = re.compile(r"static\s+struct\s+kunit_suite\s+(\w+)\s*=\s*\{(.*?)\};", re.S)
_SUITE_NAME = re.compile(r"\.name\s*=\s*\"([^\"]+)\"")
_SUITE_CASES = re.compile(r"\.test_cases\s*=\s*(\w+)")
_CASE_ARRAY = r"static\s+struct\s+kunit_case\s+{}\s*\[\s*\]\s*=\s*\{{(.*?)\}};"
_CASE = re.compile(r"\bKUNIT_CASE(?:_SLOW|_PARAM|_PARAM_ATTR|_ATTR)?\s*\(\s*(\w+)")
_REGISTERED = re.compile(r"\bkunit_test_(?:init_section_)?suites?\s*\(([^;]*)\)\s*;")


def declared_cases(source: str) -> list[str]:
    """``suite.case`` for every case of every suite a C file registers with kunit_test_suite(s)
    (parameterised cases by their case name)."""
    registered = {
        name.strip().lstrip("&")
        for m in _REGISTERED.finditer(source)
        for name in m.group(1).split(",")
        if name.strip()
    }
    names: list[str] = []
    for m in _SUITE_STRUCT.finditer(source):
        var, body = m.group(1), m.group(2)
        if var not in registered:
            continue
        suite = _SUITE_NAME.search(body)
        array = _SUITE_CASES.search(body)
        if not suite or not array:
            continue
        cases_m = re.search(_CASE_ARRAY.format(re.escape(array.group(1))), source, re.S)
        if cases_m:
            names += [f"{suite.group(1)}.{c}" for c in _CASE.findall(cases_m.group(1))]
    return names
