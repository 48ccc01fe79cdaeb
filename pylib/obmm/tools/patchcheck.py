"""Checks for the URMA_SEG_MAPPED kernel patch series (``make patch-check``).

Run as ``python -m obmm.tools.patchcheck [--series-dir DIR] [--ksrc DIR] [--baseline DIR]``.
Prints one line per check and patch: ``PASS``, ``FAIL`` or ``NOT RUN``, then a
summary line, and exits 1 if anything failed.  Checks:

* ``mbox``: each file is a ``git format-patch`` mbox with a numbered
  ``[PATCH OLK-6.6 n/N]`` subject, and ``series`` lists the patches in order;
* ``header``: the openEuler header block opens the commit message (an
  ``... inclusion`` line, ``category:``, ``bugzilla:``, ``CVE:``, then a
  ``--------------------------------`` separator);
* ``trailers``: a ``Signed-off-by:`` trailer before the ``---`` line;
* ``checkpatch``: ``checkpatch.pl --strict`` reports nothing (the script comes
  from Debian's ``linux-source-6.1`` package, fetched once into a cache);
* ``base-commit``: the series names its base tree, equal to ``BASE``;
* ``baseline-apply``: the series applies without fuzz (``git apply``, which
  never fuzzes) to the pinned baseline files listed in ``BASE-FILES``, when
  they are in the cache (``<cache>/olk-baseline``, see :mod:`obmm.testbed.paths`) or ``--baseline``;
* ``ksrc-am`` and ``ksrc-build``: with ``--ksrc``, ``git am`` on a worktree of
  that openEuler kernel tree at ``BASE`` and an arm64 build of the touched
  objects.  Without ``--ksrc`` they are reported as NOT RUN.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
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
# arm64 objects built for ksrc-build, one per touched .c file of the series.
BUILD_OBJECTS = (
    "drivers/ub/urma/uburma/uburma_cmd.o",
    "drivers/ub/urma/ubcore/ubcore_segment.o",
    "drivers/ub/urma/ubcore/ubcore_seg_map.o",
    "drivers/ub/urma/ubcore/ubcore_seg_map_test.o",
)


class CheckError(TestbedError):
    """A check could not be carried out (tool missing, fetch failed)."""


@dataclass
class Report:
    """Collects result lines; ``failed`` is true once any check failed."""

    lines: list[str] = field(default_factory=list)
    failed: bool = False

    def check(self, problem: str, check: str, subject: str) -> None:
        """PASS when ``problem`` is empty, else FAIL with it as the detail."""
        self.add("FAIL" if problem else "PASS", check, subject, problem)

    def add(self, status: str, check: str, subject: str, detail: str = "") -> None:
        if status == "FAIL":
            self.failed = True
        line = f"{status:<8}{check:<15}{subject}"
        self.lines.append(f"{line}: {detail}" if detail else line)
        print(self.lines[-1], flush=True)


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


def load_series(series_dir: Path) -> tuple[Patch | None, list[Patch]]:
    """The cover letter (if any) and the patches, from ``series`` or by name."""
    listing = series_dir / "series"
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


def _run(cmd: list[str], cwd: Path | None = None, timeout: int = 600) -> tuple[int, str]:
    proc = subprocess.run(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout


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
    for line in (series_dir / "BASE-FILES").read_text().splitlines():
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


def check_ksrc(ksrc: Path, base: str, patches: list[Patch], report: Report) -> None:
    """git am on a worktree of ``ksrc`` at ``base``, then build for arm64."""
    with tempfile.TemporaryDirectory(prefix="olk-worktree-") as tmp:
        tree = Path(tmp) / "tree"
        rc, out = _run(["git", "-C", str(ksrc), "worktree", "add", "--detach", str(tree), base])
        if rc != 0:
            report.add("FAIL", "ksrc-am", "series", f"no worktree at {base}: {out.strip()[-200:]}")
            report.add("NOT RUN", "ksrc-build", "series", "git am failed")
            return
        try:
            ident = ["-c", "user.name=patch-check", "-c", "user.email=patch-check@localhost"]
            rc, out = _run(["git", *ident, "am", "-q", *(str(p.path) for p in patches)], tree)
            if rc != 0:
                report.add("FAIL", "ksrc-am", "series", out.strip()[-300:])
                report.add("NOT RUN", "ksrc-build", "series", "git am failed")
                return
            report.add("PASS", "ksrc-am", "series", f"{len(patches)} patches on {base[:12]}")
            cross = os.environ.get("CROSS_COMPILE", "aarch64-linux-gnu-")
            if shutil.which(cross + "gcc") is None:
                report.add("FAIL", "ksrc-build", "series", f"{cross}gcc not found")
                return
            make = ["make", "-s", "ARCH=arm64", f"CROSS_COMPILE={cross}", f"-j{os.cpu_count()}"]
            steps = [
                [*make, "defconfig"],
                [
                    "scripts/config",
                    *("-m", "UB", "-e", "KUNIT", "-e", "UB_URMA_SEG_MAP_KUNIT_TEST"),
                ],
                [*make, "olddefconfig"],
                [*make, *BUILD_OBJECTS],
            ]
            for cmd in steps:
                rc, out = _run(cmd, tree, timeout=3600)
                if rc != 0:
                    report.add("FAIL", "ksrc-build", "series", f"{cmd[-1]}: {out.strip()[-300:]}")
                    return
            report.add("PASS", "ksrc-build", "series", ", ".join(BUILD_OBJECTS))
        finally:
            _run(["git", "-C", str(ksrc), "worktree", "remove", "--force", str(tree)])


def run(series_dir: Path, ksrc: Path | None, baseline: Path | None) -> Report:
    report = Report()
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

    base_file = series_dir / "BASE"
    base = base_file.read_text().strip() if base_file.is_file() else ""
    bases = {m for p in (cover, *patches) if p for m in BASE_COMMIT.findall(p.text)}
    if not re.fullmatch(r"[0-9a-f]{40}", base):
        report.add("FAIL", "base-commit", "series", "BASE does not hold a 40-hex commit id")
    elif not bases:
        report.add("FAIL", "base-commit", "series", "no 'base-commit:' line in the series")
    elif bases != {base}:
        report.add("FAIL", "base-commit", "series", f"base-commit {sorted(bases)} != BASE {base}")
    else:
        report.add("PASS", "base-commit", "series", base)

    if (series_dir / "BASE-FILES").is_file():
        status, detail = check_baseline(
            series_dir, baseline or paths.cache_dir() / "olk-baseline", patches
        )
        report.add(status, "baseline-apply", "series", detail)
    else:
        report.add("FAIL", "baseline-apply", "series", "no BASE-FILES")

    if ksrc is None:
        report.add("NOT RUN", "ksrc-am", "series", "no KSRC given")
        report.add("NOT RUN", "ksrc-build", "series", "no KSRC given")
    elif not re.fullmatch(r"[0-9a-f]{40}", base):
        report.add("NOT RUN", "ksrc-am", "series", "no valid BASE")
        report.add("NOT RUN", "ksrc-build", "series", "no valid BASE")
    else:
        check_ksrc(ksrc, base, patches, report)
    return report


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of `obmm-testbed patch-check` (and of ``python -m obmm.tools.patchcheck``)."""
    ap.add_argument("--series-dir", type=Path, default=paths.kmod_dir() / "patches" / SERIES_NAME)
    ap.add_argument("--ksrc", type=Path, help="openEuler kernel git tree (OLK-6.6)")
    ap.add_argument("--baseline", type=Path, help="directory with the BASE-FILES versions")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("patch-check", help="check the URMA_SEG_MAPPED patch series")
    add_arguments(p)
    p.set_defaults(func=command)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m obmm.tools.patchcheck", description=__doc__)
    add_arguments(ap)
    try:
        return command(ap.parse_args(argv))
    except CheckError as exc:
        print(f"patch-check: error: {exc}", file=sys.stderr)
        return 2


def command(args: argparse.Namespace) -> int:
    """Every check, one line each, and a summary; 1 if a check failed.  A series directory
    that is not there is a CheckError (there is nothing to check)."""
    if not args.series_dir.is_dir():
        raise CheckError(f"{args.series_dir}: no such series directory")
    report = run(args.series_dir, args.ksrc, args.baseline)
    counts = {s: sum(ln.startswith(s) for ln in report.lines) for s in ("PASS", "FAIL", "NOT RUN")}
    print(
        f"patch-check: {counts['PASS']} passed, {counts['FAIL']} failed, "
        f"{counts['NOT RUN']} not run"
    )
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
