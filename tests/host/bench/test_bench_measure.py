"""The measurements against a fake cluster: nodes are this host, OBMM regions are files.

The fake nodes' `run` executes memprobe and gcc for real, answers the `obmm.bench.regions` and
`obmm.bench.controlpath` helpers from a table of regions, and points `/dev/obmm_shmdev<id>` of
an import at its export's file, so what node 1 reads is what node 0 filled.
"""

from __future__ import annotations

import json
import mmap
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from obmm.bench import controlpath, scheme7
from obmm.bench.local import LocalNode
from obmm.bench.measure import (
    BenchConfig,
    BenchError,
    clock_check,
    run_cluster_bench,
    run_local_bench,
    run_scheme7_bench,
)
from obmm.bench.probe import ProbeSettings
from obmm.bench.report import write_run
from obmm.bench.results import Environment
from obmm.testbed.ssh import Result

pytestmark = pytest.mark.needs_gcc

SHMDEV = re.compile(r"^/dev/obmm_shmdev(\d+)$")
# an --interleave item of an import: LABEL=shmdev[-pmd]:/dev/obmm_shmdev<id>
SHMDEV_SOURCE = re.compile(r"=shmdev(?:-pmd)?:/dev/obmm_shmdev(\d+)")
TINY = ProbeSettings(
    chase_sizes=(4 << 10, 256 << 10),
    chase_loads=10000,
    samples=3,
    load_samples=20,
    engram_rows=200,
    engram_iters=5,
    bw_size=1 << 20,
    max_seconds=3.0,
    interleave_samples=3,
    interleave_chase_loads=5000,
    interleave_best_of=2,
    interleave_engram_iters=4,
    interleave_engram_small_rows=20,
)


class FakeCluster:
    def __init__(self, root: Path, *, fail_import: bool = False, pool: int = 64 << 20) -> None:
        self.root = root
        self.fail_import = fail_import
        self.pool = pool
        self.next_id = 1
        self.exports: dict[int, Path] = {}
        self.imports: dict[int, int] = {}  # import id -> export id
        self.log: list[tuple[int, list[str]]] = []

    def nodes(self, count: int) -> list[FakeNode]:
        return [FakeNode(self, i) for i in range(count)]

    def copy(self, node: int, local: Path, remote: str) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(local, remote)

    def _json(self, obj: object) -> tuple[int, str, str]:
        return 0, json.dumps(obj) + "\n", ""

    def _regions(self, node: int, args: list[str]) -> tuple[int, str, str]:
        cmd = args[0]
        if cmd == "pool":
            return self._json({"free": self.pool, "node": node})
        if cmd == "export":
            mem_id, self.next_id = self.next_id, self.next_id + 1
            path = self.root / f"region{mem_id}"
            path.write_bytes(b"")
            self.exports[mem_id] = path
            return self._json(
                {
                    "mem_id": mem_id,
                    "tokenid": 7,
                    "uba": 0x1_0000_0000_0000 | mem_id,
                    "size": int(args[1]),
                    "node": node,
                }
            )
        if cmd == "import":
            if self.fail_import:
                return 1, json.dumps({"error": "IMPORT failed: EPERM (token mismatch)"}), ""
            exp_id = int(args[args.index("--uba") + 1]) & 0xFF
            mem_id, self.next_id = self.next_id, self.next_id + 1
            self.imports[mem_id] = exp_id
            return self._json({"mem_id": mem_id, "addr": 0, "length": 0, "numa_id": -1})
        if cmd == "unimport":
            del self.imports[int(args[1])]
            return self._json({"released": int(args[1])})
        if cmd == "unexport":
            self.exports.pop(int(args[1])).unlink()
            return self._json({"released": int(args[1])})
        raise AssertionError(args)

    def _scheme7(self, node: int, args: list[str]) -> tuple[int, str, str]:
        """The node-side scheme-7 steps on the region's file (its shmdev stands for it)."""
        cmd, mem_id = args[0], int(args[1])
        rows, dim = (int(args[args.index(o) + 1]) for o in ("--rows", "--dim"))
        path = Path(self._path_of(mem_id))
        size = scheme7.table_bytes(rows, dim)
        if cmd == "fill":
            with path.open("r+b") as f:
                f.truncate(max(size, path.stat().st_size))
                with mmap.mmap(f.fileno(), size) as m:
                    scheme7.fill(memoryview(m), rows, dim)
            return self._json({"kind": "scheme7-fill", "bytes": size})
        with path.open("r+b") as f, mmap.mmap(f.fileno(), size) as m:
            view = memoryview(m)
            try:
                iters = int(args[args.index("--iters") + 1])
                results = scheme7.measure(view, rows, dim, iters, seed=1)
            except ValueError as exc:
                return 1, json.dumps({"error": str(exc)}) + "\n", ""
            finally:
                view.release()
        source = args[args.index("--source") + 1]
        figs = scheme7.figures(source, results, "sync" if "--sync" in args else "cacheable")
        return self._json({"kind": "scheme7", "figures": [f.to_dict() for f in figs]})

    def _path_of(self, mem_id: int) -> str:
        return str(self.exports[self.imports.get(mem_id, mem_id)])

    def run(self, node: int, argv: Sequence[str]) -> tuple[int, str, str]:
        argv = list(argv)
        self.log.append((node, argv))
        if argv[:3] == ["python3", "-m", "obmm.bench.regions"]:
            return self._regions(node, argv[3:])
        if argv[:3] == ["python3", "-m", "obmm.bench.scheme7"]:
            return self._scheme7(node, argv[3:])
        if argv[:3] == ["python3", "-m", "obmm.bench.controlpath"]:
            res = controlpath.SizeResult(2 << 20)
            for op in (*controlpath.OPS, *controlpath.BASE_OPS):
                res.add(op, 12.5)
            figs = controlpath.figures([res], [0.25])
            return self._json({"kind": "controlpath", "figures": [f.to_dict() for f in figs]})
        # memprobe --shmdev: the region's file stands for the device
        out = []
        for a in argv:
            m = SHMDEV.match(a)
            a = SHMDEV_SOURCE.sub(lambda s: "=file:" + self._path_of(int(s.group(1))), a)
            out.append(self._path_of(int(m.group(1))) if m else a)
        if "--shmdev" in out:
            out[out.index("--shmdev")] = "--file"
        proc = subprocess.run(out, capture_output=True, text=True, timeout=60, check=False)
        return proc.returncode, proc.stdout, proc.stderr


class FakeNode(LocalNode):
    """A node of the fake cluster: its commands go to FakeCluster.run (argv), files to copy."""

    def __init__(self, cluster: FakeCluster, index: int) -> None:
        super().__init__(index)
        self.cluster = cluster

    def run(self, command: str, **kw: Any) -> Result:
        rc, out, err = self.cluster.run(self.index, shlex.split(command))
        return Result(command, rc, out.encode(), err.encode(), 0.0)

    def put(self, local: Path, remote: str | PurePosixPath, *, timeout: float = 300.0) -> None:
        self.cluster.copy(self.index, local, str(remote))


def env() -> Environment:
    return Environment.collect_host(accelerator="tcg", node_count=2)


@pytest.fixture()
def config(tmp_path: Path) -> BenchConfig:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    return BenchConfig(workdir=str(tmp_path / "wd"), probe=TINY, region_bytes=4 << 20)


def test_two_nodes_every_source(tmp_path: Path, config: BenchConfig) -> None:
    fake = FakeCluster(tmp_path)
    run = run_cluster_bench(fake.nodes(2), env(), config, say=lambda _m: None)
    names = {f.name for f in run.figures if f.ok}
    for src in ("local", "loopback", "loopback-sync", "cross-node", "cross-node-sync"):
        assert f"data.chase.{src}.256KiB" in names, src
        assert f"data.load.{src}" in names, src
        assert f"data.read.{src}" in names
    # Engram is measured only beside local memory in the same process: no figure of it is
    # compared with local memory measured by another process (or another node)
    assert not any(n.startswith("engram.") and ".local." in n for n in names)
    # an import's Engram, chase and load figures pair with local memory measured in the same
    # process, sample by sample
    for src in ("loopback", "loopback-sync", "cross-node", "cross-node-sync"):
        for fmt in ("data.chase.{}.256KiB", "data.load.{}", "engram.prefetch.{}.128tok"):
            page = run.figure(fmt.format(src))
            pmd = run.figure(fmt.format(f"{src}-pmd"))
            thp = run.figure(fmt.format(f"{src}-local-thp"))
            assert page is not None and pmd is not None and thp is not None, fmt.format(src)
            assert page.baseline == fmt.format(f"{src}-local")
            assert pmd.baseline == fmt.format(f"{src}-local-thp")
            assert thp.baseline == fmt.format(f"{src}-local")
            for fig in (page, pmd, thp):
                assert run.ratio(fig) is not None
                paired = run.paired_ratios(fig)
                assert paired is not None and len(paired) == len(fig.samples)
        # the same copies from small tables, beside the same baselines; no fault while timed
        for sfx, base in (("", "-local"), ("-pmd", "-local-thp")):
            fig = run.figure(f"engram.small_tables.{src}{sfx}.128tok")
            assert fig is not None and fig.ok, src + sfx
            assert fig.baseline == f"engram.small_tables.{src}{base}.128tok"
            assert run.paired_ratios(fig) is not None
        prefetch = run.figure(f"engram.prefetch.{src}.128tok")
        assert prefetch is not None and prefetch.params["faults"] == 0
    assert "control.export.2MiB" in names
    # every paired figure has its baseline in the same run
    for fig in run.figures:
        if fig.ok and fig.baseline:
            assert run.figure(fig.baseline) is not None, fig.name
    cross = run.figure("engram.prefetch.cross-node.128tok")
    assert cross is not None and len(cross.samples) == TINY.interleave_engram_iters
    assert run.figure("engram.prefetch.cross-node-sync.128tok") is not None
    # memprobe was built on both nodes; node 0 filled, node 1 measured the cross-node import
    assert {n for n, a in fake.log if a[0] == "gcc"} == {0, 1}
    probes = [(n, a) for n, a in fake.log if a[0].endswith("/memprobe")]
    fills = [n for n, a in probes if "--fill" in a]
    assert fills == [0, 0, 0, 0]  # before each of the 4 import sources
    cross_runs = [a for n, a in probes if n == 1]
    assert len(cross_runs) == 4 and "--sync" in cross_runs[1]
    interleaved = [a for a in cross_runs if "--interleave" in a]
    assert len(interleaved) == 2 and "--sync" in interleaved[1]
    spec = interleaved[0][interleaved[0].index("--interleave") + 1]
    assert re.fullmatch(
        r"cross-node-local=anon,cross-node-local-thp=anon-thp,"
        r"cross-node=shmdev:/dev/obmm_shmdev\d+,cross-node-pmd=shmdev-pmd:/dev/obmm_shmdev\d+",
        spec,
    ), spec
    # every region was released
    assert fake.exports == {} and fake.imports == {}
    assert run.env.node_count == 2
    assert run.env.extra["host_kernel"]
    write_run(run, tmp_path / "out", name="r", plots=False)


def test_one_node_records_why_cross_node_is_missing(tmp_path: Path, config: BenchConfig) -> None:
    config.sync = False
    fake = FakeCluster(tmp_path)
    run = run_cluster_bench(fake.nodes(1), env(), config, say=lambda _m: None)
    cross = run.figure("data.cross-node")
    assert cross is not None
    assert cross.skipped == "one node: cross-node import needs a second node"
    assert run.figure("data.cross-node-sync") is None  # sync not asked for
    assert run.figure("data.read.loopback") is not None
    assert run.figure("data.read.loopback-sync") is None
    assert {n for n, _ in fake.log} == {0}


def test_failed_import_is_recorded_and_cleaned_up(tmp_path: Path, config: BenchConfig) -> None:
    fake = FakeCluster(tmp_path, fail_import=True)
    run = run_cluster_bench(fake.nodes(2), env(), config, say=lambda _m: None)
    for src in ("loopback", "loopback-sync", "cross-node", "cross-node-sync"):
        fig = run.figure(f"data.{src}")
        assert fig is not None and fig.skipped is not None
        assert "EPERM (token mismatch)" in fig.skipped
    assert fake.exports == {}  # the export was released although the import failed
    assert run.figure("data.read.local") is not None


def test_region_capped_by_the_pool(tmp_path: Path, config: BenchConfig) -> None:
    config.sync = False
    fake = FakeCluster(tmp_path, pool=3 << 20)
    run = run_cluster_bench(fake.nodes(1), env(), config, say=lambda _m: None)
    assert f"data-path region capped to the free pool: {2 << 20} bytes" in run.notes
    local = [a for n, a in fake.log if "--local" in a]
    assert local[0][local[0].index("--local") + 1] == str(2 << 20)


def test_compile_failure_is_fatal(tmp_path: Path, config: BenchConfig) -> None:
    config.cc = "false"
    fake = FakeCluster(tmp_path)
    with pytest.raises(BenchError, match="exited 1"):
        run_cluster_bench(fake.nodes(1), env(), config, say=lambda _m: None)


def test_local_only_run(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    run = run_local_bench(env(), TINY, shm_dir=tmp_path, say=lambda _m: None)
    names = {f.name for f in run.figures if f.ok}
    assert {"data.read.local", "data.read.file", "engram.prefetch.file.128tok"} <= names
    fig = run.figure("data.read.file")
    assert fig is not None and fig.baseline == "data.read.local"
    loop = run.figure("data.loopback")
    assert loop is not None and loop.skipped == "host-only run (--local-only): no VM"
    assert list(tmp_path.iterdir()) == []  # the shared file is removed


def test_clock_check_flags_a_node_whose_clock_runs_off_the_host() -> None:
    """A node that calibrated its TSC wrong keeps a wrong clock: every time it measures is off
    by that factor.  The rate is the node's uptime over the host's time between two reads."""
    start = {0: (100.0, 50.0), 1: (100.0, 60.0), 2: None}
    end = {0: (120.0, 70.1), 1: (120.0, 206.0), 2: (120.0, 1.0)}
    note, warnings = clock_check(start, end)
    assert note == "node clocks against the host's over 20 s: node 0 x1.005, node 1 x7.300"
    assert len(warnings) == 1 and warnings[0].startswith("node 1's clock ran at x7.30")
    # too short a span says nothing (SSH round trips)
    note, warnings = clock_check({0: (0.0, 0.0)}, {0: (2.0, 9.0)})
    assert note.endswith("not measured") and warnings == []


def test_cluster_run_notes_each_node_clock(tmp_path: Path, config: BenchConfig) -> None:
    config.sync = False
    fake = FakeCluster(tmp_path)
    run = run_cluster_bench(fake.nodes(1), env(), config, say=lambda _m: None)
    uptimes = [a for _n, a in fake.log if a == ["cat", "/proc/uptime"]]
    assert len(uptimes) == 2  # read at the start and at the end
    assert any(n.startswith("node clocks against the host's") for n in run.notes)


def test_scheme7_node_0_fills_node_1_reads_cacheable_and_o_sync(
    tmp_path: Path, config: BenchConfig
) -> None:
    config.scheme7_rows, config.scheme7_dim, config.scheme7_iters = 100, 16, 2
    fake = FakeCluster(tmp_path)
    run = run_scheme7_bench(fake.nodes(2), env(), config, say=lambda _m: None)
    for src in ("cross-node", "cross-node-sync"):
        for bench in ("bench1.row", "bench2.batch256", "bench3.128tok"):
            fig = run.figure(f"scheme7.{bench}.{src}")
            assert fig is not None and fig.ok, (bench, src)
            assert fig.baseline == f"scheme7.{bench}.{src}-local"
            assert run.paired_ratios(fig) is not None
    steps = [(n, a[3:5]) for n, a in fake.log if a[:3] == ["python3", "-m", "obmm.bench.scheme7"]]
    assert [(n, a[0]) for n, a in steps] == [(0, "fill"), (1, "client"), (1, "client")]
    clients = [a for n, a in fake.log if a[3:4] == ["client"]]
    assert "--sync" not in clients[0] and "--sync" in clients[1]
    assert fake.exports == {} and fake.imports == {}  # released
    assert any(n.startswith("scheme7: 100 x 16 fp32 table") for n in run.notes)


def test_scheme7_unfilled_table_is_a_skipped_figure_with_the_reason(
    tmp_path: Path, config: BenchConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that finds no table (the fill did not reach the import) records why."""
    config.scheme7_rows, config.scheme7_dim, config.scheme7_iters, config.sync = 100, 16, 2, False
    monkeypatch.setattr(scheme7, "fill", lambda buf, rows, dim: None)
    fake = FakeCluster(tmp_path)
    run = run_scheme7_bench(fake.nodes(2), env(), config, say=lambda _m: None)
    fig = run.figure("scheme7.cross-node")
    assert fig is not None and fig.skipped is not None and "row 42" in fig.skipped
    assert fake.exports == {} and fake.imports == {}


class FakeSession:
    """What cluster_hook.strict_figures uses of a Session: settings, modules, nodes, reloads."""

    def __init__(self, nodes: Sequence[Any], coherence: str = "coherent") -> None:
        from obmm.testbed.settings import Settings

        self.settings = Settings(coherence=coherence)
        self.modules = [Path("obmm.ko")]
        self.nodes = nodes
        self.reloads: list[tuple[str, ...]] = []

    def reload_modules(self, kos: Sequence[Path], params: Sequence[str]) -> None:
        assert list(kos) == self.modules
        self.reloads.append(tuple(params))


def test_strict_figures_beside_the_coherent_ones_in_one_run(
    tmp_path: Path, config: BenchConfig
) -> None:
    """The Engram prefetch and the chase of the cross-node import measured again with the
    driver reloaded in `strict` (and reloaded as it was after), each beside its own local
    baselines, in the same run as the coherent ones."""
    from obmm.bench.cluster_hook import strict_figures

    fake = FakeCluster(tmp_path)
    nodes = fake.nodes(2)
    run = run_cluster_bench(nodes, env(), config, say=lambda _m: None)
    session = FakeSession(nodes)
    strict_figures(session, run, config, lambda _m: None)  # type: ignore[arg-type]
    base = session.settings.driver_params
    assert session.reloads == [(*base, "coherence=strict"), base]
    for fmt in ("engram.prefetch.{}.128tok", "data.chase.{}.256KiB"):
        for src in ("cross-node", "cross-node-strict"):
            fig = run.figure(fmt.format(src))
            assert fig is not None and fig.ok, fmt.format(src)
            assert fig.baseline == fmt.format(f"{src}-local")
            assert run.figure(fmt.format(f"{src}-pmd")) is not None
    assert any("coherence=strict" in n for n in run.notes)
    assert fake.exports == {} and fake.imports == {}
    write_run(run, tmp_path / "out", name="r", plots=False)


def test_strict_figures_only_beside_a_coherent_emulator_run(
    tmp_path: Path, config: BenchConfig
) -> None:
    from obmm.bench.cluster_hook import strict_figures

    fake = FakeCluster(tmp_path)
    run = run_cluster_bench(fake.nodes(1), env(), config, say=lambda _m: None)
    session = FakeSession(fake.nodes(1), coherence="strict")
    strict_figures(session, run, config, lambda _m: None)  # type: ignore[arg-type]
    assert session.reloads == []
    assert any("no -strict figures" in n for n in run.notes)
