"""CLI subcommands that need only the bindings: `abi` and `explain`."""

from __future__ import annotations

import argparse
import errno as errno_mod

from obmm import abi, ubsm_causes
from obmm.causes import CAUSES, causes


def _cmd_abi(args: argparse.Namespace) -> int:
    for struct in abi.STRUCT_NAMES:
        print(f"{struct}: size {abi.sizeof(struct)}, align {abi.alignof(struct)}")
        if args.fields:
            for name in abi.fields(struct):
                offset, size = abi.offsetof(struct, name), abi.field_size(struct, name)
                print(f"    {name:<12} @{offset:<4} {size} B")
    for name, (number, _struct, _op) in abi.IOCTLS.items():
        print(f"{name:<30} {number:#010x}")
    return 0


def _explain_ubsm(code: str) -> int:
    entry = ubsm_causes.lookup(code)
    if entry is None:
        print(f"unknown ubs-mem/UBSE code {code!r}; known: {ubsm_causes.known()}")
        return 2
    print(ubsm_causes.render_text(entry), end="")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    op = args.operation.upper()
    if op == "UBSM":
        return _explain_ubsm(args.errno)
    errname = args.errno.upper()
    if errname.isdigit():
        errname = errno_mod.errorcode.get(int(errname), errname)
    known_ops = sorted({o for o, _ in CAUSES if o != "*"})
    if op not in known_ops:
        print(f"unknown operation {op!r}; one of: {', '.join(known_ops)} (or UBSM <code>)")
        return 2
    found = causes(op, errname)
    if not found:
        print(f"{op} {errname}: not an errno the OBMM driver documents for this operation")
        return 1
    print(f"{op} failed with {errname}; likely causes:")
    for text in found:
        print(f"  - {text}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("abi", help="print struct sizes and ioctl numbers of uapi/ub/obmm.h")
    p.add_argument("--fields", action="store_true", help="also print every field offset")
    p.set_defaults(func=_cmd_abi)
    p = sub.add_parser(
        "explain",
        help="likely causes of an errno from an OBMM operation, or of a ubs-mem code (ubsm 800)",
    )
    p.add_argument("operation", help="EXPORT, IMPORT, UNEXPORT, MMAP, ...; or ubsm")
    p.add_argument(
        "errno", help="errno name or number, e.g. EINVAL or 22; after ubsm: a code, e.g. 800"
    )
    p.set_defaults(func=_cmd_explain)
