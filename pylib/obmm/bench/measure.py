"""Drive the measurements on nodes, independent of how commands reach them.

The caller supplies the nodes (:class:`obmm.testbed.node.Node`: QEMU guests, real UB hosts, or
this machine, :class:`obmm.bench.local.LocalNode`), and `run_cluster_bench(nodes, env)`
compiles memprobe.c on the nodes, measures
local memory (the baseline), the control path, a loopback import and (with two nodes or more)
a cross-node import where node 1 reads node 0's export, cacheable and O_SYNC, and returns a
`Run`.

The latency figures (pointer chase, single load) of an import come from one memprobe process
on the importer that maps the import twice (page granule and PMD granule, two exports) and
local memory (4 KiB and 2 MiB pages) and measures them in turn, sample by sample
(`memprobe --interleave`), while the other node is idle: a ratio then compares two sets of
samples taken under the same conditions.  Measured one after the other, in separate runs or on
different nodes, the ratio was whatever else the shared host cores did meanwhile (x5.07 for a
4 MiB chase in one run, x1.11 in the run before, while the mapping costs nothing measurable).

`run_local_bench(env)` does the host-only smoke run (no VM): local memory against a
MAP_SHARED file on /dev/shm, which is what QEMU's memory-backend-file is on the host.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from obmm.bench import controlpath, scheme7
from obmm.bench.local import LocalNode
from obmm.bench.probe import (
    CFLAGS,
    INTERLEAVED_TESTS,
    PMD_SUFFIX,
    SOURCE_NAME,
    ProbeSettings,
    compile_local,
    figures_from_probe,
    interleaved_sources,
    parse_output,
    probe_failure_figures,
    source_text,
)
from obmm.bench.results import Environment, Figure, Run, cpu_model_from_cpuinfo, now_iso
from obmm.testbed.errors import TestbedError

if TYPE_CHECKING:
    from obmm.testbed.node import Node

log = logging.getLogger(__name__)

SayFn = Callable[[str], None]

GRANULE = 2 << 20
VERIFY_FAILED = 3
# Engram, load and chase: the interleaved runs (_interleaved_figures), where every source has
# its local baselines beside it in the same process
LOCAL_TESTS = "verify,load,chase,read,write,clock"
REMOTE_TESTS = "verify,read,write"


GUEST_PYTHON = ("env", "PYTHONPATH=/opt/obmm-testbed/pylib", "python3")
CLOCK_TOLERANCE = 0.02  # a node clock further off the host's than this is reported
CLOCK_MIN_SPAN_S = 10.0  # shorter spans say nothing of a clock's rate over SSH
COMMAND_TIMEOUT_S = 900.0


class BenchError(TestbedError, RuntimeError):
    """A step every measurement depends on failed (compiling memprobe, say)."""


@dataclass
class BenchConfig:
    """What to measure and how to run it on a node."""

    workdir: str = "/tmp/obmm-bench"
    python: tuple[str, ...] = ("python3",)  # with obmm importable, e.g. env PYTHONPATH=...
    cc: str = "gcc"
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    region_bytes: int | None = None  # default: what `probe` needs, capped by the free pool
    sync: bool = True  # also measure O_SYNC mappings
    control: bool = True
    control_sizes: tuple[int, ...] = controlpath.SIZES
    control_reps: int = 10
    control_max_seconds: float = 20.0
    scheme7_rows: int = scheme7.ROWS
    scheme7_dim: int = scheme7.DIM
    scheme7_iters: int = scheme7.ITERS
    node_env: dict[int, dict[str, str]] = field(default_factory=dict)  # on hardware hosts

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls(
            probe=ProbeSettings.quick(),
            control_sizes=(2 << 20, 8 << 20, 32 << 20, 128 << 20),
            control_reps=5,
            control_max_seconds=5.0,
            scheme7_iters=50,
        )

    @property
    def binary(self) -> str:
        return f"{self.workdir}/memprobe"


def _round_granule(n: int) -> int:
    return max(GRANULE, (n + GRANULE - 1) // GRANULE * GRANULE)


class Nodes:
    """The nodes, with error handling and a log of each command."""

    def __init__(self, nodes: Sequence[Node], config: BenchConfig, say: SayFn) -> None:
        self.nodes = list(nodes)
        self.config = config
        self.say = say

    def run(self, node: int, argv: Sequence[str]) -> tuple[int, str, str]:
        log.debug("node %d: %s", node, shlex.join(argv))
        res = self.nodes[node].run(shlex.join(argv), timeout=COMMAND_TIMEOUT_S, bare=True)
        return res.exit_status, res.out, res.err

    def _copy(self, node: int, local: Path, remote: str) -> None:
        self.nodes[node].put(local, remote)

    def check(self, node: int, argv: Sequence[str]) -> str:
        rc, out, err = self.run(node, argv)
        if rc != 0:
            raise BenchError(f"node {node}: {shlex.join(argv)} exited {rc}: {err.strip()[-500:]}")
        return out

    def python_argv(self, node: int) -> list[str]:
        """The node's Python command, with the node's environment (config.node_env) first."""
        env = self.config.node_env.get(node, {})
        return (
            ["env", *(f"{k}={v}" for k, v in env.items()), *self.config.python]
            if env
            else [*self.config.python]
        )

    def python_json(self, node: int, module: str, *args: str) -> dict[str, Any]:
        """Run `python -m module args` on the node; its last stdout line is a JSON object."""
        rc, out, err = self.run(node, [*self.python_argv(node), "-m", module, *args])
        lines = [ln for ln in out.splitlines() if ln.strip()]
        try:
            doc: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        except ValueError:
            doc = {}
        if rc != 0 or not doc or "error" in doc:
            detail = doc.get("error") or err.strip()[-500:] or out.strip()[-500:]
            raise BenchError(f"node {node}: {module} {' '.join(args)} failed ({rc}): {detail}")
        return doc

    def install_probe(self, node: int) -> None:
        cfg = self.config
        self.check(node, ["mkdir", "-p", cfg.workdir])
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / SOURCE_NAME
            src.write_text(source_text())
            self._copy(node, src, f"{cfg.workdir}/{SOURCE_NAME}")
        self.check(node, [cfg.cc, *CFLAGS, "-o", cfg.binary, f"{cfg.workdir}/{SOURCE_NAME}"])

    def probe(
        self,
        node: int,
        source_args: Sequence[str],
        source: str,
        tests: str,
        baseline: str | None = "local",
    ) -> list[Figure]:
        """Run memprobe on the node; every failure becomes skipped figures, never an exception."""
        argv = [self.config.binary, *source_args, *self.config.probe.args(), "--tests", tests]
        self.say(f"memprobe {source} on node {node}")
        rc, out, err = self.run(node, argv)
        try:
            parsed = parse_output(out)
        except ValueError as exc:
            return probe_failure_figures(source, f"memprobe output unreadable: {exc}")
        if rc not in (0, VERIFY_FAILED) or parsed.done is None:
            return probe_failure_figures(
                source, f"memprobe exited {rc} on node {node}: {err.strip()[-300:]}"
            )
        return figures_from_probe(parsed, source, baseline_source=baseline)

    def fill(self, node: int, mem_id: int, length: int) -> None:
        self.check(
            node,
            [
                self.config.binary,
                "--shmdev",
                f"/dev/obmm_shmdev{mem_id}",
                "--length",
                str(length),
                "--fill",
                "--tests",
                "none",
                "--engram-rows",
                str(self.config.probe.engram_rows),
            ],
        )

    @contextmanager
    def exported(self, node: int, size: int) -> Iterator[dict[str, Any]]:
        exp = self.python_json(node, "obmm.bench.regions", "export", str(size))
        try:
            yield exp
        finally:
            self._release(node, "unexport", int(exp["mem_id"]))

    @contextmanager
    def imported(self, node: int, exp: dict[str, Any]) -> Iterator[dict[str, Any]]:
        imp = self.python_json(
            node,
            "obmm.bench.regions",
            "import",
            "--exporter-node",
            str(exp["node"]),
            "--uba",
            str(exp["uba"]),
            "--size",
            str(exp["size"]),
            "--tokenid",
            str(exp["tokenid"]),
        )
        try:
            yield imp
        finally:
            self._release(node, "unimport", int(imp["mem_id"]))

    def _release(self, node: int, what: str, mem_id: int) -> None:
        try:
            self.python_json(node, "obmm.bench.regions", what, str(mem_id))
        except BenchError as exc:
            log.warning("cleanup: %s", exc)


def node_environment(nodes: Nodes, node: int) -> dict[str, str]:
    """Kernel release and CPU model of a node."""
    out: dict[str, str] = {}
    rc, text, _ = nodes.run(node, ["uname", "-r"])
    out["kernel"] = text.strip() if rc == 0 else "unknown"
    rc, text, _ = nodes.run(node, ["cat", "/proc/cpuinfo"])
    out["cpu_model"] = cpu_model_from_cpuinfo(text) if rc == 0 else "unknown"
    return out


def _import_sources(
    nodes: Nodes, exporter: int, importer: int, region: int, name: str
) -> list[Figure]:
    """Export on `exporter`, fill it there, import on `importer`, measure cacheable and O_SYNC."""
    cfg = nodes.config
    figs: list[Figure] = []
    variants: list[tuple[str, list[str]]] = [(name, [])] + (
        [(f"{name}-sync", ["--sync"])] if cfg.sync else []
    )
    try:
        with nodes.exported(exporter, region) as exp, nodes.imported(importer, exp) as imp:
            for source, extra in variants:
                # chase and write overwrite the tables: fill again before every source
                nodes.fill(exporter, int(exp["mem_id"]), region)
                figs += nodes.probe(
                    importer,
                    [
                        "--shmdev",
                        f"/dev/obmm_shmdev{imp['mem_id']}",
                        "--length",
                        str(region),
                        *extra,
                    ],
                    source,
                    REMOTE_TESTS,
                )
    except BenchError as exc:
        done = {str(f.params.get("source")) for f in figs}
        for source, _ in variants:
            if source not in done:
                figs += probe_failure_figures(source, str(exc))
    return figs


def _latency_failure(sources: dict[str, str | None], reason: str) -> list[Figure]:
    """Skipped figures for the sources of an interleaved run that could not be measured
    (named apart from the source's own `data.<source>` failure)."""
    return [
        Figure(
            name=f"data.latency.{s}", group="data", unit="-", skipped=reason, params={"source": s}
        )
        for s in sources
    ]


def measure_interleaved(
    nodes: Nodes,
    node: int,
    kinds: dict[str, str],
    sources: dict[str, str | None],
    size: int,
    *,
    sync: bool = False,
) -> list[Figure]:
    """One `memprobe --interleave` run on `node`: every source of `kinds` (label -> memprobe
    KIND[:PATH]) mapped side by side, `size` bytes each; figures of each of `sources` against
    its baseline there.  A failure becomes skipped figures."""
    cfg = nodes.config
    spec = ",".join(f"{label}={kind}" for label, kind in kinds.items())
    argv = [cfg.binary, "--interleave", spec, "--length", str(size)]
    argv += [*cfg.probe.interleave_args(), "--tests", INTERLEAVED_TESTS]
    argv += ["--sync"] if sync else []
    nodes.say(f"memprobe interleaved {', '.join(kinds)} on node {node}")
    rc, out, err = nodes.run(node, argv)
    try:
        parsed = parse_output(out)
    except ValueError as exc:
        parsed = None
        err = f"memprobe output unreadable: {exc}"
    if parsed is None or rc != 0 or parsed.done is None:
        why = f"memprobe exited {rc} on node {node}: {err.strip()[-300:]}"
        return _latency_failure(sources, why)
    outs = parsed.by_source()
    figs: list[Figure] = []
    for source, base in sources.items():
        if source in outs:
            figs += figures_from_probe(outs[source], source, baseline_source=base, interleaved=True)
        else:
            figs += _latency_failure({source: None}, "memprobe printed no sample of it")
    return figs


def _interleaved_figures(
    nodes: Nodes, exporter: int, importer: int, name: str, free: int | None, *, sync: bool
) -> list[Figure]:
    """Engram, load and chase of import `name` (page and PMD granule) and of the importer's
    local memory (4 KiB and 2 MiB pages), interleaved in one memprobe process on the importer."""
    cfg = nodes.config
    size = _round_granule(cfg.probe.interleave_bytes())
    if free is not None and 2 * size > free:
        size = free // 2 // GRANULE * GRANULE
    sources = interleaved_sources(name)
    if size < GRANULE:
        return _latency_failure(sources, "the export pool has no 2 x 2 MiB free")
    page, pmd = name, f"{name}{PMD_SUFFIX}"
    local, thp = (s for s in sources if s not in (page, pmd))
    try:
        with (
            nodes.exported(exporter, size) as exp_page,
            nodes.exported(exporter, size) as exp_pmd,
            nodes.imported(importer, exp_page) as imp_page,
            nodes.imported(importer, exp_pmd) as imp_pmd,
        ):
            kinds = {
                local: "anon",
                thp: "anon-thp",
                page: f"shmdev:/dev/obmm_shmdev{imp_page['mem_id']}",
                pmd: f"shmdev-pmd:/dev/obmm_shmdev{imp_pmd['mem_id']}",
            }
            return measure_interleaved(nodes, importer, kinds, sources, size, sync=sync)
    except BenchError as exc:
        return _latency_failure(sources, str(exc))


def _uptime(nodes: Nodes, node: int) -> tuple[float, float] | None:
    """(host monotonic time, the node's /proc/uptime) read together, or None."""
    before = time.monotonic()
    rc, out, _ = nodes.run(node, ["cat", "/proc/uptime"])
    host = (before + time.monotonic()) / 2
    try:
        return (host, float(out.split()[0])) if rc == 0 else None
    except (ValueError, IndexError):
        return None


def clock_check(
    start: dict[int, tuple[float, float] | None], end: dict[int, tuple[float, float] | None]
) -> tuple[str, list[str]]:
    """A note with the rate of each node's clock against the host's between two readings, and
    a warning for each node whose clock was off by more than CLOCK_TOLERANCE.

    A guest kernel that calibrated its TSC wrong at boot (under TCG, the PIT loop of a vCPU
    starved by a loaded host: "tsc: PIT calibration deviates from HPET ... Using PIT
    calibration value") keeps the wrong rate: every time it measures is off by that factor,
    while ratios within one process still hold.
    """
    rates: dict[int, float] = {}
    span = 0.0
    for node, a in start.items():
        b = end.get(node)
        if a is not None and b is not None and b[0] - a[0] >= CLOCK_MIN_SPAN_S:
            rates[node] = (b[1] - a[1]) / (b[0] - a[0])
            span = max(span, b[0] - a[0])
    note = f"node clocks against the host's over {span:.0f} s: " + (
        ", ".join(f"node {n} x{r:.3f}" for n, r in sorted(rates.items())) or "not measured"
    )
    warnings = [
        f"node {n}'s clock ran at x{r:.2f} of the host's: every time measured there is off "
        f"by that factor (ratios within one process still hold); its kernel calibrated the "
        f"TSC wrong at boot (see `dmesg | grep -i tsc` on it)"
        for n, r in sorted(rates.items())
        if abs(r - 1.0) > CLOCK_TOLERANCE
    ]
    return note, warnings


def _control_figures(nodes: Nodes, node: int) -> list[Figure]:
    cfg = nodes.config
    nodes.say(f"control path on node {node}")
    try:
        doc = nodes.python_json(
            node,
            "obmm.bench.controlpath",
            "--sizes",
            ",".join(str(s) for s in cfg.control_sizes),
            "--reps",
            str(cfg.control_reps),
            "--max-seconds",
            f"{cfg.control_max_seconds:g}",
        )
    except BenchError as exc:
        return [Figure(name="control", group="control", unit="us", skipped=str(exc))]
    return [Figure.from_dict(f) for f in doc.get("figures", [])]


def _all_interleaved(
    nodes: Nodes, exporter: int, importer: int, name: str, free: object
) -> list[Figure]:
    pool = free if isinstance(free, int) else None
    figs = _interleaved_figures(nodes, exporter, importer, name, pool, sync=False)
    if nodes.config.sync:
        figs += _interleaved_figures(nodes, exporter, importer, f"{name}-sync", pool, sync=True)
    return figs


def run_cluster_bench(
    node_list: Sequence[Node],
    env: Environment,
    config: BenchConfig | None = None,
    say: SayFn | None = None,
) -> Run:
    """Every data-path, Engram and control-path figure on the nodes of a cluster.

    `env` is completed with node 0's kernel and CPU (the host's go to env.extra).
    Raises BenchError only when memprobe cannot be built; everything else that fails becomes a
    skipped figure with its reason.
    """
    cfg = config or BenchConfig()
    say = say or log.info
    n = Nodes(node_list, cfg, say)
    nodes = len(node_list)
    used = [0, 1] if nodes >= 2 else [0]
    for node in used:
        say(f"building memprobe on node {node}")
        n.install_probe(node)
    clocks = {node: _uptime(n, node) for node in used}
    guest = node_environment(n, 0)
    env.extra.setdefault("host_kernel", env.kernel)
    env.extra.setdefault("host_cpu_model", env.cpu_model)
    env.kernel, env.cpu_model, env.node_count = guest["kernel"], guest["cpu_model"], nodes
    result = Run(env=env)

    region = cfg.region_bytes or _round_granule(cfg.probe.region_bytes())
    try:
        free = n.python_json(0, "obmm.bench.regions", "pool").get("free")
    except BenchError as exc:
        free = None
        result.notes.append(f"pool size unknown: {exc}")
    if isinstance(free, int) and free < region:
        region = free // GRANULE * GRANULE
        result.notes.append(f"data-path region capped to the free pool: {region} bytes")
    result.notes.append(f"data-path region {region} bytes on every source")

    result.add(n.probe(0, ["--local", str(region)], "local", LOCAL_TESTS, baseline=None))
    if cfg.control:
        result.add(_control_figures(n, 0))
    if region < GRANULE:
        for source in ("loopback", "cross-node"):
            result.add(probe_failure_figures(source, "the export pool has no free 2 MiB"))
    else:
        say("loopback import on node 0")
        result.add(_import_sources(n, 0, 0, region, "loopback"))
        result.add(_all_interleaved(n, 0, 0, "loopback", free))
        if nodes >= 2:
            say("cross-node import: node 1 reads node 0's export")
            result.add(_import_sources(n, 0, 1, region, "cross-node"))
            result.add(_all_interleaved(n, 0, 1, "cross-node", free))
        else:
            reason = "one node: cross-node import needs a second node"
            result.add(probe_failure_figures("cross-node", reason))
            if cfg.sync:
                result.add(probe_failure_figures("cross-node-sync", reason))
    note, warnings = clock_check(clocks, {node: _uptime(n, node) for node in used})
    result.notes.append(note)
    result.warnings += warnings
    for warning in warnings:
        log.warning("%s", warning)
    env.finished = now_iso()
    return result


#: The suffix of the sources measured with the driver in the `strict` coherence model.
STRICT_SUFFIX = "-strict"


def run_strict_figures(
    node_list: Sequence[Node], config: BenchConfig, say: SayFn | None = None
) -> list[Figure]:
    """The Engram prefetch and the chase of a cacheable import again, with the driver loaded
    in the `strict` coherence model (docs/coherence.md) by the caller, named `...-strict`:
    beside run_cluster_bench's, the cost of each node caching what it maps.  memprobe must be
    installed already (run_cluster_bench did)."""
    n = Nodes(node_list, config, say or log.info)
    importer = 1 if len(node_list) >= 2 else 0
    name = ("cross-node" if importer else "loopback") + STRICT_SUFFIX
    try:
        free = n.python_json(0, "obmm.bench.regions", "pool").get("free")
    except BenchError as exc:
        return _latency_failure(interleaved_sources(name), str(exc))
    pool = free if isinstance(free, int) else None
    return _interleaved_figures(n, 0, importer, name, pool, sync=False)


def _scheme7_failure(source: str, reason: str) -> Figure:
    """One skipped figure standing for a scheme-7 client run that could not be measured."""
    return Figure(
        name=f"scheme7.{source}",
        group="scheme7",
        unit="-",
        skipped=reason,
        params={"source": source},
    )


def run_scheme7_bench(
    node_list: Sequence[Node],
    env: Environment,
    config: BenchConfig | None = None,
    say: SayFn | None = None,
) -> Run:
    """The seed's scheme-7 client (Bench 1-3, `obmm.bench.scheme7`) over the Python API.

    Node 0 exports the table and fills it through its shmdev, like the seed's server; node 1
    (node 0 itself with one node: a loopback import) imports it and runs the client, once
    cacheable and once O_SYNC (config.sync), each sample also taken from a copy of the table
    in local memory of the client's process.  The same on QEMU nodes and on real UB hosts, so
    the two runs' results.json can be put side by side (`obmm-testbed bench-compare`).
    """
    cfg = config or BenchConfig()
    say = say or log.info
    n = Nodes(node_list, cfg, say)
    nodes = len(node_list)
    used = [0, 1] if nodes >= 2 else [0]
    clocks = {node: _uptime(n, node) for node in used}
    guest = node_environment(n, 0)
    env.extra.setdefault("host_kernel", env.kernel)
    env.extra.setdefault("host_cpu_model", env.cpu_model)
    env.kernel, env.cpu_model, env.node_count = guest["kernel"], guest["cpu_model"], nodes
    result = Run(env=env)
    importer = used[-1]
    name = "cross-node" if importer else "loopback"
    table = scheme7.table_bytes(cfg.scheme7_rows, cfg.scheme7_dim)
    shape = ["--rows", str(cfg.scheme7_rows), "--dim", str(cfg.scheme7_dim)]
    variants: list[tuple[str, list[str]]] = [(name, [])]
    variants += [(f"{name}-sync", ["--sync"])] if cfg.sync else []
    try:
        with n.exported(0, _round_granule(table)) as exp:
            say(f"scheme7: filling the {table}-byte table on node 0")
            n.python_json(0, "obmm.bench.scheme7", "fill", str(exp["mem_id"]), *shape)
            with n.imported(importer, exp) as imp:
                for source, extra in variants:
                    say(f"scheme7: client {source} on node {importer}")
                    try:
                        doc = n.python_json(
                            importer,
                            "obmm.bench.scheme7",
                            "client",
                            str(imp["mem_id"]),
                            "--source",
                            source,
                            "--iters",
                            str(cfg.scheme7_iters),
                            *shape,
                            *extra,
                        )
                        result.add(Figure.from_dict(f) for f in doc.get("figures", []))
                    except BenchError as exc:
                        result.add([_scheme7_failure(source, str(exc))])
    except BenchError as exc:
        done = {str(f.params.get("source")) for f in result.figures}
        result.add(_scheme7_failure(s, str(exc)) for s, _ in variants if s not in done)
    result.notes.append(
        f"scheme7: {cfg.scheme7_rows} x {cfg.scheme7_dim} fp32 table ({table} bytes), "
        f"{cfg.scheme7_iters} samples per bench; node 0 exports and fills, node {importer} "
        "imports and copies; local: the same table in local memory of the client's process"
    )
    note, warnings = clock_check(clocks, {node: _uptime(n, node) for node in used})
    result.notes.append(note)
    result.warnings += warnings
    env.finished = now_iso()
    return result


def run_local_bench(
    env: Environment,
    settings: ProbeSettings | None = None,
    *,
    shm_dir: Path | None = None,
    say: SayFn | None = None,
) -> Run:
    """Host-only smoke run: memprobe on local memory and on a MAP_SHARED /dev/shm file.

    No /dev/obmm is needed; the control path is recorded as skipped unless the host has one.
    """
    settings = settings or ProbeSettings.quick()
    say = say or log.info
    cfg = BenchConfig(probe=settings)
    result = Run(env=env)
    region = _round_granule(settings.region_bytes())
    shm = shm_dir or (
        Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    )
    with tempfile.TemporaryDirectory(prefix="obmm-bench-") as tmp:
        say("building memprobe on the host")
        binary = compile_local(Path(tmp))
        cfg.workdir = str(binary.parent)

        n = Nodes([LocalNode()], cfg, say)
        result.add(n.probe(0, ["--local", str(region)], "local", LOCAL_TESTS, baseline=None))
        fd, path = tempfile.mkstemp(prefix="obmm-bench-", dir=shm)
        os.close(fd)
        try:
            result.add(
                n.probe(
                    0, ["--file", path, "--length", str(region), "--fill"], "file", REMOTE_TESTS
                )
            )
            # the file beside anonymous memory of both page sizes, in one process
            sources = interleaved_sources("file", pmd=False)
            local, thp = (s for s in sources if s != "file")
            kinds = {local: "anon", thp: "anon-thp", "file": f"file:{path}"}
            size = _round_granule(settings.interleave_bytes())
            result.add(measure_interleaved(n, 0, kinds, sources, size))
        finally:
            os.unlink(path)
    if Path("/dev/obmm").exists():
        say("control path on the host")
        result.add(controlpath.run(cfg.control_sizes[:4], reps=5, max_seconds=5.0))
    else:
        result.add(
            [
                Figure(
                    name="control",
                    group="control",
                    unit="us",
                    skipped="no /dev/obmm on this machine (host-only run)",
                )
            ]
        )
    result.notes.append(
        "host-only run: 'file' is a MAP_SHARED file on tmpfs, the host-side stand-in for an "
        "emulated import (QEMU maps guest RAM from such a file); no VM, no OBMM driver"
    )
    for source in ("loopback", "cross-node"):
        result.add(probe_failure_figures(source, "host-only run (--local-only): no VM"))
    env.finished = now_iso()
    return result


def make_testbed_figure(
    name: str, seconds: Sequence[float], *, baseline: str | None = None, note: str = ""
) -> Figure:
    """A testbed-speed figure (group `testbed`, seconds), e.g.

    make_testbed_figure("testbed.boot_to_ssh.2nodes", [41.2, 39.8],
                        baseline="testbed.boot_to_ssh.1node")
    Names the lead's `make bench` should use: testbed.image_build.cold, testbed.image_build.cached
    (baseline cold), testbed.boot_to_ssh.{fast,systemd}.{1node,2nodes,4nodes,8nodes} (fast's
    baseline: systemd of the same size),
    testbed.qemu_test.cold, testbed.qemu_test.warm (baseline cold).
    """
    if not name.startswith("testbed."):
        raise ValueError(f"testbed figure names start with 'testbed.': {name}")
    return Figure(
        name=name,
        group="testbed",
        unit="s",
        samples=[float(s) for s in seconds],
        baseline=baseline,
        note=note,
    )
