"""The project's documents stand on their own: no file points into the shared reference
outside the checkout (its content is in docs/), and every relative link of README.md,
CONTRIBUTING.md and docs/*.md reaches a file of the checkout, and a heading where it names one."""

from __future__ import annotations

import html
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[3]
THIS = Path(__file__).resolve()

# The shared reference (../shared/reference/*.md) is not part of a clone; docs/ carries it.
OUTSIDE = re.compile(
    r"\.\./shared/|shared/reference"
    r"|obmm-uapi-and-driver\.md|seed-scheme7\.md|seed-notes\.md|testbed-practices\.md"
)
LINKED = ("README.md", "CONTRIBUTING.md", "docs/*.md")

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
    return sorted(p for pattern in LINKED for p in repo.glob(pattern) if p.is_file())


def test_no_file_points_into_the_shared_reference() -> None:
    found = outside_references(tracked_files(REPO), REPO)
    assert not found, (
        "these lines point outside the checkout (a clone has no ../shared); link the matching "
        "docs/ section instead:\n" + "\n".join(found)
    )


def test_every_relative_link_of_the_documents_resolves() -> None:
    documents = linked_documents(REPO)
    assert REPO / "docs" / "obmm-driver.md" in documents
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
        "c.md": "pinned copy in `shared/upstream/` (an input path, allowed)\n",
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
    assert [line.split(":")[0] for line in found] == ["a.md", "b.py", "d.py"]


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
    in_fence = False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else DIARY.search(CODE_SPAN.sub("", line))
        if match:
            problems.append(f"README.md:{number}: dated narrative {match.group(0)!r}")
    return problems


def test_readme_is_documentation_not_a_diary() -> None:
    assert readme_shape_problems((REPO / "README.md").read_text()) == []


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
