"""``obmm-testbed fuzz-diff`` (``make fuzz-diff``): the emulator and the real obmm.ko on one
seeded operation sequence, every call's outcome compared.

Two single-node clusters boot side by side, one with the emulated driver, one with upstream's
obmm.ko over kmod/ub_compat.  Each runs the structured fuzzer in record mode
(``python3 -m obmm.fuzz --record``, :mod:`obmm.fuzz.engine`) on the same seed: every operation's
outcome is the errno of each call it made, the reply fields that do not depend on placement
(mem_id, numa_id, an address query's region and offset) and any data or model check that
failed.  Calls whose outcome is the emulator's own by design are left out on both sides (the
engine says why; they count as skipped).  The real driver's run goes first: an export its pool
did not place in one physical run (no UBA on the testbed) is unexported again and left out, and
the emulator's run leaves out the same operations.  The outcomes are compared operation by
operation:

* the same on both: passed;
* different, and ``EXPLAINED`` names the reason (a FIDELITY row): differs, explained;
* different otherwise: the run stops there, the operation list is shrunk (delta debugging,
  :mod:`obmm.fuzz.shrink`, each candidate replayed on both nodes) to a reproducer, and the
  command exits 1.

A kernel report on either node ends the run too (exit 1).  The result goes to
``results/fuzz-diff.json`` and ``results/fuzz-diff.md``: per operation kind, how many passed on
both, differed (and why) and were skipped (and why).
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from obmm.fuzz.ops import generate
from obmm.fuzz.shrink import ddmin, suffix_first
from obmm.testbed.builds import kbuild
from obmm.testbed.errors import TestbedError
from obmm.testbed.paths import note_input_skip, results_dir
from obmm.testbed.remote import GUEST_ROOT
from obmm.testbed.settings import Settings
from obmm.testbed.suite.guest_suite import GuestSession

log = logging.getLogger(__name__)

DESCRIPTION = "Compare the emulator and the real obmm.ko on one seeded fuzzer run."
DEFAULT_SEED = 1
DEFAULT_OPS = 20000
#: What an outcome holds that is compared (everything but the operation's own identity).
COMPARED = ("errnos", "check", "skipped", "mem_id", "numa_id", "offset")
#: One record run's time limit (seconds per operation, generous for TCG).
RUN_S_PER_OP = 0.5
RUN_MIN_S = 300.0
GUEST_OUT = "/tmp/obmm-fuzz-diff.jsonl"
#: On both nodes, so both run alike: no khugepaged.  The real driver's EXPORT_PID holds its mm's
#: mmap lock for read around pin_user_pages_fast() (obmm_export_from_user.c:
#: alloc_export_memory_pid), whose slow path takes it again; a writer queued in between
#: (khugepaged collapsing a huge page of the fuzzer) deadlocks both, and the node panics on the
#: hung task (FIDELITY, "EXPORT_PID of the caller's own memory").
NO_KHUGEPAGED = "echo never > /sys/kernel/mm/transparent_hugepage/enabled"


class FuzzDiffError(TestbedError, RuntimeError):
    """A fuzz-diff run could not be made (a node failed, a record could not be read)."""


Outcome = dict[str, Any]


@dataclass(frozen=True)
class Explained:
    """A difference that is understood: which operation kind, how to recognise it, why."""

    kind: str
    reason: str
    matches: Callable[[Outcome, Outcome], bool]


def _errnos(outcome: Outcome) -> list[str]:
    return list(outcome.get("errnos", []))


#: Differences with a known cause (kmod/obmm_emu/FIDELITY.md, kmod/ub_compat/README.md).
EXPLAINED: tuple[Explained, ...] = (
    # The real driver splits the VMA at an UPDATE_RANGE's bounds (obmm_shm_dev.c:
    # obmm_shm_update_range); obmm_emu keeps one VMA (split_vma() is not exported: FIDELITY,
    # "UPDATE_RANGE effect").  A move of the whole mapping then fails in the core's VMA length
    # check (EFAULT) before the driver's mremap refusal (EOPNOTSUPP) the emulator gives.
    Explained(
        "mremap",
        "VMA split at UPDATE_RANGE bounds (real driver only): move EFAULT, not EOPNOTSUPP",
        lambda e, r: _errnos(e) == ["EOPNOTSUPP"] and _errnos(r) == ["EFAULT"],
    ),
    # A declaration past every fabric window: obmm_emu refuses it as not UB memory before
    # probing iomem (FIDELITY, "DECLARE_PREIMPORT of a range outside every fabric window"); the
    # real driver inserts PREIMPORT_UBMEM first (obmm_resource.c:setup_ubmem_resource), EBUSY
    # where the range partly overlaps a resource.
    *(
        Explained(
            kind,
            "DECLARE_PREIMPORT outside every window: EINVAL before iomem, real EBUSY",
            lambda e, r: _errnos(e) == ["EINVAL"] and _errnos(r) == ["EBUSY"],
        )
        for kind in ("declare_big", "preimport")
    ),
)


def key(outcome: Outcome) -> dict[str, Any]:
    return {k: outcome[k] for k in COMPARED if k in outcome}


@dataclass
class Comparison:
    """Two record runs of one operation list, compared."""

    per_kind: dict[str, dict[str, Any]] = field(default_factory=dict)
    first_unexplained: tuple[int, Outcome, Outcome] | None = None
    compared: int = 0

    def count(self, kind: str, bucket: str, reason: str = "") -> None:
        entry = self.per_kind.setdefault(kind, {"passed": 0, "differs": {}, "skipped": {}})
        if bucket == "passed":
            entry["passed"] += 1
        else:
            entry[bucket][reason] = entry[bucket].get(reason, 0) + 1


def compare(emu: Sequence[Outcome], real: Sequence[Outcome]) -> Comparison:
    """Outcome by outcome, up to the first unexplained difference (or the shorter run's end)."""
    result = Comparison()
    real_by_op = {o["op"]: o for o in real}
    for e in emu:
        r = real_by_op.get(e["op"])
        if r is None:
            break
        result.compared += 1
        kind = e["kind"]
        if key(e) == key(r):
            if "skipped" in e:
                result.count(kind, "skipped", e["skipped"])
            else:
                result.count(kind, "passed")
            continue
        why = next((x.reason for x in EXPLAINED if x.kind == kind and x.matches(e, r)), None)
        if why is None:
            result.first_unexplained = (e["op"], e, r)
            result.count(kind, "differs", "unexplained")
            break
        result.count(kind, "differs", why)
    return result


def parse_records(text: str) -> list[Outcome]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class Side:
    """One single-node cluster running one driver, and record runs on it."""

    def __init__(self, driver: str, name: str) -> None:
        self.driver = driver
        results = results_dir()
        self.session = GuestSession(
            Settings.from_env(driver=driver, name=name, topology="single"),
            logdir=results / "qemu" / name,
            results=results,
            purpose="fuzz-diff",
        )

    def record(
        self, seed: int, ops: int, only: Sequence[int] = (), skip_exports: Sequence[int] = ()
    ) -> tuple[list[Outcome], str]:
        """One record run: the outcomes, and the fuzzer's last line or failure."""
        args = ["--seed", str(seed), "--ops", str(ops), "--record", GUEST_OUT]
        if only:
            args += ["--only", ",".join(str(i) for i in only)]
        if skip_exports:
            args += ["--skip-exports", ",".join(str(i) for i in skip_exports)]
        cmd = (
            f"{NO_KHUGEPAGED}; cd {GUEST_ROOT} && PYTHONPATH=pylib python3 -m obmm.fuzz "
            + " ".join(shlex.quote(a) for a in args)
            + f"; status=$?; cat {GUEST_OUT} >&2; exit $status"
        )
        timeout = max(RUN_MIN_S, RUN_S_PER_OP * (len(only) or ops))
        with self.session.connect(0) as conn:
            result = conn.run(cmd, timeout=timeout)
        if "fuzz-result" not in result.out:
            raise self.unfinished(result.exit_status, result.out, result.err)
        failure = next((ln for ln in result.out.splitlines() if ln.startswith("FUZZ FAILURE")), "")
        return parse_records(result.err), failure

    def unfinished(self, status: int, out: str, err: str) -> FuzzDiffError:
        """The error for a fuzzer that ended without its result line.  Its whole output (a
        traceback, a kernel's kill) goes to results/fuzz-diff-<driver>.log; the message, whose
        first line is all the CLI prints, names that file and the output's last line."""
        # stderr carries the records (JSON lines) and whatever else the fuzzer said
        lines = err.splitlines()
        said = [ln for ln in lines if not ln.startswith("{")]
        done = len(lines) - len(said)
        log = results_dir() / f"fuzz-diff-{self.driver}.log"
        log.write_text(f"exit status {status}\n--- stdout\n{out}\n--- stderr\n{err}\n")
        last = next((ln.strip() for ln in reversed(said) if ln.strip()), "nothing on stderr")
        # the guest shell's status: 128 + N for a fuzzer killed by signal N
        died = f" (signal {status - 128}: see the node's console)" if status > 128 else ""
        return FuzzDiffError(
            f"{self.driver}: the fuzzer did not finish: exit status {status}{died}, after "
            f"{done} operation(s): {last} (its output: {log})\n" + "\n".join(said)[-1500:]
        )

    def close(self) -> None:
        self.session.close()


def scattered(outcomes: Sequence[Outcome]) -> list[int]:
    """The EXPORT operations a run left out because its pool scattered them."""
    return [o["op"] for o in outcomes if o.get("scattered")]


def record_pair(
    sides: Sequence[Side], seed: int, ops: int, only: Sequence[int] = ()
) -> tuple[tuple[list[Outcome], str], tuple[list[Outcome], str]]:
    """The real driver's run, then the emulator's with the exports the real pool scattered
    left out too (the engine's ``SCATTERED``): both end each operation in the same state."""
    emu_side, real_side = sides
    real = real_side.record(seed, ops, only)
    emu = emu_side.record(seed, ops, only, skip_exports=scattered(real[0]))
    return emu, real


def shrink(
    sides: Sequence[Side], seed: int, ops: int, index: int, budget_s: float
) -> tuple[list[int], int]:
    """The fewest operations before ``index`` (``index`` itself kept last) for which the two
    drivers still differ at ``index`` the same unexplained way; (indexes, candidate runs)."""
    prefix = [op for op in generate(seed, ops) if op.index < index]
    target = next(op for op in generate(seed, index + 1) if op.index == index)

    def differs(candidate: Sequence[Any]) -> bool:
        only = [op.index for op in candidate] + [index]
        (emu, _), (real, _) = record_pair(sides, seed, ops, only)
        e = next((o for o in emu if o["op"] == index), None)
        r = next((o for o in real if o["op"] == index), None)
        return e is not None and r is not None and key(e) != key(r)

    tail, runs = suffix_first(prefix, differs, budget_s=budget_s / 2)
    small, more = ddmin(tail, differs, budget_s=budget_s / 2) if tail else (tail, 0)
    return [op.index for op in small] + [target.index], runs + more


def report_markdown(summary: Mapping[str, Any]) -> str:
    lines = [
        f"# fuzz-diff: seed {summary['seed']}, {summary['compared']} of {summary['ops']} "
        "operations compared",
        "",
        "| operation | passed on both | differs (why) | skipped (why) |",
        "|---|---|---|---|",
    ]
    for kind, entry in sorted(summary["per_kind"].items()):
        differs = "; ".join(f"{n} {why}" for why, n in entry["differs"].items()) or "0"
        skipped = "; ".join(f"{n} {why}" for why, n in entry["skipped"].items()) or "0"
        lines.append(f"| {kind} | {entry['passed']} | {differs} | {skipped} |")
    if summary.get("unexplained"):
        u = summary["unexplained"]
        lines += [
            "",
            f"First unexplained difference at operation {u['op']} ({u['kind']}):",
            f"emulator `{json.dumps(u['emu'])}`, real `{json.dumps(u['real'])}`.",
        ]
        if u.get("reproducer"):
            replay = (
                f"python3 -m obmm.fuzz --seed {summary['seed']} --ops {summary['ops']} "
                f"--record FILE --only {u['reproducer']}"
            )
            lines.append(f"Reproducer: `{replay}` on both.")
    for side, failure in summary.get("failures", {}).items():
        if failure:
            lines.append(f"\n{side}: {failure}")
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--ops", type=int, default=DEFAULT_OPS)
    parser.add_argument("--shrink-budget", type=float, default=1200.0, help="seconds")
    parser.add_argument("--out", type=Path, help="JSON result (default results/fuzz-diff.json)")


def command(args: argparse.Namespace) -> int:
    """Boot both nodes, record, compare, shrink a difference; 0 when nothing is unexplained."""
    out = args.out or results_dir() / "fuzz-diff.json"
    stamp = time.strftime("%H%M%S")
    sides = [
        Side(kbuild.DRIVER_EMU, f"fuzz-diff-emu-{stamp}"),
        Side(kbuild.DRIVER_REAL, f"fuzz-diff-real-{stamp}"),
    ]
    try:
        try:
            # One after the other, in this thread: QEMU dies with the thread that started it
            # (PR_SET_PDEATHSIG), so a worker thread must not boot it.
            for side in sides:
                side.session.boot()
        except kbuild.UpstreamMissing as exc:
            print(note_input_skip(f"fuzz-diff: skipped: {exc}"))
            return 0
        t0 = time.monotonic()
        (emu, emu_fail), (real, real_fail) = record_pair(sides, args.seed, args.ops)
        elapsed = time.monotonic() - t0
        result = compare(emu, real)
        summary: dict[str, Any] = {
            "seed": args.seed,
            "ops": args.ops,
            "compared": result.compared,
            "seconds": round(elapsed, 1),
            "per_kind": result.per_kind,
            "failures": {"emu": emu_fail, "real": real_fail},
        }
        status = 1 if emu_fail or real_fail else 0
        if result.first_unexplained is not None:
            index, e, r = result.first_unexplained
            summary["unexplained"] = {"op": index, "kind": e["kind"], "emu": e, "real": r}
            print(f"fuzz-diff: operation {index} ({e['kind']}) differs: emulator {key(e)}, "
                  f"real {key(r)}; shrinking", flush=True)  # fmt: skip
            only, runs = shrink(sides, args.seed, args.ops, index, args.shrink_budget)
            summary["unexplained"]["reproducer"] = ",".join(str(i) for i in only)
            summary["unexplained"]["shrink_runs"] = runs
            status = 1
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=2) + "\n")
        out.with_suffix(".md").write_text(report_markdown(summary))
        print(report_markdown(summary))
        print(f"fuzz-diff: {result.compared} operations compared in {elapsed:.0f} s; {out}")
        return status
    finally:
        for side in sides:
            side.close()
