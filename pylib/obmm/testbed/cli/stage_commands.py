"""`obmm-testbed` subcommands for the stages that build or test outside a booted cluster:
kmod, kmod-matrix, hw-test, hw-preflight, patch-check, fuzz-diff; run (a cluster of its own,
for your code) and doctor (can this host run it).  Each module keeps its options and its
`command`; this only names them (``python -m`` on the module runs the same command, for
debugging)."""

from __future__ import annotations

import argparse

from obmm.testbed.builds import kbuild
from obmm.testbed.cli import doctor, run
from obmm.testbed.hw import stage as hwstage
from obmm.testbed.stages import fuzzdiff, matrix, patchstage


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("kmod", help="build kmod/* against the guest kernel and pre-flight them")
    kbuild.add_arguments(p)
    p.set_defaults(func=kbuild.command)

    p = sub.add_parser("kmod-matrix", help="build kmod/* against every kernel of the matrix")
    matrix.add_arguments(p)
    p.set_defaults(func=matrix.command)

    p = sub.add_parser("fuzz-diff", help=fuzzdiff.DESCRIPTION)
    fuzzdiff.add_arguments(p)
    p.set_defaults(func=fuzzdiff.command)

    p = sub.add_parser("hw-test", help="the guest and cluster suites on real UB hosts over SSH")
    hwstage.add_arguments(p)
    p.set_defaults(func=hwstage.command)

    p = sub.add_parser("hw-preflight", help="only the hardware stage's pre-flight checks")
    hwstage.add_arguments(p)
    p.set_defaults(func=hwstage.command, preflight_only=True)

    p = sub.add_parser(
        "run",
        help="boot a cluster, copy a directory in, run commands on every node, tear down",
        usage="obmm-testbed run [--nodes N] [--node N=CMD]... [--service N --ready-port P | "
        "--ready-line TEXT] [--dir PATH] [--dest PATH] [--timeout S] [--keep] [-- CMD...]",
    )
    run.add_arguments(p)
    p.set_defaults(func=run.command)

    patchstage.register(sub)

    p = sub.add_parser(
        "doctor", help="check the host: QEMU, compiler, KVM, memory, /dev/shm, cache"
    )
    doctor.add_arguments(p)
    p.set_defaults(func=doctor.command)
