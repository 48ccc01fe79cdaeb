"""The `obmm-testbed` command line: one entry point, subcommands registered by the modules.

A testbed failure (any :class:`obmm.testbed.errors.TestbedError`) ends the command with one line,
``obmm-testbed: <what failed>``, on stderr and exit status 2; ``-v`` adds the detail.  SIGTERM
unwinds like Ctrl-C (every ``finally`` runs: clusters stopped, scratch removed), then the
command says so in one line and exits 130.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from obmm import __version__
from obmm.testbed.errors import EXIT_TESTBED_ERROR, TestbedError
from obmm.tools import interrupts

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="obmm-testbed",
        description="Testbed for code written against openEuler's OBMM UAPI.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    # Each concern registers its own subcommands; a registrar adds parsers
    # whose defaults carry `func(args) -> int`.
    from obmm.bench import cli as bench_cli
    from obmm.tools import abi_cli, handle_cli

    abi_cli.register(sub)
    handle_cli.register(sub)
    bench_cli.register(sub)
    # Always registered: a command whose optional dependency is missing says so when run.
    from obmm.testbed.cli import commands as testbed_commands

    testbed_commands.register(sub)
    return parser


def _reap() -> None:
    """What owners that died (SIGKILL, OOM) left behind goes first, whatever the command."""
    from obmm.testbed.vm.ownership import reap_scratch
    from obmm.testbed.vm.reaping import reap_dead_owners

    for name in reap_dead_owners():
        log.info("cluster %s: its owner died; its run directory was removed", name)
    for path in reap_scratch():
        log.info("%s: its owner died; removed", path)


#: The pyproject extra that brings each optional package.
EXTRAS = {"pytest": "test", "hypothesis": "test", "matplotlib": "bench"}


def missing_dependency(exc: ModuleNotFoundError, command: str) -> str:
    """One line naming the package a command needs and how to install it."""
    package = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(package)
    how = f"pip install 'obmm-testbed[{extra}]'" if extra else f"pip install {package}"
    return f"obmm-testbed {command}: needs the Python package {package!r} ({how})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command not in ("gc", "doctor"):  # those two say what they removed
            _reap()
        result = interrupts.run_unwinding("obmm-testbed", lambda: int(args.func(args)))
    except ModuleNotFoundError as exc:
        print(missing_dependency(exc, str(args.command)), file=sys.stderr)
        return EXIT_TESTBED_ERROR
    except TestbedError as exc:
        detail = str(exc).strip().splitlines()[1:]
        if detail:
            log.debug("%s", "\n".join(detail))
        print(f"obmm-testbed: {exc.summary}", file=sys.stderr)
        return EXIT_TESTBED_ERROR
    return result


if __name__ == "__main__":
    sys.exit(main())
