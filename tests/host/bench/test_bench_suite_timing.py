"""make bench --suites: whole-suite wall times, interleaved; failed runs reported, not counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from obmm.bench import suite_timing


def test_samples_interleave_after_one_warm_up_and_failures_are_not_samples(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    times = {"qemu-test.warm": iter([100.0, 95.0]), "qemu-test.cold": iter([300.0, 310.0, 305.0])}
    log = tmp_path / "x.log"
    log.write_text("last line of the failed run\n")

    def runner(suite: str, checkout: Path, logdir: Path) -> tuple[int, float, Path]:
        calls.append(suite)
        if len(calls) == 1:
            return 0, 999.0, log  # the warm-up: never a sample
        if len(calls) == 4:
            return 2, 12.0, log  # the second warm run fails
        return 0, next(times[suite]), log

    said: list[str] = []
    figs = suite_timing.suite_figures(
        ["qemu-test.warm", "qemu-test.cold"], 3, tmp_path, tmp_path, said.append, runner
    )
    assert calls == ["qemu-test.warm"] + ["qemu-test.warm", "qemu-test.cold"] * 3
    by_name = {f.name: f for f in figs}
    warm, cold = by_name["testbed.qemu_test.warm"], by_name["testbed.qemu_test.cold"]
    assert warm.samples == [100.0, 95.0]
    assert cold.samples == [300.0, 310.0, 305.0]
    assert warm.baseline == "testbed.qemu_test.cold"
    assert "1 failed run(s) not counted" in warm.note
    assert any("FAILED (exit 2)" in s and "last line of the failed run" in s for s in said)


def test_unknown_suite_is_refused_before_anything_runs(tmp_path: Path) -> None:
    def runner(suite: str, checkout: Path, logdir: Path) -> tuple[int, float, Path]:
        raise AssertionError("ran")

    with pytest.raises(ValueError, match="unknown suite"):
        suite_timing.suite_figures(["qemu-test.hot"], 1, tmp_path, tmp_path, print, runner)


def test_a_suite_with_no_green_run_has_no_figure(tmp_path: Path) -> None:
    def runner(suite: str, checkout: Path, logdir: Path) -> tuple[int, float, Path]:
        return 1, 5.0, tmp_path / "none.log"

    assert (
        suite_timing.suite_figures(["make-test.fresh"], 2, tmp_path, tmp_path, print, runner) == []
    )


def test_cold_runs_get_an_empty_cache_that_is_removed_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []

    def fake_timed(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[int, float]:
        cache = Path(env["CACHE_VAR"])
        assert not cache.exists() or not any(cache.iterdir())
        seen.append(str(cache))
        return 0, 1.0

    monkeypatch.setattr(suite_timing, "_timed", fake_timed)
    rc, secs, _ = suite_timing.run_once("qemu-test.cold", tmp_path, tmp_path / "logs", "CACHE_VAR")
    assert (rc, secs) == (0, 1.0)
    assert seen and not Path(seen[0]).parent.exists()


def test_sigterm_stops_the_run_in_progress_and_removes_its_scratch(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    checkout, scratch_root = tmp_path / "checkout", tmp_path / "tmp"
    checkout.mkdir()
    scratch_root.mkdir()
    # `make qemu-test` stand-in: says it started, unwinds on TERM (as pytest stops its nodes).
    (checkout / "Makefile").write_text(
        "qemu-test:\n"
        f"\t@trap 'touch {tmp_path}/unwound; exit 143' TERM; touch {tmp_path}/started; "
        "while :; do sleep 0.05; done\n"
    )
    code = (
        "from pathlib import Path; from obmm.bench import suite_timing as st\n"
        f"st.suite_figures(['qemu-test.cold'], 1, Path({str(checkout)!r}), "
        f"Path({str(tmp_path / 'logs')!r}), print, "
        "lambda s, c, l: st.run_once(s, c, l, 'CACHE_VAR'))\n"
    )
    env = {**os.environ, "TMPDIR": str(scratch_root), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the run never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err
    assert (tmp_path / "unwound").exists()  # the run was stopped, not orphaned
    assert list(scratch_root.iterdir()) == []  # its empty cache is gone
