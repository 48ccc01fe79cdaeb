"""KUnit on the guests' kernel (built without it), end to end: kunit.ko and kunit_run.ko made
by obmm.testbed.builds.kunitbuild, kmod/kunit_compat/kunit_selftest's suites (results known: 3 pass,
1 fails, 1 skips) run in a node of their own, the kernel log read back by obmm.tools.ktap.
What `make patch-check` relies on to say "N/N passed" for the URMA_SEG_MAPPED series."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from obmm.testbed import paths
from obmm.testbed.builds import kheaders, kunitbuild, urmabuild
from obmm.testbed.builds.image import Image, ensure_image
from obmm.testbed.progress import Progress
from obmm.testbed.stages import kunitguest
from obmm.tools import ktap


@pytest.fixture(scope="module")
def image() -> Image:
    return ensure_image()


@pytest.fixture(scope="module")
def modules(image: Image, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """kunit.ko, kunit_selftest.ko, kunit_run.ko, stripped, in load order."""
    out = tmp_path_factory.mktemp("kunit")
    headers = kheaders.fetch_headers(image.kernel_release)
    built = kunitbuild.build(headers, image.kernel_release, out, Progress("kunit"), selftest=True)
    assert built.selftest is not None
    return urmabuild.stripped([built.kunit, built.selftest, built.runner], out / "guest")


def test_known_results_come_back_case_by_case_and_a_foreign_section_is_refused(
    image: Image, modules: list[Path]
) -> None:
    kunit, selftest, runner = modules
    source = paths.kmod_dir() / "kunit_compat" / "kunit_selftest" / "kunit_selftest.c"
    expected = ktap.declared_cases(source.read_text())
    assert len(expected) == 5
    count = kunitguest.suite_count(selftest)
    assert count == 2
    progress = Progress("kunit-test")
    with kunitguest.node(image, name=f"kunit-test-{os.getpid()}", progress=progress) as (conn, _):
        # kunit_run checks that the section and the suites lie in the module it is told of.
        with pytest.raises(kunitguest.KunitGuestError, match=r"insmod kunit_run\.ko failed"):
            kunitguest.run_on(
                conn, kunit, [selftest], runner, "kunit_selftest", count, progress=progress,
                claim="kunit",
            )  # fmt: skip
        refused = conn.run("dmesg | tail -n 20", timeout=60).out
        assert "kunit_run: suite pointer 0 of 2 is not in module kunit" in refused
        assert conn.run("lsmod", timeout=60).out.count("kunit") == 0  # all unloaded again
        log = kunitguest.run_on(
            conn, kunit, [selftest], runner, "kunit_selftest", count, progress=progress
        )
    verdict = ktap.verdict(ktap.parse(log), expected)
    assert verdict.passed == (
        "kunit_selftest_pass.selftest_pass_one",
        "kunit_selftest_pass.selftest_pass_two",
        "kunit_selftest_mixed.selftest_pass_one",
    )
    assert [c.name for c in verdict.failed] == ["kunit_selftest_mixed.selftest_fails"]
    assert "answer == 41" in verdict.failed[0].detail
    assert [c.detail for c in verdict.skipped] == ["the expected skip"]
    assert verdict.missing == () and verdict.gaps == ()
    assert verdict.summary() == "3/5 passed (1 failed; 1 skipped)"
