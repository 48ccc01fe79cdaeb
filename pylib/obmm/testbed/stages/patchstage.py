"""`obmm-testbed patch-check`: the URMA_SEG_MAPPED series from its files to KUnit results.

1. The series' own checks (:func:`obmm.testbed.stages.patchcheck.run_static`: mbox form, openEuler
   header, sign-off, ``checkpatch.pl --strict``, ``base-commit``, the pinned base files).
2. ``git am --3way`` on a scratch copy of the upstream tree (``--upstream``, default the pinned
   copy; absent: one line, and steps 2-5 are skipped); a hunk that does not apply is named.
3. ubcore.ko and uburma.ko of the patched tree built against the guest kernel's headers
   (:mod:`obmm.testbed.builds.urmabuild`), with kunit.ko and kunit_run.ko made for that kernel
   (:mod:`obmm.testbed.builds.kunitbuild`); upstream's warnings counted, the series' fatal.
4. In a guest (``--no-guest`` skips it): the series' KUnit suites run
   (:mod:`obmm.testbed.stages.kunitguest`), the KTAP output parsed on the host into one result per
   case (:mod:`obmm.tools.ktap`), held against the cases the series' test sources declare:
   ``kunit: N/N passed``, and any failed, skipped or missing case fails the stage.
5. The ready-to-send set in ``results/patch-check/outgoing/``: ``git format-patch`` of the
   applied series, the cover letter's text with a generated Testing block, To/Cc from the
   tree's MAINTAINERS when it has one, checked again (checkpatch included) and written with the
   series files beside it; ``--refresh`` copies it over the series directory once all passed.

Results: ``results/patch-check/`` (build log, kunit kernel log, the set) and
``results/patch-check-junit.xml`` (one test case per KUnit case).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from obmm import envvars
from obmm.testbed import paths
from obmm.testbed.builds import kbuild, kheaders, kunitbuild, urmabuild
from obmm.testbed.builds.image import Image, ensure_image, find_recipe
from obmm.testbed.progress import Progress
from obmm.testbed.settings import Settings
from obmm.testbed.stages import kunitguest
from obmm.testbed.stages import patchcheck as pc
from obmm.tools import ktap, logscan

OUT_NAME = "patch-check"
JUNIT_NAME = "patch-check-junit.xml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pc.add_arguments(parser)
    parser.add_argument(
        "--no-guest", action="store_true", help="build, but do not boot a guest for KUnit"
    )
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="when everything passed, copy the generated set over the series directory",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "patch-check",
        help="check the URMA_SEG_MAPPED series: format, apply, build, KUnit in a guest",
    )
    add_arguments(p)
    p.set_defaults(func=command)


def test_sources(tree: pc.ScratchTree) -> list[str]:
    """``suite.case`` of every KUnit case in the files the series adds."""
    _modified, added = pc.changed_files(tree)
    names: list[str] = []
    for rel in added:
        if rel.endswith(".c"):
            names += ktap.declared_cases((tree.path / rel).read_text(errors="replace"))
    return names


def write_junit(path: Path, cases: Sequence[ktap.Case], expected: Sequence[str]) -> None:
    """One <testcase> per expected KUnit case (a missing one is a failure)."""
    got = {c.name: c for c in cases}
    names = list(expected) + [c.name for c in cases if c.name not in expected]
    suite = ET.Element("testsuite", name="kunit", tests=str(len(names)))
    failures = 0
    for name in names:
        classname, _, case_name = name.rpartition(".")
        tc = ET.SubElement(suite, "testcase", classname=f"kunit.{classname}", name=case_name)
        case = got.get(name)
        if case is None:
            ET.SubElement(tc, "failure", message="no result (missing)")
            failures += 1
        elif case.status == ktap.FAIL:
            ET.SubElement(tc, "failure", message="not ok").text = case.detail
            failures += 1
        elif case.status == ktap.SKIP:
            ET.SubElement(tc, "skipped", message=case.detail)
    suite.set("failures", str(failures))
    path.parent.mkdir(parents=True, exist_ok=True)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="unicode")


def testing_lines(
    tree: pc.ScratchTree,
    release: str,
    headers_version: str,
    built: urmabuild.UrmaModules,
    kunit: kunitbuild.KunitModules,
    verdict: ktap.Verdict | None,
    run: kunitguest.GuestRun | None,
    checkpatch_clean: int,
    patches: int,
) -> list[str]:
    """The cover letter's Testing block: tree, kernel, build, KUnit, checkpatch."""
    commit = f"at {tree.commit[:12]}" if tree.commit else "(commit unknown)"
    guest = f", QEMU guest ({run.accel})" if run is not None else ""
    lines = [
        f"  tree:       {tree.source.name} {commit} (git tree {tree.tree_id[:12]})",
        f"  kernel:     Debian {release} (headers {headers_version}), x86_64{guest}",
        "  build:      ubcore.ko and uburma.ko out of tree, W=1: "
        f"{built.count(urmabuild.SERIES)} warnings in",
        "              the series' lines; the tree's own: ubcore "
        f"{built.count(urmabuild.UPSTREAM, 'ubcore')}, uburma "
        f"{built.count(urmabuild.UPSTREAM, 'uburma')}",
    ]
    if verdict is not None:
        suites = sorted({n.rpartition(".")[0] for n in verdict.expected})
        lines.append(f"  KUnit:      {', '.join(suites)}: {verdict.summary()} (kunit.ko")
        lines.append(f"              out of tree from {kunit.source})")
    else:
        lines.append("  KUnit:      not run")
    lines.append(f"  checkpatch: --strict, {checkpatch_clean}/{patches} patches clean")
    return lines


def command(args: argparse.Namespace) -> int:
    """Every step, one line per check; 1 if any failed (a missing tree is no failure)."""
    series_dir: Path = args.series_dir
    if not series_dir.is_dir():
        raise pc.CheckError(f"{series_dir}: no such series directory")
    upstream = pc.given_tree(args.upstream)
    report = pc.Report()
    started = time.monotonic()
    pc.run_static(series_dir, upstream, report)
    if upstream is None:
        report.note(pc.skip_line(args.upstream or paths.ub_upstream_dir()))
        pc.input_skip(args.upstream or paths.ub_upstream_dir())
        pc.print_summary(report)
        return 1 if report.failed else 0
    out = paths.results_dir() / OUT_NAME
    for stale in (out / "outgoing", out / "build"):
        shutil.rmtree(stale, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="patch-check-") as tmp:
        tree = pc.run_upstream_am(series_dir, upstream, Path(tmp) / "tree", report)
        if tree is not None:
            _build_test_and_format(args, series_dir, upstream, tree, out, report)
    report.note(f"patch-check: stage took {time.monotonic() - started:.0f} s")
    pc.print_summary(report)
    return 1 if report.failed else 0


def _build_test_and_format(
    args: argparse.Namespace,
    series_dir: Path,
    upstream: Path,
    tree: pc.ScratchTree,
    out: Path,
    report: pc.Report,
) -> None:
    progress = Progress("patch-check")
    settings = Settings.from_env()
    if not args.no_guest and settings.kernel != "debian":
        report.add(
            "FAIL", "build", "series",
            f"the guests would boot a kernel of our own build ({envvars.KERNEL.name}="
            f"{settings.kernel}); the KUnit stage runs on Debian's",
        )  # fmt: skip
        return
    image = None if args.no_guest else ensure_image(find_recipe(settings.recipe), progress=progress)
    release = image.kernel_release if image is not None else kheaders.debian_kernel_release()
    headers = kheaders.fetch_headers(release)
    headers_version = kheaders.headers_version(release)
    build_dir = out / "build"
    try:
        kunit = kunitbuild.build(headers, release, build_dir, progress)
    except (kunitbuild.KunitBuildError, kbuild.KbuildError) as exc:
        report.add("FAIL", "build", "kunit.ko", exc.summary)
        return
    report.add(
        "PASS", "build", "kunit.ko",
        f"from {kunit.source} for {release}: {len(kunit.warnings)} warnings (Debian's)",
    )  # fmt: skip
    report.add("PASS", "build", "kunit_run.ko", "W=1, no warnings")
    try:
        built = urmabuild.build(
            tree.path, headers, release, kunit.symvers, pc.added_lines(tree), build_dir
        )
    except urmabuild.UrmaBuildError as exc:
        report.add("FAIL", "build", "ubcore, uburma", exc.summary)
        return
    for module in urmabuild.MODULES:
        flags = ", ".join(
            f"{flag} {n}" for flag, n in built.by_flag(urmabuild.UPSTREAM, module).items()
        )
        report.add(
            "PASS", "build", f"{module}.ko",
            f"W=1: 0 in the series' lines, 0 in compat; upstream's: "
            f"{built.count(urmabuild.UPSTREAM, module)} ({flags or 'none'})",
        )  # fmt: skip
    expected = test_sources(tree)
    verdict: ktap.Verdict | None = None
    run: kunitguest.GuestRun | None = None
    if image is None:
        report.add("NOT RUN", "kunit", "series", "--no-guest")
    elif not expected:
        report.add("FAIL", "kunit", "series", "the series adds no KUnit case")
    else:
        verdict, run = _kunit(image, kunit, built, expected, out, report, progress)
    patches = pc.load_series(series_dir)[1]
    clean = sum(1 for ln in report.lines if ln.startswith("PASS    checkpatch"))
    testing = testing_lines(
        tree, release, headers_version, built, kunit, verdict, run, clean, len(patches)
    )
    _format(args, series_dir, upstream, tree, out, testing, report)


def _kunit(
    image: Image,
    kunit: kunitbuild.KunitModules,
    built: urmabuild.UrmaModules,
    expected: list[str],
    out: Path,
    report: pc.Report,
    progress: Progress,
) -> tuple[ktap.Verdict | None, kunitguest.GuestRun | None]:
    kos = [kunit.kunit, built.kos["ubcore"], built.kos["uburma"], kunit.runner]
    guest = urmabuild.stripped(kos, out / "build" / "guest")
    try:
        count = kunitguest.suite_count(built.kos["ubcore"])
        run = kunitguest.run(
            image,
            guest[0],
            guest[1:3],
            guest[3],
            "ubcore",
            count,
            name=f"patch-check-{os.getpid()}",
            progress=progress,
        )
    except kunitguest.KunitGuestError as exc:
        report.add("FAIL", "kunit", "series", exc.summary)
        (out / "kunit-error.txt").write_text(str(exc))
        return None, None
    (out / "kunit-dmesg.txt").write_text(run.log)
    doc = ktap.parse(run.log)
    verdict = ktap.verdict(doc, expected)
    cases = ktap.cases(doc)
    for case in cases:
        status = {ktap.PASS: "PASS", ktap.FAIL: "FAIL", ktap.SKIP: "FAIL"}[case.status]
        detail = "skipped: " + case.detail if case.status == ktap.SKIP else ""
        if case.status == ktap.FAIL:
            detail = " | ".join(case.detail.splitlines()[-6:])
        report.add(status, "kunit", case.name, detail)
    for name in verdict.missing:
        report.add("FAIL", "kunit", name, "no result")
    write_junit(paths.results_dir() / JUNIT_NAME, cases, expected)
    if run.reports:
        path = out / "kunit-kernel-reports.txt"
        path.write_text(logscan.format_reports(run.reports))
        first = run.reports[0]
        report.add(
            "FAIL", "kernel-log", "guest",
            f"{len(run.reports)} report(s), the first: {first.kind}: {first.title} (all: {path})",
        )  # fmt: skip
    else:
        report.add("PASS", "kernel-log", "guest", f"no kernel report, {run.release}")
    report.note(f"kunit: {verdict.summary()}")
    if not verdict.ok:
        report.add("FAIL", "kunit", "series", verdict.summary())
    return verdict, run


def _format(
    args: argparse.Namespace,
    series_dir: Path,
    upstream: Path,
    tree: pc.ScratchTree,
    out: Path,
    testing: list[str],
    report: pc.Report,
) -> None:
    cover, _ = pc.load_series(series_dir)
    if cover is None:
        report.add("FAIL", "format-patch", "series", "no cover letter to take the text from")
        return
    maintainers = tree.path / "MAINTAINERS"
    if maintainers.is_file():
        modified, added = pc.changed_files(tree)
        recipients = pc.maintainers(maintainers.read_text(errors="replace"), modified + added)
        who = f"To: {', '.join(recipients.to) or '-'}; Cc: {', '.join(recipients.cc) or '-'}"
    else:
        recipients = pc.Recipients((), (), ())
        who = f"no MAINTAINERS in {tree.source.name}: no To/Cc"
    base = tree.commit or pc.read_pin(series_dir, pc.BASE_FILE)
    outgoing = out / "outgoing"
    files = pc.format_series(
        tree, cover, outgoing, testing=testing, recipients=recipients, base_commit=base
    )
    pc.write_series_files(tree, outgoing, base)
    check = pc.run_static(outgoing, upstream, pc.Report(quiet=True))
    problems = [ln for ln in check.lines if not ln.startswith("PASS")]
    if problems:
        report.add("FAIL", "format-patch", str(outgoing), "; ".join(problems)[:2000])
        return
    report.add("PASS", "format-patch", str(outgoing), f"{len(files)} files checked again; {who}")
    if args.refresh:
        if report.failed:
            report.note(f"patch-check: --refresh: not done, a check failed ({series_dir} kept)")
            return
        for old in series_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"):
            old.unlink()
        for f in outgoing.iterdir():
            shutil.copy2(f, series_dir / f.name)
        report.note(f"patch-check: --refresh: {series_dir} now holds the generated set")
