"""obmm.tools.side_by_side: the jobs of `make qemu-test` run at once, prefixed, all to the end."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from obmm.tools.side_by_side import add_steps, main, parse_job, run_jobs


def test_jobs_run_at_once_and_every_line_carries_its_prefix(tmp_path: Path) -> None:
    # Each job waits for the other's file: they can only both finish if they run at once.
    a, b = tmp_path / "a", tmp_path / "b"
    wait = "for i in $(seq 100); do [ -e {f} ] && break; sleep 0.05; done; [ -e {f} ]"
    jobs = [
        parse_job(f"one=touch {a}; {wait.format(f=b)} && echo one done; echo err >&2"),
        parse_job(f"two=touch {b}; {wait.format(f=a)} && printf 'x\\ny\\n'"),
    ]
    out = io.StringIO()
    assert run_jobs(jobs, out) == 0
    lines = out.getvalue().splitlines()
    assert "[one] one done" in lines and "[one] err" in lines
    assert lines.index("[two] x") < lines.index("[two] y")
    assert lines[-2].startswith("side_by_side: one ok in ")
    assert lines[-1].startswith("side_by_side: two ok in ")
    assert all(ln.startswith(("[one] ", "[two] ", "side_by_side: ")) for ln in lines)


def test_a_failing_job_does_not_stop_the_others_and_sets_the_status(tmp_path: Path) -> None:
    marker = tmp_path / "late"
    jobs = [parse_job("fast=exit 3"), parse_job(f"slow=sleep 0.5; touch {marker}")]
    out = io.StringIO()
    assert run_jobs(jobs, out) == 3
    assert marker.exists()
    assert "side_by_side: fast FAILED (exit 3)" in out.getvalue()
    assert "side_by_side: slow ok" in out.getvalue()


def test_first_failure_in_argument_order_is_the_status() -> None:
    jobs = [parse_job("a=sleep 0.3; exit 5"), parse_job("b=exit 7")]
    assert run_jobs(jobs, io.StringIO()) == 5


@pytest.mark.parametrize("bad", ["nocommand", "=echo", "a b=echo", "x=  "])
def test_malformed_job_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([bad])
    assert exc.value.code == 2
    assert "expected NAME=COMMAND" in capsys.readouterr().err


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="must differ"):
        run_jobs([parse_job("a=true"), parse_job("a=true")], io.StringIO())


def test_sigterm_reaches_every_job_and_they_unwind(tmp_path: Path) -> None:
    # Each job traps TERM, writes that it unwound, and exits 143; none is left running.
    jobs = []
    for name in ("p", "q"):
        done = tmp_path / f"{name}.unwound"
        started = tmp_path / f"{name}.started"
        jobs.append(
            f"{name}=trap 'touch {done}; exit 143' TERM; touch {started}; "
            "while :; do sleep 0.05; done"
        )
    proc = subprocess.Popen(
        [sys.executable, "-m", "obmm.tools.side_by_side", *jobs],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    deadline = time.monotonic() + 20
    while not all((tmp_path / f"{n}.started").exists() for n in "pq"):
        assert time.monotonic() < deadline, "jobs never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 143, out
    assert (tmp_path / "p.unwound").exists() and (tmp_path / "q.unwound").exists()
    assert "side_by_side: p FAILED (exit 143)" in out


def test_each_job_is_timed_to_its_own_end() -> None:
    # The long job is listed first: the short one's time must not include the wait for it.
    out = io.StringIO()
    assert run_jobs([parse_job("long=sleep 1.5"), parse_job("short=true")], out) == 0
    times = {
        ln.split()[1]: float(ln.split(" in ")[1].split()[0]) for ln in out.getvalue().splitlines()
        if ln.startswith("side_by_side: ")
    }  # fmt: skip
    assert times["short"] < 1 <= times["long"]


BURN = (
    f"{sys.executable} -c 'import time; t = time.process_time() + 0.6\n"
    "while time.process_time() < t: pass'"
)


def test_a_job_s_cpu_counts_the_processes_its_steps_waited_for() -> None:
    # Each step burns in a grandchild (a shell's child, as pytest's QEMU is pytest's): about
    # 1.2 s over two steps; a job that sleeps uses next to none.
    jobs = add_steps(
        [parse_job(f'burn=sh -c "{BURN}"'), parse_job(f"burn+={BURN}"), parse_job("idle=sleep 1")]
    )
    out = io.StringIO()
    assert run_jobs(jobs, out) == 0
    burn, idle = jobs
    assert 1.1 <= burn.cpu_seconds < 3 and idle.cpu_seconds < 0.3
    assert re.search(r"side_by_side: burn ok in \d+ s \(CPU 1 s\)", out.getvalue())


def test_recorded_times_are_one_line_per_job_and_one_for_the_stage(tmp_path: Path) -> None:
    file = tmp_path / "results" / "stage-times.jsonl"
    argv = ["--stage", "qemu-test", "--record", str(file)]
    assert main([*argv, f"a={BURN}", "b=exit 4"]) == 4
    lines = [json.loads(ln) for ln in file.read_text().splitlines()]
    assert [(ln["kind"], ln["stage"], ln["job"], ln["status"]) for ln in lines] == [
        ("job", "qemu-test", "a", 0),
        ("job", "qemu-test", "b", 4),
        ("stage", "qemu-test", "qemu-test", 4),
    ]
    assert lines[2]["cpu_s"] == lines[0]["cpu_s"] + lines[1]["cpu_s"] >= 0.5
    assert lines[2]["wall_s"] >= lines[0]["wall_s"]


def test_plain_passes_one_job_s_output_through_unprefixed(tmp_path: Path) -> None:
    script = "from obmm.tools.side_by_side import main; main(['--plain', 'x=echo hello'])"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.splitlines()[0] == "hello"
    with pytest.raises(SystemExit):
        main(["--plain", "x=true", "y=true"])


def test_a_job_runs_its_steps_in_order_all_to_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Job "a" has three steps: the second fails, the third still runs; "a"'s status is the
    # second's.  Job "b" runs beside them.
    log = tmp_path / "log"
    status = main([
        f"a=echo one >> {log}", f"b=sleep 0.2; echo b >> {log}",
        f"a+=echo two >> {log}; exit 4", f"a+=echo three >> {log}",
    ])  # fmt: skip
    assert status == 4
    steps = [ln for ln in log.read_text().split() if ln != "b"]
    assert steps == ["one", "two", "three"]
    out = capsys.readouterr().out
    assert "side_by_side: a FAILED (exit 4)" in out and "side_by_side: b ok" in out


@pytest.mark.parametrize("args", [["x+=true"], ["a=true", "b+=true"], ["a=true", "a=true"]])
def test_a_step_needs_its_job_before_it(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no job" in err or "given twice" in err


def test_sigterm_stops_a_job_before_its_next_step(tmp_path: Path) -> None:
    started, late = tmp_path / "started", tmp_path / "late"
    proc = subprocess.Popen(
        [sys.executable, "-m", "obmm.tools.side_by_side",
         f"a=trap 'exit 143' TERM; touch {started}; while :; do sleep 0.05; done",
         f"a+=touch {late}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while not started.exists():
        assert time.monotonic() < deadline, "job never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 143, out
    assert not late.exists()


def test_a_job_that_cannot_start_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    import obmm.tools.side_by_side as sbs

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(2, "No such file or directory: '/bin/sh'")

    monkeypatch.setattr(sbs.subprocess, "Popen", refuse)
    out = io.StringIO()
    assert run_jobs([parse_job("a=true")], out) == 1
    assert "[a] cannot start: [Errno 2] No such file or directory: '/bin/sh'" in out.getvalue()
    assert "side_by_side: a FAILED (exit 1)" in out.getvalue()
