"""The `obmm-testbed` command line: one entry point, subcommands registered by the modules."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from obmm import __version__


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
    from obmm import abi_cli, handle_cli
    from obmm.bench import cli as bench_cli
    from obmm.bench import cluster_hook

    abi_cli.register(sub)
    handle_cli.register(sub)
    bench_cli.register(sub, cluster_bench=cluster_hook.cluster_bench)
    try:
        from obmm.testbed import commands as testbed_commands
    except ImportError:  # the testbed needs paramiko; hosts that only use bindings may lack it
        pass
    else:
        testbed_commands.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
