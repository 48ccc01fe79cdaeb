"""`obmm-testbed kmod` (and ``python -m obmm.testbed.cli.kmod``): resolve the guest kernel's
release, fetch its headers, build every module of ``kmod/`` (or the real driver), pre-flight each
``.ko`` (:mod:`obmm.testbed.builds.elfcheck`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from obmm import envvars
from obmm.testbed import paths
from obmm.testbed.builds import kbuild, kheaders
from obmm.testbed.builds.kheaders import KbuildError

DESCRIPTION = "Build kmod/* against Debian kernel headers and pre-flight the .ko files."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `obmm-testbed kmod` (and of ``python -m obmm.testbed.cli.kmod``)."""
    parser.add_argument(
        "--release", help="kernel release (default: what linux-image-ARCH depends on)"
    )
    parser.add_argument("--arch", default="amd64", help="Debian arch of the guest (default amd64)")
    parser.add_argument(
        "--suite",
        default=kheaders.DEFAULT_SUITE,
        help=f"Debian suite (default {kheaders.DEFAULT_SUITE})",
    )
    parser.add_argument(
        "--out", type=Path, help="where the .ko files go (default results/kmod/RELEASE)"
    )
    parser.add_argument("--kmod", type=Path, default=paths.kmod_dir(), help="module sources")
    parser.add_argument(
        "--cache", type=Path, help="headers cache (default ~/.cache/obmm-testbed/kheaders)"
    )
    parser.add_argument(
        "--module", action="append", dest="modules", help="build only this module dir (repeatable)"
    )
    parser.add_argument("--no-werror", action="store_true", help="report warnings but do not fail")
    parser.add_argument(
        "--driver",
        choices=kbuild.DRIVERS,
        help="emu: kmod/*; real: upstream's obmm.ko over kmod/ub_compat, into "
        f"results/kmod-real/RELEASE (default ${envvars.DRIVER.name}, else emu)",
    )
    parser.add_argument(
        "--upstream",
        type=Path,
        help="upstream UB driver tree for --driver real (default "
        f"${envvars.UB_UPSTREAM.name}; not given: the real driver is skipped, saying so)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="skip the build when the .ko files in the output are of these very sources",
    )


def command(args: argparse.Namespace) -> int:
    """Resolve the release, fetch headers, build all modules, pre-flight each .ko.

    Raises KbuildError when a step cannot be done; returns 1 when a .ko fails the pre-flight.
    """
    from obmm.testbed.builds import elfcheck  # deferred: the library part must not need pyelftools

    t0 = time.monotonic()
    real = (getattr(args, "driver", None) or envvars.DRIVER.get()) == kbuild.DRIVER_REAL
    upstream = None
    if real:
        try:
            upstream = kbuild.check_upstream(args.upstream or paths.ub_upstream_dir())
        except kbuild.UpstreamMissing as exc:
            print(paths.note_input_skip(f"kbuild --driver real: skipped: {exc}"))
            return 0
    release = args.release or kheaders.debian_kernel_release(args.arch, args.suite)
    headers = kheaders.fetch_headers(release, args.arch, args.cache, suite=args.suite)
    t1 = time.monotonic()
    out = args.out or paths.results_dir() / ("kmod-real" if real else "kmod") / release
    # Only a whole build that allows no warning is what the testbed's own builds would make.
    full = not args.modules and not args.no_werror
    if upstream is not None:
        digest = kbuild.real_sources_digest(release, args.kmod, upstream) if full else ""
    else:
        digest = kbuild.sources_digest(release, args.kmod) if full else ""
    reused = kbuild.reusable_build(out, digest) if full and args.reuse else None
    print(f"kbuild: headers {release} ready in {t1 - t0:.1f}s: {headers}")
    if reused is not None:
        kos = reused
        print(f"kbuild: modules unchanged since their last build, reusing {out}")
    else:
        try:
            if upstream is not None:
                kos = kbuild.build_real_driver(headers, args.kmod, upstream, out)
                warned = (out / kbuild.UPSTREAM_WARNINGS).read_text().splitlines()
                print(
                    f"kbuild: upstream obmm.ko from {upstream}: {len(warned)} upstream warning(s)"
                )
                for line in warned:
                    print(f"  {line}")
            else:
                kos = kbuild.build_modules(
                    headers,
                    args.kmod,
                    out,
                    warnings_as_errors=not args.no_werror,
                    modules=args.modules,
                )
        except kbuild.BuildWarningsError as exc:
            # The warnings are the command's output; the error after them is their count.
            print(exc.output, file=sys.stderr)
            raise KbuildError(exc.summary) from exc
        if full:
            kbuild.record_build(out, digest, kos)
        print(f"kbuild: built {len(kos)} module(s) in {time.monotonic() - t1:.1f}s into {out}")

    symvers = elfcheck.Symvers.load(headers / "Module.symvers")
    exports = {sym for ko in kos for sym in elfcheck.module_exports(ko)}
    failed = 0
    for ko in kos:
        t = time.monotonic()
        problems = elfcheck.check_module(
            ko, kernel_release=release, arch=args.arch, symvers_path=symvers, extra_exports=exports
        )
        ms = (time.monotonic() - t) * 1000
        if problems:
            failed += 1
            print(f"elfcheck: {ko.name}: FAIL ({ms:.0f} ms)")
            for problem in problems:
                print(f"  {problem}")
        else:
            print(f"elfcheck: {ko.name}: ok ({ms:.0f} ms)")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m obmm.testbed.cli.kmod``: `obmm-testbed kmod` with its own error printing."""
    parser = argparse.ArgumentParser(
        prog="python -m obmm.testbed.cli.kmod", description=DESCRIPTION
    )
    add_arguments(parser)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="kbuild: %(message)s"
    )
    try:
        return command(args)
    except KbuildError as exc:
        print(f"kbuild: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
