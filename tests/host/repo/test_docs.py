"""The project's documents stand on their own: no file points into the shared reference
outside the checkout (its content is in docs/); every relative link of a Markdown file of the
checkout (README.md, CONTRIBUTING.md, docs/*.md, the READMEs beside the code) reaches a file of
the checkout, and a heading where it names one; every Python module or name the documents and
docstrings name (`obmm.x.y` in a Markdown code span, `python -m obmm.x`, :mod:`obmm.x`,
:func:`obmm.x.f`...) exists; the README is a front page that links every page of docs/."""

from __future__ import annotations

import ast
import html
import importlib.util
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[3]
THIS = Path(__file__).resolve()

# The shared reference (../shared/reference/*.md) is not part of a clone; docs/ carries it.  Nor
# is there a place upstream code is looked for: it is given by path (issue 38), so no file names
# any directory under shared/.
OUTSIDE = re.compile(
    r"\.\./shared/|(?<![\w./-])shared/[a-z]"
    r"|obmm-uapi-and-driver\.md|seed-scheme7\.md|seed-notes\.md|testbed-practices\.md"
)
LINKED = ("README.md", "CONTRIBUTING.md", "docs/*.md")
PYLIB = REPO / "pylib"

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`+[^`]*`+")
INLINE_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
LINK_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def tracked_files(repo: Path) -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    return [repo / name for name in out.decode().split("\0") if name]


def outside_references(files: list[Path], repo: Path) -> list[str]:
    """`path:line: text` of every line that points into the shared reference."""
    found = []
    for path in files:
        if path.resolve() == THIS or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(repo)}:{number}: {line.strip()}")
    return found


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(number, line) of the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def links(text: str) -> Iterator[tuple[int, str]]:
    """(line, target) of every link outside code (inline links, images, definitions)."""
    for number, line in prose_lines(text):
        line = CODE_SPAN.sub("", line)
        for match in INLINE_LINK.finditer(line):
            yield number, match.group(1)
        definition = LINK_DEFINITION.match(line)
        if definition:
            yield number, definition.group(1)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before de-duplication)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    text = html.unescape(text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors a Markdown file offers: its headings' slugs and explicit HTML anchors."""
    seen: dict[str, int] = {}
    found = set()
    for _number, line in prose_lines(text):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def broken_links(documents: list[Path], repo: Path) -> list[str]:
    """`doc:line: target (why)` for every relative link that does not resolve."""
    broken = []
    cache: dict[Path, set[str]] = {}
    for doc in documents:
        text = doc.read_text(encoding="utf-8")
        for number, target in links(text):
            if SCHEME.match(target):
                continue  # https:, mailto:, ...
            where = f"{doc.relative_to(repo)}:{number}: {target}"
            path_part, _, anchor = target.partition("#")
            dest = (doc.parent / unquote(path_part)).resolve() if path_part else doc.resolve()
            if not dest.is_relative_to(repo.resolve()):
                broken.append(f"{where} (outside the checkout)")
            elif not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest.read_text(encoding="utf-8"))
                if unquote(anchor) not in cache[dest]:
                    broken.append(f"{where} (no heading with that anchor)")
    return broken


def linked_documents(repo: Path) -> list[Path]:
    """README.md, CONTRIBUTING.md, docs/*.md and every other Markdown file git tracks."""
    documents = {p for pattern in LINKED for p in repo.glob(pattern) if p.is_file()}
    documents.update(p for p in tracked_files(repo) if p.suffix == ".md" and p.is_file())
    return sorted(documents)


def test_no_file_points_into_the_shared_reference() -> None:
    found = outside_references(tracked_files(REPO), REPO)
    assert not found, (
        "these lines point outside the checkout (a clone has no ../shared); link the matching "
        "docs/ section instead:\n" + "\n".join(found)
    )


def test_every_relative_link_of_the_documents_resolves() -> None:
    documents = linked_documents(REPO)
    assert REPO / "docs" / "obmm-driver.md" in documents
    assert REPO / "kmod" / "obmm_emu" / "README.md" in documents
    broken = broken_links(documents, REPO)
    assert not broken, "broken links:\n" + "\n".join(broken)


# The checker itself, on documents made to fail it.


def test_checker_reports_missing_files_anchors_and_escapes(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Title\n## 2.1 Devices\n## Devices\n## Devices\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/b.md) [ok](docs/b.md#21-devices) [ok](docs/b.md#devices-1)\n"
        "[ok](#top) [ok](https://example.org/x.md#nope) `[code](docs/none.md)`\n"
        '<a id="top"></a>\n'
        "[gone](docs/none.md)\n"
        "[anchor](docs/b.md#21-device)\n"
        "```\n[fenced](docs/none.md)\n```\n"
        "[out](../elsewhere.md)\n"
        "[def]: docs/missing.md\n"
    )
    broken = broken_links([tmp_path / "README.md"], tmp_path)
    assert broken == [
        "README.md:4: docs/none.md (no such file)",
        "README.md:5: docs/b.md#21-device (no heading with that anchor)",
        "README.md:9: ../elsewhere.md (outside the checkout)",
        "README.md:10: docs/missing.md (no such file)",
    ]


def test_checker_reports_references_into_the_shared_reference(tmp_path: Path) -> None:
    files = {
        "a.md": "see `../shared/reference/obmm-uapi-and-driver.md` §2\n",
        "b.py": '"""Reference: obmm-uapi-and-driver.md section 2.5."""\n',
        "c.md": "pinned copy in `shared/trees/` beside the checkout\n",
        "f.md": "the tree `$OBMM_UB_UPSTREAM` names (an input given by path)\n",
        "d.py": "# (reference seed-scheme7.md section 5)\n",
        "e.bin": b"\xff\xfe shared/reference",
    }
    for name, body in files.items():
        path = tmp_path / name
        if isinstance(body, bytes):
            path.write_bytes(body)
        else:
            path.write_text(body)
    found = outside_references(sorted(tmp_path.iterdir()), tmp_path)
    assert [line.split(":")[0] for line in found] == ["a.md", "b.py", "c.md", "d.py"]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("4.9 open of /dev/obmm_shmdev&lt;id&gt;", "49-open-of-devobmm_shmdevid"),
        ("3.3 Export a process's memory (EXPORT_PID)", "33-export-a-processs-memory-export_pid"),
        ("4.1 Every /dev/obmm ioctl", "41-every-devobmm-ioctl"),
        ("`obmm_emu.ko` — the emulated driver", "obmm_emuko--the-emulated-driver"),
        ("8.2 The vendor adaptor and the UB controller's sysfs",
         "82-the-vendor-adaptor-and-the-ub-controllers-sysfs"),
    ],
)  # fmt: skip
def test_slug_follows_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


# The README is documentation, not a log: the two commands open it, the architecture follows
# within the first screen, and no dated measurement is left in its prose (figures come from
# `make bench`). A date, a clock time or "measured here" is what a diary entry looks like.
FIRST_SCREEN_LINES = 60
DIARY = re.compile(
    r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2}:\d\d\b(?! *[|`])|[Mm]easured here|on this machine"
    r"|[Ee]arlier that day|that night|this session"
)


def readme_shape_problems(text: str) -> list[str]:
    lines = text.splitlines()
    problems = []
    opening = "\n".join(lines[:12])
    for command in ("make setup", "make test"):
        if command not in opening:
            problems.append(f"`{command}` is not in the README's first lines")
    headings = [i for i, line in enumerate(lines) if line.startswith("## Architecture")]
    if not headings or headings[0] >= FIRST_SCREEN_LINES:
        problems.append(f"no '## Architecture' within the first {FIRST_SCREEN_LINES} lines")
    return problems + diary_lines(text, "README.md")


def diary_lines(text: str, name: str) -> list[str]:
    """`name:line: dated narrative` of every prose line that reads like a log entry."""
    problems = []
    for number, line in prose_lines(text):
        match = DIARY.search(CODE_SPAN.sub("", line))
        if match:
            problems.append(f"{name}:{number}: dated narrative {match.group(0)!r}")
    return problems


def test_readme_is_documentation_not_a_diary() -> None:
    assert readme_shape_problems((REPO / "README.md").read_text()) == []


def test_the_docs_pages_are_not_diaries_either() -> None:
    found = []
    for page in sorted((REPO / "docs").glob("*.md")):
        found += diary_lines(page.read_text(encoding="utf-8"), f"docs/{page.name}")
    assert found == []


def test_readme_shape_check_finds_a_diary() -> None:
    diary = (
        "# x\n\nsome words\n\n## Usage\n\nMeasured here on 2026-12-01 at 19:00: 435 s.\n"
        "```\nat 10:00 in a code block is fine\n```\n"
    )
    assert readme_shape_problems(diary) == [
        "`make setup` is not in the README's first lines",
        "`make test` is not in the README's first lines",
        "no '## Architecture' within the first 60 lines",
        "README.md:7: dated narrative 'Measured here'",
    ]


# Python names the documents give: a module that moved or a function renamed leaves a
# reference nobody can follow. Checked statically (nothing is imported): the longest dotted
# prefix that is a module under pylib/, then the name it defines (following `from x import`),
# then a member of a class defined there.

# A whole code span that is a dotted name, possibly called: `obmm.testbed.session.bring_up`,
# `obmm.abi.new("struct ...")`. File names (`obmm.ko`) and kernel parameters (`obmm.net=`) are not.
SPAN_NAME = re.compile(r"^(obmm(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?$")
FILE_SUFFIXES = {"ko", "o", "c", "h", "py", "md", "json", "so", "txt", "toml", "yml", "mk"}
RUN_MODULE = re.compile(r"\bpython3?\s+-m\s+(obmm(?:\.\w+)*)")
SPHINX_ROLE = re.compile(r":(mod|func|class|meth|attr|data|exc|obj):`~?(obmm(?:\.\w+)*)`")


def module_file(parts: list[str], pylib: Path) -> Path | None:
    base = pylib.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _definitions(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module (or class) body binds, looking into if/try blocks."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                names[alias.asname or alias.name] = node
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                names.update(_definitions(block))
            for handler in getattr(node, "handlers", []):
                names.update(_definitions(handler.body))
    return names


def python_name_problem(
    dotted: str, pylib: Path, module_only: bool = False, depth: int = 0, shown: str = ""
) -> str:
    """'' when `dotted` names a module of pylib/ (or, unless module_only, a name one defines)."""
    shown = shown or dotted
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        path = module_file(parts[:k], pylib)
        if path is not None:
            break
    else:
        return f"{shown}: no module {parts[0]}"
    module, rest = ".".join(parts[:k]), parts[k:]
    if not rest:
        return ""
    if module_only:
        return f"{shown}: no such module ({module} has no submodule {rest[0]})"
    names = _definitions(ast.parse(path.read_text(encoding="utf-8")).body)
    node = names.get(rest[0])
    if node is None:
        return f"{shown}: {module} has no submodule or name {rest[0]}"
    if isinstance(node, ast.ImportFrom) and depth < 8:
        source = node.module or ""
        if node.level:
            package = parts[:k] if path.name == "__init__.py" else parts[: k - 1]
            package = package[: len(package) - (node.level - 1)]
            source = ".".join([*package, *([source] if source else [])])
        if not source.startswith("obmm"):
            return ""
        original = next(a.name for a in node.names if (a.asname or a.name) == rest[0])
        target = ".".join([source, original, *rest[1:]])
        return python_name_problem(target, pylib, False, depth + 1, shown)
    if isinstance(node, ast.ClassDef) and len(rest) > 1:
        inherits = any(not (isinstance(b, ast.Name) and b.id == "object") for b in node.bases)
        if rest[1] not in _definitions(node.body) and not inherits:
            return f"{shown}: class {module}.{rest[0]} has no member {rest[1]}"
    return ""


def markdown_python_names(text: str) -> Iterator[tuple[int, str, bool]]:
    """(line, dotted name, module_only) of the Python names a Markdown text gives."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        for match in RUN_MODULE.finditer(line):
            yield number, match.group(1), True
        for match in SPHINX_ROLE.finditer(line):
            yield number, match.group(2), match.group(1) == "mod"
        if fenced:
            continue
        for span in CODE_SPAN.findall(line):
            name = SPAN_NAME.match(span.strip("`").strip())
            if name and name.group(1).rsplit(".", 1)[1] not in FILE_SUFFIXES:
                yield number, name.group(1), False


def source_python_names(text: str) -> Iterator[tuple[int, str, bool]]:
    """(line, dotted name, module_only) of the Sphinx roles and `-m` runs in a Python file."""
    for number, line in enumerate(text.splitlines(), 1):
        for match in SPHINX_ROLE.finditer(line):
            yield number, match.group(2), match.group(1) == "mod"
        for match in RUN_MODULE.finditer(line):
            yield number, match.group(1), True


def missing_python_names(files: list[Path], repo: Path, pylib: Path) -> list[str]:
    found = []
    for path in files:
        if path.suffix == ".md":
            refs = markdown_python_names(path.read_text(encoding="utf-8"))
        elif path.suffix == ".py" and path.resolve() != THIS:
            refs = source_python_names(path.read_text(encoding="utf-8"))
        else:
            continue
        for number, dotted, module_only in refs:
            problem = python_name_problem(dotted, pylib, module_only)
            if problem:
                found.append(f"{path.relative_to(repo)}:{number}: {problem}")
    return found


def test_every_python_name_the_documents_give_exists() -> None:
    files = [p for p in tracked_files(REPO) if p.suffix in (".md", ".py") and p.is_file()]
    missing = missing_python_names(files, REPO, PYLIB)
    assert not missing, "references to Python modules or names that do not exist:\n" + "\n".join(
        missing
    )


def test_name_checker_finds_moved_modules_and_names(tmp_path: Path) -> None:
    pkg = tmp_path / "pylib" / "obmm"
    (pkg / "testbed").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from obmm.api import Obmm\nfrom .api import ShmDev as Dev\n")
    (pkg / "api.py").write_text(
        "class Obmm:\n    def import_(self): ...\nclass ShmDev:\n    pass\n"
        "try:\n    import fast\nexcept ImportError:\n    SLOW = 1\n"
    )
    (pkg / "testbed" / "__init__.py").write_text("")
    (pkg / "testbed" / "session.py").write_text("def bring_up(): ...\nLIMIT: int = 3\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "`obmm.testbed.session.bring_up` `obmm.Obmm.import_` `obmm.Dev` `obmm.api.SLOW`\n"
        "`obmm.ko` and `obmm.net=` and `obmm.abi.ko` are files or words, not names\n"
        "`obmm.testbed.snapshot` moved; `obmm.testbed.session.bring_down` never was\n"
        "run `python -m obmm.testbed.session`, then `python3 -m obmm.testbed.hub`\n"
        "`obmm.Obmm.export` `obmm.testbed.session.LIMIT` `obmm.api.Obmm.import_(x)`\n"
        "```\n`obmm.in_code` is a fenced block; python -m obmm.gone is still a command\n```\n"
    )
    src = tmp_path / "mod.py"
    src.write_text(
        '"""See :mod:`obmm.testbed.session` and :mod:`obmm.api.Obmm`, :func:`obmm.nope`."""\n'
    )
    found = missing_python_names([doc, src], tmp_path, tmp_path / "pylib")
    assert found == [
        "README.md:3: obmm.testbed.snapshot: obmm.testbed has no submodule or name snapshot",
        "README.md:3: obmm.testbed.session.bring_down: "
        "obmm.testbed.session has no submodule or name bring_down",
        "README.md:4: obmm.testbed.hub: no such module (obmm.testbed has no submodule hub)",
        "README.md:5: obmm.Obmm.export: class obmm.api.Obmm has no member export",
        "README.md:7: obmm.gone: no such module (obmm has no submodule gone)",
        "mod.py:1: obmm.api.Obmm: no such module (obmm.api has no submodule Obmm)",
        "mod.py:1: obmm.nope: obmm has no submodule or name nope",
    ]


# A path of the checkout written in a code span (`pylib/obmm/testbed/hub.py`, `tests/cluster/`,
# `tests/guest/test_x.py::test_y`) names a file or directory that exists, from the checkout's
# root or from the document's own directory (a sample project's README). Placeholders
# (`<name>`, `*`, `{a,b}`, `$VAR`) are not paths.
REPO_PATH = re.compile(
    r"^((?:pylib|tests|kmod|qemu|ci|docs|examples|uapi|\.github|\.ci)/[\w./+-]*)$"
)


def missing_paths(documents: list[Path], repo: Path) -> list[str]:
    found = []
    for doc in documents:
        for number, line in prose_lines(doc.read_text(encoding="utf-8")):
            for span in CODE_SPAN.findall(line):
                inner = re.split(r"::|:(?=[A-Za-z_])", span.strip("`").strip())[0]
                path = REPO_PATH.match(inner)
                if path and not any((base / path.group(1)).exists() for base in (repo, doc.parent)):
                    found.append(f"{doc.relative_to(repo)}:{number}: {inner}")
    return found


def test_every_path_the_documents_name_exists() -> None:
    missing = missing_paths(linked_documents(REPO), REPO)
    assert not missing, "paths in code spans that do not exist:\n" + "\n".join(missing)


def test_path_checker_finds_a_moved_file(tmp_path: Path) -> None:
    (tmp_path / "pylib" / "obmm").mkdir(parents=True)
    (tmp_path / "pylib" / "obmm" / "api.py").write_text("")
    (tmp_path / "examples" / "p" / "tests").mkdir(parents=True)
    (tmp_path / "examples" / "p" / "tests" / "test_a.py").write_text("")
    readme = tmp_path / "README.md"
    readme.write_text(
        "`pylib/obmm/api.py` `pylib/obmm/` `pylib/obmm/api.py:Obmm` `pylib/obmm/api.py::test`\n"
        "`qemu/topologies/<name>.json` `kmod/*` `tests/guest/test_{a,b}.py` `pylib/obmm/gone.py`\n"
        "```\n`pylib/in_a_block.py`\n```\n`tests/test_a.py` `tests/cluster/`\n"
    )
    sample = tmp_path / "examples" / "p" / "README.md"
    sample.write_text("`tests/test_a.py`\n")
    assert missing_paths([readme, sample], tmp_path) == [
        "README.md:2: pylib/obmm/gone.py",
        "README.md:6: tests/test_a.py",
        "README.md:6: tests/cluster/",
    ]


# The README is the front page: short, and every page of docs/ is one link away from it.
README_MAX_LINES = 300


def front_page_problems(readme: Path, docs: Path) -> list[str]:
    text = readme.read_text(encoding="utf-8")
    problems = []
    count = len(text.splitlines())
    if count > README_MAX_LINES:
        problems.append(
            f"README.md has {count} lines, more than {README_MAX_LINES}: move the detail to docs/"
        )
    targets = {
        (readme.parent / target.partition("#")[0]).resolve()
        for _line, target in links(text)
        if not SCHEME.match(target) and target.partition("#")[0]
    }
    for page in sorted(docs.glob("*.md")):
        if page.resolve() not in targets:
            problems.append(f"README.md does not link {page.relative_to(readme.parent)}")
    return problems


def test_readme_is_a_front_page_linking_every_page() -> None:
    assert front_page_problems(REPO / "README.md", REPO / "docs") == []


def test_front_page_check_finds_a_long_readme_and_an_unlinked_page(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for name in ("a.md", "b.md", "c.md"):
        (tmp_path / "docs" / name).write_text("# x\n")
    (tmp_path / "README.md").write_text(
        "[a](docs/a.md#x) `[b](docs/b.md)` [web](https://example.org/docs/c.md)\n" + "\n" * 300
    )
    assert front_page_problems(tmp_path / "README.md", tmp_path / "docs") == [
        "README.md has 301 lines, more than 300: move the detail to docs/",
        "README.md does not link docs/b.md",
        "README.md does not link docs/c.md",
    ]


# The generated tables: each on its page (ci/sync_docs.py), none copied elsewhere.


def _sync_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sync_docs", REPO / "ci" / "sync_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_generated_table_has_one_page_linked_from_the_readme() -> None:
    sync = _sync_docs()
    pages = {page for page, *_rest in sync.TABLES}
    assert pages == {
        Path("docs/causes.md"),
        Path("docs/settings.md"),
        Path("docs/emulated-driver.md"),
    }
    assert sync.rendered() == {page: (REPO / page).read_text() for page in pages}
    assert sync.stray_copies() == []


def test_sync_docs_finds_a_stale_table_a_lost_marker_and_a_copy(tmp_path: Path) -> None:
    sync = _sync_docs()
    (tmp_path / "docs").mkdir()
    for page, *_rest in sync.TABLES:
        (tmp_path / page).write_text((REPO / page).read_text())
    (tmp_path / "README.md").write_text("# x\n")
    assert sync.rendered(tmp_path) == {page: (REPO / page).read_text() for page, *_ in sync.TABLES}
    settings = tmp_path / "docs" / "settings.md"
    fresh = settings.read_text()
    settings.write_text(fresh.replace("| `OBMM_TESTBED_NODES` |", "| `OBMM_TESTBED_NODEZ` |"))
    assert sync.rendered(tmp_path)[Path("docs/settings.md")] == fresh
    (tmp_path / "README.md").write_text(f"# x\n{sync.VARS_BEGIN}\n| old |\n{sync.VARS_END}\n")
    assert sync.stray_copies(tmp_path) == [
        "README.md carries a copy of the table of docs/settings.md"
    ]
    settings.write_text(fresh.replace(sync.VARS_END, ""))
    with pytest.raises(sync.Stale, match=r"docs/settings\.md has the markers"):
        sync.rendered(tmp_path)
