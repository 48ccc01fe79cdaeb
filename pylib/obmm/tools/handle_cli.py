"""CLI subcommands for handles: `handle show`, `handle serve`, `handle fetch`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from obmm import exchange
from obmm.handle import Handle, HandleError


def _load(source: str) -> Handle:
    """A handle from a JSON file, a binary file, or hex text ('-' reads stdin)."""
    if source == "-":
        data = sys.stdin.buffer.read()
    elif Path(source).is_file():
        data = Path(source).read_bytes()
    else:
        data = source.encode()
    text = data.strip()
    if text.startswith(b"{"):
        return Handle.from_json(text)
    try:
        raw = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raw = data  # not hex: a binary handle file
    return Handle.decode(raw)


def _split_peer(peer: str) -> tuple[str, int]:
    host, sep, port = peer.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"peer must be HOST:PORT, got {peer!r}")
    return host, int(port)


def _cmd_show(args: argparse.Namespace) -> int:
    try:
        handle = _load(args.source)
    except HandleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(handle.encode().hex() if args.hex else handle.to_json(indent=2))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    handles: dict[str, Handle] = {}
    for spec in args.handles:
        name, sep, source = spec.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=FILE, got {spec!r}")
        try:
            handles[name] = _load(source)
        except HandleError as exc:
            print(f"error: {name}: {exc}", file=sys.stderr)
            return 1

    def ready(addr: tuple[str, int]) -> None:
        print(f"serving on {addr[0]}:{addr[1]}", flush=True)

    exchange.run_server(args.bind, args.port, handles, on_ready=ready)
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    host, port = _split_peer(args.peer)
    try:
        handle = exchange.fetch(host, port, args.name, read_timeout=args.timeout)
    except exchange.ExchangeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(handle.encode().hex() if args.hex else handle.to_json(indent=2))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("handle", help="show, serve or fetch OBMM handles")
    hsub = p.add_subparsers(dest="handle_command", metavar="ACTION")
    hsub.required = True
    show = hsub.add_parser("show", help="decode a handle (JSON, hex or binary file, '-' = stdin)")
    show.add_argument("source")
    show.add_argument("--hex", action="store_true", help="print the wire form as hex")
    show.set_defaults(func=_cmd_show)
    serve = hsub.add_parser("serve", help="serve handles over TCP until Ctrl-C")
    serve.add_argument("handles", nargs="+", metavar="NAME=FILE")
    serve.add_argument("--bind", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=exchange.DEFAULT_PORT)
    serve.set_defaults(func=_cmd_serve)
    fetch = hsub.add_parser("fetch", help="fetch a named handle from HOST:PORT")
    fetch.add_argument("peer", metavar="HOST:PORT")
    fetch.add_argument("name")
    fetch.add_argument("--hex", action="store_true")
    fetch.add_argument("--timeout", type=float, default=10.0, help="read timeout, seconds")
    fetch.set_defaults(func=_cmd_fetch)
