"""Set up and tear down the regions memprobe measures, one step per process.

OBMM regions outlive the process that made them (they belong to the driver until unexport /
unimport), so the runner creates them with one command, runs memprobe on
`/dev/obmm_shmdev<id>` with another, and releases them with a third:

    python3 -m obmm.bench.regions export SIZE
        -> {"mem_id": 3, "tokenid": ..., "uba": ..., "size": ..., "node": 0}
    python3 -m obmm.bench.regions import --exporter-node 0 --uba UBA --size N --tokenid T
        -> {"mem_id": 4, "addr": ..., "length": ...}
    python3 -m obmm.bench.regions unimport ID | unexport ID
    python3 -m obmm.bench.regions pool   -> {"free": N or null, "node": 0}

Every command prints one JSON object; failures print {"error": "..."} and exit 1.
Needs only python3, cffi and the obmm package.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import obmm
from obmm import decoder as decoder_mod
from obmm import envvars, identity
from obmm.errors import ObmmError

MEMPOOL_SYSFS = Path("/sys/kernel/obmm_mempool")
EMU_NODE_ID = Path("/sys/kernel/obmm_emu/node_id")


def pool_free(root: Path = MEMPOOL_SYSFS) -> int | None:
    """Free bytes of the export pool (obmm_emu / obmm_mempool sysfs), None when unknown."""
    dirs = sorted(root.glob("obmm-*")) if root.is_dir() else []
    if not dirs:
        return None
    free = 0
    for d in dirs:
        try:
            free += int((d / "total").read_text(), 0) - int((d / "used").read_text(), 0)
        except (OSError, ValueError):
            return None
    return free


def node_id(path: Path = EMU_NODE_ID) -> int:
    """This node's fabric id: obmm_emu's, else $OBMM_NODE_ID (what the hardware stage gives a
    host: its place in the host list), else 0."""
    for text in (_read(path), envvars.NODE_ID.raw()):
        try:
            return int((text or "").strip(), 0)
        except ValueError:
            continue
    return 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def do_export(size: int) -> dict[str, Any]:
    with obmm.Obmm() as dev:
        exp = dev.export(size)
    return {
        "mem_id": exp.mem_id,
        "tokenid": exp.tokenid,
        "uba": exp.uba,
        "size": exp.length,
        "node": node_id(),
    }


def do_import(exporter_node: int, uba: int, size: int, tokenid: int) -> dict[str, Any]:
    addr = decoder_mod.default_decoder().resolve(exporter_node, uba, size)
    scna = identity.local_cna()
    with obmm.Obmm() as dev:
        imp = dev.import_(addr, size, scna=scna, tokenid=tokenid)
    return {"mem_id": imp.mem_id, "addr": addr, "length": size, "numa_id": imp.numa_id}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m obmm.bench.regions", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("size", type=lambda s: int(s, 0))
    i = sub.add_parser("import")
    i.add_argument("--exporter-node", type=int, required=True)
    i.add_argument("--uba", type=lambda s: int(s, 0), required=True)
    i.add_argument("--size", type=lambda s: int(s, 0), required=True)
    i.add_argument("--tokenid", type=lambda s: int(s, 0), default=0)
    for name in ("unimport", "unexport"):
        sub.add_parser(name).add_argument("mem_id", type=int)
    sub.add_parser("pool")
    args = p.parse_args(argv)
    try:
        if args.cmd == "export":
            out = do_export(args.size)
        elif args.cmd == "import":
            out = do_import(args.exporter_node, args.uba, args.size, args.tokenid)
        elif args.cmd in ("unimport", "unexport"):
            with obmm.Obmm() as dev:
                getattr(dev, args.cmd)(args.mem_id)
            out = {"released": args.mem_id}
        else:
            out = {"free": pool_free(), "node": node_id()}
    except (ObmmError, decoder_mod.DecoderError, OSError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
