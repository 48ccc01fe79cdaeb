"""Checks for the URMA_SEG_MAPPED kernel patch series (``make patch-check``).

Run as ``python -m obmm.testbed.stages.patchcheck [--series-dir DIR] [--upstream DIR]``:
the checks of this module, no build and no guest (``obmm-testbed patch-check`` adds those, see
:mod:`obmm.testbed.stages.patchstage`).  Prints one line per check and patch: ``PASS``, ``FAIL`` or
``NOT RUN``, then a summary line, and exits 1 if anything failed.  Checks:

* ``mbox``: each file is a ``git format-patch`` mbox with a numbered
  ``[PATCH OLK-6.6 n/N]`` subject, and ``series`` lists the patches in order;
* ``header``: the openEuler header block opens the commit message (an
  ``... inclusion`` line, ``category:``, ``bugzilla:``, ``CVE:``, then a
  ``--------------------------------`` separator);
* ``trailers``: a ``Signed-off-by:`` trailer before the ``---`` line;
* ``checkpatch``: ``checkpatch.pl --strict`` reports nothing (the script comes
  from Debian's ``linux-source-6.1`` package, fetched once into a cache);
* ``base-commit``: the series names its base tree, equal to ``BASE``;
* ``baseline-apply``: the series applies without fuzz (``git apply``, which never fuzzes) to
  the files listed in ``BASE-FILES``, taken from the upstream tree, when they are the pinned
  versions;
* ``upstream-am``: ``git am --3way`` of the series on a scratch copy of the upstream tree
  (:func:`scratch_tree`); a hunk that does not apply is named.

The upstream tree is an input given by path (``--upstream``, else
:func:`obmm.testbed.paths.ub_upstream_dir`, ``$OBMM_UB_UPSTREAM``: a checkout of
kunpengcompute/ub-os-component-dkms at ``BASE``); not given, the steps that need it are skipped
with one line.
The module also makes the ready-to-send set (:func:`format_series`: ``git format-patch`` from
the scratch tree, the cover letter's text and a generated "Testing" block, recipients from the
tree's MAINTAINERS) and the series files that go with it (:func:`write_series_files`).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from obmm import envvars
from obmm.testbed import paths
from obmm.testbed.errors import TestbedError

SERIES_NAME = "urma-seg-mapped"
CHECKPATCH_PKG = "linux-source-6.1"
CHECKPATCH_FILES = ("checkpatch.pl", "spelling.txt", "const_structs.checkpatch")
# --no-tree: checkpatch cannot see MAINTAINERS, so it asks about every new file.
CHECKPATCH_IGNORE = "FILE_PATH_CHANGES"
SUBJECT_PREFIX = "PATCH OLK-6.6"
CATEGORIES = ("bugfix", "feature", "performance", "doc")
#: Files beside the patches: the list, the base commit, the pinned base files, the base tree.
SERIES_FILE = "series"
BASE_FILE = "BASE"
BASE_FILES_FILE = "BASE-FILES"
BASE_TREE_FILE = "BASE-TREE"
COVER_NAME = "0000-cover-letter.patch"
#: The scratch copy's one commit: fixed, so the same tree always gives the same commit id.
SCRATCH_IDENTITY = {
    "GIT_AUTHOR_NAME": "patch-check",
    "GIT_AUTHOR_EMAIL": "patch-check@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "patch-check",
    "GIT_COMMITTER_EMAIL": "patch-check@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}
#: What a sparse checkout of a git tree needs for the series, its build and MAINTAINERS.
SPARSE_DIRS = ("drivers/ub", "include/ub", "include/uapi/ub")
TESTING_HEADER = "Testing (obmm-testbed patch-check):"

FROM_LINE = re.compile(r"^From [0-9a-f]{40} Mon Sep 17 00:00:00 2001$")
SUBJECT = re.compile(r"^Subject: \[" + re.escape(SUBJECT_PREFIX) + r" (\d+)/(\d+)\] \S")
HEADER = (
    ("inclusion line", re.compile(r"^[A-Za-z][\w-]*( [\w-]+)* inclusion$")),
    ("category line", re.compile(r"^category: (" + "|".join(CATEGORIES) + r")$")),
    ("bugzilla line", re.compile(r"^bugzilla: https://\S+$")),
    ("CVE line", re.compile(r"^CVE: (NA|CVE-\d{4}-\d+)$")),
)
SEPARATOR = "-" * 32
SIGNOFF = re.compile(r"^Signed-off-by: [^<>]+ <[^<>@\s]+@[^<>\s]+>$")
BASE_COMMIT = re.compile(r"^base-commit: ([0-9a-f]{40})$", re.M)
HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
SHORTLOG = re.compile(r"^\S.* \(\d+\):$")


class CheckError(TestbedError):
    """A check could not be carried out (tool missing, fetch failed)."""


@dataclass
class Report:
    """Collects result lines; ``failed`` is true once any check failed."""

    lines: list[str] = field(default_factory=list)
    failed: bool = False
    quiet: bool = False  # collect only, print nothing

    def check(self, problem: str, check: str, subject: str) -> None:
        """PASS when ``problem`` is empty, else FAIL with it as the detail."""
        self.add("FAIL" if problem else "PASS", check, subject, problem)

    def add(self, status: str, check: str, subject: str, detail: str = "") -> None:
        if status == "FAIL":
            self.failed = True
        line = f"{status:<8}{check:<15}{subject}"
        self.lines.append(f"{line}: {detail}" if detail else line)
        if not self.quiet:
            print(self.lines[-1], flush=True)

    def note(self, text: str) -> None:
        """A line that is no check (a skipped stage, a figure)."""
        self.lines.append(text)
        if not self.quiet:
            print(text, flush=True)

    def counts(self) -> dict[str, int]:
        return {s: sum(ln.startswith(s) for ln in self.lines) for s in ("PASS", "FAIL", "NOT RUN")}


@dataclass
class Patch:
    path: Path
    text: str

    @property
    def name(self) -> str:
        return self.path.name

    def message(self) -> list[str]:
        """Commit message lines: after the mail headers, before ``---``."""
        lines = self.text.split("\n")
        try:
            start = lines.index("") + 1
        except ValueError:
            return []
        end = len(lines)
        for i in range(start, len(lines)):
            if lines[i] == "---":
                end = i
                break
        return lines[start:end]

    def hunks(self) -> list[tuple[str, str]]:
        """(file, ``@@ ... @@`` header line) of every hunk, in order."""
        found: list[tuple[str, str]] = []
        current = ""
        for line in self.text.split("\n"):
            if line.startswith("+++ "):
                current = line[4:].removeprefix("b/")
            elif HUNK.match(line):
                found.append((current, line))
        return found


def load_series(series_dir: Path) -> tuple[Patch | None, list[Patch]]:
    """The cover letter (if any) and the patches, from ``series`` or by name."""
    listing = series_dir / SERIES_FILE
    if listing.is_file():
        names = [n.strip() for n in listing.read_text().splitlines()]
        names = [n for n in names if n and not n.startswith("#")]
    else:
        names = sorted(p.name for p in series_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"))
        names = [n for n in names if not n.startswith("0000-")]
    patches = [Patch(series_dir / n, (series_dir / n).read_text()) for n in names]
    covers = sorted(series_dir.glob("0000-*.patch"))
    cover = Patch(covers[0], covers[0].read_text()) if covers else None
    return cover, patches


def check_mbox(patch: Patch, index: int, total: int) -> str:
    lines = patch.text.split("\n")
    if not lines or not FROM_LINE.match(lines[0]):
        return "first line is not a git format-patch 'From <sha1> Mon Sep 17 ...' line"
    heads = lines[: lines.index("")] if "" in lines else lines
    for name in ("From:", "Date:", "Subject:"):
        if not any(h.startswith(name + " ") for h in heads):
            return f"missing {name} header"
    subject = next(h for h in heads if h.startswith("Subject: "))
    m = SUBJECT.match(subject)
    if not m:
        return f"subject is not '[{SUBJECT_PREFIX} n/N] ...': {subject!r}"
    if (int(m.group(1)), int(m.group(2))) != (index, total):
        return f"subject numbered {m.group(1)}/{m.group(2)}, expected {index}/{total}"
    if index > 0 and ("\n---\n" not in patch.text or "\ndiff --git " not in patch.text):
        return "no '---' line and diff"
    tail = patch.text.rstrip("\n").split("\n")
    if len(tail) < 2 or tail[-2] != "-- ":
        return "does not end with the git signature block ('-- ' + version)"
    return ""


def check_header(patch: Patch) -> str:
    msg = patch.message()
    body = list(msg)
    i = 0
    while i < len(body) and body[i] == "":
        i += 1
    for what, rx in HEADER:
        if i >= len(body) or not rx.match(body[i]):
            got = body[i] if i < len(body) else "end of message"
            return f"missing {what} (got {got!r})"
        i += 1
    while i < len(body) and body[i] == "":
        i += 1
    if i >= len(body) or body[i] != SEPARATOR:
        return f"missing '{SEPARATOR}' separator after the header lines"
    if not any(ln.strip() for ln in body[i + 1 :] if not SIGNOFF.match(ln)):
        return "no description after the separator"
    return ""


def check_trailers(patch: Patch) -> str:
    msg = patch.message()
    if not any(SIGNOFF.match(ln) for ln in msg):
        return "no 'Signed-off-by: Name <email>' trailer"
    return ""


def _run(
    cmd: Sequence[str],
    cwd: Path | None = None,
    timeout: int = 600,
    env: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    proc = subprocess.run(
        list(cmd),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )
    return proc.returncode, proc.stdout


def _git(tree: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    """A git command in `tree` that must succeed: its output, stripped."""
    rc, out = _run(["git", "-C", str(tree), *args], env=env)
    if rc != 0:
        raise CheckError(f"git {' '.join(args)} in {tree} failed: {out.strip()[-300:]}")
    return out.strip()


def fetch_checkpatch(cache: Path | None = None) -> Path:
    """Path of checkpatch.pl, fetched from Debian's linux-source package once.

    ``OBMM_CHECKPATCH`` overrides the path.  Otherwise the script, spelling.txt
    and const_structs.checkpatch are extracted from ``linux-source-6.1`` (got
    with ``apt-get download``) into ``<cache>/checkpatch/``.  Idempotent.
    """
    env = envvars.CHECKPATCH.raw()
    if env:
        if not Path(env).is_file():
            raise CheckError(f"OBMM_CHECKPATCH={env} does not exist")
        return Path(env)
    dest = (cache or paths.cache_dir()) / "checkpatch"
    script = dest / "checkpatch.pl"
    if all((dest / f).is_file() for f in CHECKPATCH_FILES):
        return script
    for tool in ("apt-get", "dpkg-deb", "tar"):
        if shutil.which(tool) is None:
            raise CheckError(
                f"checkpatch.pl not cached in {dest} and {tool} is missing: install "
                f"Debian's {CHECKPATCH_PKG} or set OBMM_CHECKPATCH"
            )
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="checkpatch-") as tmp:
        rc, out = _run(["apt-get", "download", CHECKPATCH_PKG], cwd=Path(tmp))
        if rc != 0:
            _run(["apt-get", "update", "-qq"])
            rc, out = _run(["apt-get", "download", CHECKPATCH_PKG], cwd=Path(tmp))
        debs = sorted(Path(tmp).glob(f"{CHECKPATCH_PKG}_*.deb"))
        if rc != 0 or not debs:
            raise CheckError(f"apt-get download {CHECKPATCH_PKG} failed: {out.strip()[-300:]}")
        tarball = f"./usr/src/{CHECKPATCH_PKG}.tar.xz"
        rc, out = _run(
            [
                "sh",
                "-c",
                'dpkg-deb --fsys-tarfile "$1" | tar -x -C "$2" "$3"',
                "sh",
                str(debs[0]),
                tmp,
                tarball,
            ]
        )
        if rc != 0:
            raise CheckError(f"cannot unpack {debs[0].name}: {out.strip()[-300:]}")
        members = [f"{CHECKPATCH_PKG}/scripts/{f}" for f in CHECKPATCH_FILES]
        rc, out = _run(["tar", "-xJf", str(Path(tmp) / tarball), "-C", tmp, *members])
        if rc != 0:
            raise CheckError(f"cannot extract checkpatch from {tarball}: {out.strip()[-300:]}")
        for f in CHECKPATCH_FILES:
            shutil.copy2(Path(tmp) / CHECKPATCH_PKG / "scripts" / f, dest / f)
    return script


def run_checkpatch(script: Path, patch: Path) -> tuple[bool, str]:
    """checkpatch.pl --strict on one patch: (clean, first problem lines)."""
    if shutil.which("perl") is None:
        raise CheckError("perl is not installed")
    rc, out = _run(
        [
            "perl",
            str(script),
            "--strict",
            "--no-tree",
            "--terse",
            "--showfile",
            "--no-summary",
            "--ignore",
            CHECKPATCH_IGNORE,
            str(patch),
        ]
    )
    problems = [ln for ln in out.splitlines() if ln.strip()]
    return rc == 0 and not problems, "; ".join(problems[:3])


@dataclass
class BaseFile:
    path: str
    commit: str
    length: int
    pinned: int
    sha256: str


def read_base_files(series_dir: Path) -> list[BaseFile]:
    rows = []
    for line in (series_dir / BASE_FILES_FILE).read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        path, commit, length, pinned, digest = line.split("\t")
        rows.append(BaseFile(path, commit, int(length), int(pinned), digest))
    return rows


def check_baseline(series_dir: Path, baseline: Path, patches: list[Patch]) -> tuple[str, str]:
    """(status, detail) of applying the series to the pinned baseline files."""
    files = read_base_files(series_dir)
    missing = [f.path for f in files if not (baseline / f.path).is_file()]
    if missing:
        return "NOT RUN", f"baseline files not in {baseline} ({len(missing)} missing)"
    for f in files:
        text = (baseline / f.path).read_text()
        digest = hashlib.sha256(text[: f.pinned].encode()).hexdigest()
        if digest != f.sha256:
            return "FAIL", f"{f.path} differs from the version pinned in BASE-FILES"
    with tempfile.TemporaryDirectory(prefix="olk-baseline-") as tmp:
        work = Path(tmp)
        for f in files:
            (work / f.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(baseline / f.path, work / f.path)
        _run(["git", "init", "-q"], cwd=work)
        for p in patches:
            rc, out = _run(["git", "apply", "--check", "-v", str(p.path)], cwd=work)
            if rc == 0:
                rc, out = _run(["git", "apply", str(p.path)], cwd=work)
            if rc != 0:
                return "FAIL", f"{p.name} does not apply: {out.strip().splitlines()[-1:]}"
    return "PASS", f"{len(patches)} patches, {len(files)} pinned files"


# -- the upstream tree ------------------------------------------------------------------------


@dataclass(frozen=True)
class ScratchTree:
    """A private git copy of the upstream tree with the series' base checked out."""

    path: Path
    source: Path  # the upstream directory it was made from
    base: str  # the commit (in `path`) the series goes on
    tree_id: str  # git's tree object id of that commit: the same content, the same id
    commit: str  # the upstream commit this is, when known: BASE, or the git tree's own
    pinned: bool  # the content is the tree BASE-TREE pins

    def describe(self) -> str:
        what = f"{self.source.name} at {self.commit[:12]}" if self.commit else self.source.name
        how = "the pinned tree" if self.pinned else "not the pinned tree"
        return f"{what} (git tree {self.tree_id[:12]}, {how})"


def read_pin(series_dir: Path, name: str) -> str:
    """The one value a series file holds (``BASE``, ``BASE-TREE``), "" if it is absent."""
    path = series_dir / name
    return path.read_text().strip() if path.is_file() else ""


def scratch_tree(upstream: Path, dest: Path, series_dir: Path) -> ScratchTree:
    """Copy `upstream` into `dest` as a git repository at the series' base.

    A git checkout is cloned (shared objects, sparse: the UB directories and the top-level
    files) at ``BASE`` if it has that commit, else at its HEAD.  A plain directory (the pinned
    copy is a ``git archive`` of its commit) is copied and committed once with a fixed
    identity and date; it counts as ``BASE`` when its tree id is the one ``BASE-TREE`` pins.
    """
    if not upstream.is_dir():
        raise CheckError(f"upstream tree {upstream} is not a directory")
    base_pin = read_pin(series_dir, BASE_FILE)
    tree_pin = read_pin(series_dir, BASE_TREE_FILE)
    if dest.exists():
        shutil.rmtree(dest)
    rc, _ = _run(["git", "-C", str(upstream), "rev-parse", "--is-inside-work-tree"])
    if rc == 0 and (upstream / ".git").exists():
        _run_checked(["git", "clone", "-q", "--shared", "--no-checkout", str(upstream), str(dest)])
        rc, _ = _run(["git", "-C", str(dest), "cat-file", "-e", f"{base_pin}^{{commit}}"])
        rev = base_pin if base_pin and rc == 0 else "HEAD"
        _git(dest, "sparse-checkout", "set", *SPARSE_DIRS)
        _git(dest, "checkout", "-q", "--detach", rev)
        commit = _git(dest, "rev-parse", "HEAD")
    else:
        shutil.copytree(upstream, dest, symlinks=True)
        for dirpath, dirnames, filenames in os.walk(dest):
            for name in (*dirnames, *filenames):
                p = Path(dirpath) / name
                if not p.is_symlink():
                    p.chmod(p.stat().st_mode | stat.S_IWUSR)
        _git(dest, "init", "-q")
        _git(dest, "add", "-A", "-f")
        _git(dest, "commit", "-q", "--no-verify", "-m", f"{upstream.name}", env=SCRATCH_IDENTITY)
        commit = ""
    tree_id = _git(dest, "rev-parse", "HEAD^{tree}")
    pinned = bool(tree_pin) and tree_id == tree_pin
    if not commit and pinned:
        commit = base_pin
    return ScratchTree(dest, upstream, _git(dest, "rev-parse", "HEAD"), tree_id, commit, pinned)


def _run_checked(cmd: Sequence[str]) -> None:
    rc, out = _run(cmd)
    if rc != 0:
        raise CheckError(f"{' '.join(cmd)} failed: {out.strip()[-300:]}")


_AM_PATCH = re.compile(r"^Patch failed at (\d+) ", re.M)
_AM_HUNK = re.compile(r"^error: patch failed: (.+):(\d+)$", re.M)
_AM_CONFLICT = re.compile(r"^CONFLICT \([^)]*\): .* in (.+)$", re.M)


def apply_series(tree: ScratchTree, patches: Sequence[Patch]) -> str:
    """``git am --3way`` of the patches on the scratch tree: "" when all apply, else what did
    not, with the hunk named (``0003-x.patch: hunk '@@ -301,6 +302,23 @@ ...' of FILE``).
    A failed am is aborted, so the tree stays at its base."""
    ident = ["-c", "user.name=patch-check", "-c", "user.email=patch-check@localhost"]
    rc, out = _run(
        ["git", "-C", str(tree.path), *ident, "am", "--3way", "--committer-date-is-author-date"]
        + [str(p.path) for p in patches]
    )
    if rc == 0:
        return ""
    _run(["git", "-C", str(tree.path), "am", "--abort"])
    return describe_am_failure(out, patches)


def describe_am_failure(output: str, patches: Sequence[Patch]) -> str:
    """Name the patch and hunk `git am` stopped at, from its output."""
    m = _AM_PATCH.search(output)
    index = int(m.group(1)) if m else 0
    patch = patches[index - 1] if 0 < index <= len(patches) else None
    where = patch.name if patch else "the series"
    hunk = _AM_HUNK.search(output)
    if hunk and patch is not None:
        file, line = hunk.group(1), int(hunk.group(2))
        for hunk_file, header in patch.hunks():
            start = HUNK.match(header)
            if hunk_file == file and start and int(start.group(1)) == line:
                return f"{where}: hunk '{header}' of {file} does not apply"
        return f"{where}: the hunk at {file}:{line} does not apply"
    conflict = _AM_CONFLICT.search(output)
    if conflict:
        return f"{where}: 3-way merge conflict in {conflict.group(1)}"
    last = [ln for ln in output.strip().splitlines() if ln.startswith(("error:", "fatal:"))]
    return f"{where} does not apply: {(last or ['git am failed'])[-1]}"


def added_lines(tree: ScratchTree) -> dict[str, set[int]]:
    """{file: line numbers the series added} in the patched tree (new files: every line)."""
    out = _git(tree.path, "diff", "-U0", "--no-color", "--no-renames", tree.base, "HEAD")
    lines: dict[str, set[int]] = {}
    current = ""
    for line in out.splitlines():
        if line.startswith("+++ "):
            current = line[4:].removeprefix("b/")
        elif m := HUNK.match(line):
            start, count = int(m.group(2)), int(m.group(3) if m.group(3) is not None else 1)
            lines.setdefault(current, set()).update(range(start, start + count))
    lines.pop("/dev/null", None)
    return lines


def changed_files(tree: ScratchTree) -> tuple[list[str], list[str]]:
    """(files the series modifies, files it adds), paths relative to the tree."""
    out = _git(tree.path, "diff", "--name-status", "--no-renames", tree.base, "HEAD")
    modified: list[str] = []
    added: list[str] = []
    for line in out.splitlines():
        status, _, name = line.partition("\t")
        (added if status == "A" else modified).append(name)
    return modified, added


# -- recipients, as get_maintainer.pl finds them in MAINTAINERS --------------------------------


@dataclass(frozen=True)
class Recipients:
    to: tuple[str, ...]
    cc: tuple[str, ...]
    sections: tuple[str, ...]  # the MAINTAINERS entries that matched


def _pattern_matches(pattern: str, path: str) -> bool:
    if pattern.endswith("/"):
        return path.startswith(pattern)
    if fnmatch.fnmatchcase(path, pattern):
        # F: patterns do not cross directories with a wildcard (get_maintainer.pl).
        return "*" not in pattern or pattern.count("/") == path.count("/")
    return path.startswith(pattern.rstrip("/") + "/")


def maintainers(text: str, files: Iterable[str]) -> Recipients:
    """The To (M: maintainers) and Cc (R: reviewers, L: lists) of the MAINTAINERS entries whose
    F: patterns cover any of `files` and whose X: patterns do not exclude it."""
    to: list[str] = []
    cc: list[str] = []
    names: list[str] = []
    wanted = list(files)
    for block in re.split(r"\n\s*\n", text):
        lines = [ln.rstrip() for ln in block.splitlines() if ln.strip()]
        fields = [(ln[:1], ln[2:].strip()) for ln in lines if re.match(r"^[A-Z]:\s", ln)]
        title = next((ln for ln in lines if not re.match(r"^[A-Z]:\s", ln)), "")
        include = [v for k, v in fields if k == "F"]
        exclude = [v for k, v in fields if k == "X"]
        hit = any(
            any(_pattern_matches(p, f) for p in include)
            and not any(_pattern_matches(x, f) for x in exclude)
            for f in wanted
        )
        if not hit:
            continue
        names.append(title)
        for k, v in fields:
            address = v.split(" (", 1)[0].strip()
            if k == "M" and address not in to:
                to.append(address)
            elif k in ("R", "L") and address not in cc:
                cc.append(address)
    return Recipients(tuple(to), tuple(c for c in cc if c not in to), tuple(names))


# -- the ready-to-send set --------------------------------------------------------------------


def cover_text(cover: Patch) -> tuple[str, str]:
    """(subject, body) of a cover letter: the subject after its ``[PATCH ...]`` tag (unfolded),
    the body up to the shortlog, without a generated Testing block."""
    heads, _, rest = cover.text.partition("\n\n")
    subject = ""
    for line in re.split(r"\n(?=\S)", heads):
        if line.startswith("Subject: "):
            subject = re.sub(r"^Subject: \[[^\]]*\] ?", "", line.replace("\n", ""))
    body: list[str] = []
    for line in rest.split("\n"):
        if SHORTLOG.match(line):
            break
        body.append(line)
    return subject.strip(), strip_testing("\n".join(body)).strip("\n")


def strip_testing(body: str) -> str:
    """`body` without the generated Testing block (its header line to the next blank line)."""
    out: list[str] = []
    skipping = False
    for line in body.split("\n"):
        if line == TESTING_HEADER:
            skipping = True
        elif skipping and not line.strip():
            skipping = False
            continue
        if not skipping:
            out.append(line)
    return "\n".join(out)


def with_testing(body: str, testing: Sequence[str]) -> str:
    """`body` with the Testing block (header + `testing` lines) before its sign-off, if any."""
    lines = strip_testing(body).rstrip("\n").split("\n")
    block = [TESTING_HEADER, *testing, ""]
    at = len(lines)
    for i in range(len(lines) - 1, -1, -1):
        if SIGNOFF.match(lines[i]):
            at = i
            break
    return "\n".join([*lines[:at], *block, *lines[at:]]).rstrip("\n") + "\n"


def _author(patch: Patch) -> tuple[str, str]:
    m = re.search(r"^From: (.+?) <([^>]+)>$", patch.text, re.M)
    return (m.group(1), m.group(2)) if m else ("patch-check", "patch-check@localhost")


def format_series(
    tree: ScratchTree,
    cover: Patch,
    out: Path,
    *,
    testing: Sequence[str] | None,
    recipients: Recipients,
    base_commit: str,
) -> list[Path]:
    """``git format-patch --cover-letter`` of the applied series into `out` (emptied first):
    the cover letter's subject and body from `cover`, with the Testing block (none for None:
    the cover's own is dropped too, it no longer says what was tested), ``base-commit:``
    set to `base_commit`, To/Cc from `recipients`.  The files, cover letter first."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    name, email = _author(cover)
    argv = [
        "git", "-C", str(tree.path), "-c", f"user.name={name}", "-c", f"user.email={email}",
        "format-patch", "-q", "--cover-letter", f"--subject-prefix={SUBJECT_PREFIX}",
        f"--base={tree.base}", "-o", str(out),
    ]  # fmt: skip
    argv += [f"--to={a}" for a in recipients.to] + [f"--cc={a}" for a in recipients.cc]
    _run_checked([*argv, f"{tree.base}..HEAD"])
    files = sorted(out.glob("*.patch"))
    letter = out / COVER_NAME
    subject, body = cover_text(cover)
    text = letter.read_text()
    for placeholder, value in (
        ("*** SUBJECT HERE ***", subject),
        ("*** BLURB HERE ***", (with_testing(body, testing) if testing else body).rstrip("\n")),
    ):
        if placeholder not in text:
            raise CheckError(f"git format-patch's cover letter has no {placeholder!r}")
        text = text.replace(placeholder, value, 1)
    for f in files:
        f.write_text(BASE_COMMIT.sub(f"base-commit: {base_commit}", f.read_text()))
    letter.write_text(BASE_COMMIT.sub(f"base-commit: {base_commit}", text))
    return files


def write_series_files(tree: ScratchTree, out: Path, base_commit: str) -> None:
    """``series``, ``BASE``, ``BASE-TREE`` and ``BASE-FILES`` (every file the series modifies,
    whole, as the tree has it) beside a generated set, so `out` is a series directory."""
    names = sorted(p.name for p in out.glob("[0-9][0-9][0-9][0-9]-*.patch"))
    (out / SERIES_FILE).write_text("".join(f"{n}\n" for n in names if not n.startswith("0000-")))
    (out / BASE_FILE).write_text(base_commit + "\n")
    (out / BASE_TREE_FILE).write_text(tree.tree_id + "\n")
    modified, _added = changed_files(tree)
    rows = [
        "# Base of the URMA_SEG_MAPPED series: one line per file the series modifies.",
        "# Columns: path, commit the file was read at, length of that file version in",
        "# characters, number of leading characters pinned here, sha256 of those pinned",
        "# characters (UTF-8).  pinned == length: the whole file.  See ../README.md.",
        "# path\tcommit\tlength\tpinned\tsha256",
    ]
    for name in modified:
        text = subprocess.run(
            ["git", "-C", str(tree.path), "show", f"{tree.base}:{name}"],
            capture_output=True,
            check=True,
        ).stdout.decode()
        digest = hashlib.sha256(text.encode()).hexdigest()
        rows.append(f"{name}\t{base_commit}\t{len(text)}\t{len(text)}\t{digest}")
    (out / BASE_FILES_FILE).write_text("\n".join(rows) + "\n")


# -- the checks of this module ----------------------------------------------------------------


def run_static(series_dir: Path, baseline: Path | None, report: Report | None = None) -> Report:
    """Format, header, trailers, checkpatch, base-commit and baseline-apply of a series dir
    (baseline-apply against the upstream tree `baseline`; None: no line, see skip_line)."""
    report = report or Report()
    cover, patches = load_series(series_dir)
    if not patches:
        report.add("FAIL", "mbox", str(series_dir), "no patches found")
        return report
    total = len(patches)
    if cover is not None:
        report.check(check_mbox(cover, 0, total), "mbox", cover.name)
    for i, p in enumerate(patches, 1):
        report.check(check_mbox(p, i, total), "mbox", p.name)
    for p in patches:
        report.check(check_header(p), "header", p.name)
        report.check(check_trailers(p), "trailers", p.name)

    try:
        script = fetch_checkpatch()
        for p in patches:
            clean, detail = run_checkpatch(script, p.path)
            report.add("PASS" if clean else "FAIL", "checkpatch", p.name, detail)
    except (CheckError, OSError, subprocess.SubprocessError) as exc:
        report.add("FAIL", "checkpatch", "series", f"checkpatch.pl unavailable: {exc}")

    base = read_pin(series_dir, BASE_FILE)
    bases = {m for p in (cover, *patches) if p for m in BASE_COMMIT.findall(p.text)}
    if not re.fullmatch(r"[0-9a-f]{40}", base):
        report.add("FAIL", "base-commit", "series", "BASE does not hold a 40-hex commit id")
    elif not bases:
        report.add("FAIL", "base-commit", "series", "no 'base-commit:' line in the series")
    elif bases != {base}:
        report.add("FAIL", "base-commit", "series", f"base-commit {sorted(bases)} != BASE {base}")
    else:
        report.add("PASS", "base-commit", "series", base)

    if not (series_dir / BASE_FILES_FILE).is_file():
        report.add("FAIL", "baseline-apply", "series", "no BASE-FILES")
    elif baseline is None:
        pass  # no upstream tree: the caller says so once (skip_line)
    elif not baseline.is_dir():
        report.add("NOT RUN", "baseline-apply", "series", f"no upstream tree at {baseline}")
    else:
        status, detail = check_baseline(series_dir, baseline, patches)
        report.add(status, "baseline-apply", "series", detail)
    return report


def skip_line(upstream: Path | None) -> str:
    """The one line said when the upstream tree is not given or absent."""
    what = "not given" if upstream is None else f"{upstream} not found"
    return (
        f"NOT RUN upstream       {what}: baseline-apply, git am, build, KUnit and "
        f"format-patch skipped (--upstream DIR or ${envvars.UB_UPSTREAM.name})"
    )


def input_skip(upstream: Path | None) -> str:
    """The same, as the line ``make test`` lists at its end (noted there)."""
    return paths.note_input_skip(
        paths.input_skip_line(
            "patch-check (baseline-apply, git am, build, KUnit, format-patch)",
            "upstream UB driver tree",
            upstream,
            f"{paths.UB_UPSTREAM_HINT}, or UPSTREAM=DIR",
        )
    )


def given_tree(upstream: Path | None) -> Path | None:
    """`upstream` (``--upstream``), else the setting's; None when neither names a directory."""
    tree = upstream or paths.ub_upstream_dir()
    return tree if tree is not None and tree.is_dir() else None


def run_upstream_am(
    series_dir: Path, upstream: Path, work: Path, report: Report
) -> ScratchTree | None:
    """The upstream-am check: the scratch tree with the series applied, or None."""
    _, patches = load_series(series_dir)
    try:
        tree = scratch_tree(upstream, work, series_dir)
    except CheckError as exc:
        report.add("FAIL", "upstream-am", "series", str(exc))
        return None
    problem = apply_series(tree, patches)
    if problem:
        report.add("FAIL", "upstream-am", "series", problem)
        return None
    report.add("PASS", "upstream-am", "series", f"{len(patches)} patches on {tree.describe()}")
    return tree


def default_series_dir() -> Path:
    return paths.kmod_dir() / "patches" / SERIES_NAME


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``python -m obmm.testbed.stages.patchcheck`` (and the start of `obmm-testbed
    patch-check`'s)."""
    ap.add_argument("--series-dir", type=Path, default=default_series_dir())
    ap.add_argument(
        "--upstream",
        type=Path,
        default=None,
        help=f"upstream UB driver tree (default ${envvars.UB_UPSTREAM.name}; not given: the "
        "steps that need it are skipped, saying so)",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`obmm-testbed patch-check` where the testbed cannot load: this module's checks only."""
    p = sub.add_parser("patch-check", help="check the URMA_SEG_MAPPED series (no build, no guest)")
    add_arguments(p)
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    """This module's checks, one line each, and a summary; 1 if one failed.  A series directory
    that is not there is a CheckError (there is nothing to check)."""
    if not args.series_dir.is_dir():
        raise CheckError(f"{args.series_dir}: no such series directory")
    upstream = given_tree(args.upstream)
    report = run_static(args.series_dir, upstream)
    if upstream is not None:
        with tempfile.TemporaryDirectory(prefix="patch-check-") as tmp:
            run_upstream_am(args.series_dir, upstream, Path(tmp) / "tree", report)
    else:
        report.note(skip_line(args.upstream or paths.ub_upstream_dir()))
        input_skip(args.upstream or paths.ub_upstream_dir())
    print_summary(report)
    return 1 if report.failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m obmm.testbed.stages.patchcheck", description=__doc__
    )
    add_arguments(ap)
    try:
        return command(ap.parse_args(argv))
    except CheckError as exc:
        print(f"patch-check: error: {exc}", file=sys.stderr)
        return 2


def print_summary(report: Report) -> None:
    counts = report.counts()
    print(
        f"patch-check: {counts['PASS']} passed, {counts['FAIL']} failed, "
        f"{counts['NOT RUN']} not run"
    )


if __name__ == "__main__":
    sys.exit(main())
