"""obmm.tools.ktap: KUnit's KTAP output, as a guest's kernel log carries it, into per-case results.

The logs below are what the guests printed (``dmesg``) for the series' suite and for
kmod/kunit_compat/kunit_selftest (one case passes, one fails, one skips); the ubcore lines between
are shortened.
"""

from __future__ import annotations

import pytest

from obmm.tools import ktap

SERIES_RUN = """\
obmm-patch-check: kunit start
[   18.954695] URMA|ubcore|146|146|ubcore_register_client:[369]|ubmad register success.
[   19.142677] KTAP version 1
[   19.142839] 1..1
[   19.142936]     KTAP version 1
[   19.142985]     # Subtest: ubcore_seg_map
[   19.143058]     1..6
[   19.144808]     ok 1 seg_map_flag_layout_test
[   19.145632]     ok 2 seg_map_check_nomap_test
[   19.146014]     ok 3 seg_map_check_access_test
[   19.146292]     ok 4 seg_map_check_range_test
[   19.151360]     ok 5 seg_map_vm_flags_test
[   19.151743]     ok 6 seg_map_pgprot_test
[   19.151830] # ubcore_seg_map: pass:6 fail:0 skip:0 total:6
[   19.151909] # Totals: pass:6 fail:0 skip:0 total:6
[   19.152034] ok 1 ubcore_seg_map
[   23.739186] URMA|ubcore|179|179|ubcore_unregister_client:[416]|urma unregister success.
"""
SERIES_CASES = [
    f"ubcore_seg_map.{c}"
    for c in (
        "seg_map_flag_layout_test",
        "seg_map_check_nomap_test",
        "seg_map_check_access_test",
        "seg_map_check_range_test",
        "seg_map_vm_flags_test",
        "seg_map_pgprot_test",
    )
]

MIXED_RUN = """\
[   11.082560] KTAP version 1
[   11.082740] 1..2
[   11.082841]     KTAP version 1
[   11.082892]     # Subtest: kunit_selftest_pass
[   11.082987]     1..2
[   11.084809]     ok 1 selftest_pass_one
[   11.085568]     ok 2 selftest_pass_two
[   11.085689] # kunit_selftest_pass: pass:2 fail:0 skip:0 total:2
[   11.085789] # Totals: pass:2 fail:0 skip:0 total:2
[   11.085969] ok 1 kunit_selftest_pass
[   11.086119]     KTAP version 1
[   11.086166]     # Subtest: kunit_selftest_mixed
[   11.086233]     1..3
[   11.086534]     ok 1 selftest_pass_one
[   11.087415]     # selftest_fails: EXPECTATION FAILED at kunit_selftest.c:27
                   Expected answer == 42, but
                       answer == 41
{blank}
               the expected failure
[   11.087635]     not ok 2 selftest_fails
[   11.088200]     ok 3 selftest_skips # SKIP the expected skip
[   11.088268] # kunit_selftest_mixed: pass:1 fail:1 skip:1 total:3
[   11.088354] # Totals: pass:1 fail:1 skip:1 total:3
[   11.088451] not ok 2 kunit_selftest_mixed
""".format(blank=" " * 15)  # dmesg indents a record's empty continuation line too


def test_a_passing_run_is_every_case_passed() -> None:
    doc = ktap.parse(SERIES_RUN)
    assert doc.plan == 1
    assert [t.name for t in doc.tests] == ["ubcore_seg_map"]
    assert doc.tests[0].plan == 6
    assert [c.name for c in ktap.cases(doc)] == SERIES_CASES
    verdict = ktap.verdict(doc, SERIES_CASES)
    assert verdict.ok
    assert verdict.summary() == "6/6 passed"


def test_failed_and_skipped_cases_are_told_apart_with_their_text() -> None:
    doc = ktap.parse(MIXED_RUN)
    got = {c.name: c for c in ktap.cases(doc)}
    assert {n: c.status for n, c in got.items()} == {
        "kunit_selftest_pass.selftest_pass_one": ktap.PASS,
        "kunit_selftest_pass.selftest_pass_two": ktap.PASS,
        "kunit_selftest_mixed.selftest_pass_one": ktap.PASS,
        "kunit_selftest_mixed.selftest_fails": ktap.FAIL,
        "kunit_selftest_mixed.selftest_skips": ktap.SKIP,
    }
    failed = got["kunit_selftest_mixed.selftest_fails"].detail
    assert "EXPECTATION FAILED" in failed and "answer == 41" in failed
    assert "the expected failure" in failed
    assert got["kunit_selftest_mixed.selftest_skips"].detail == "the expected skip"
    assert [t.status for t in doc.tests] == [ktap.PASS, ktap.FAIL]
    verdict = ktap.verdict(doc, list(got))
    assert not verdict.ok
    assert verdict.summary() == "3/5 passed (1 failed; 1 skipped)"


def test_a_case_that_never_reported_is_missing_not_passed() -> None:
    """The kernel died in case 4: cases 4-6 and the suite's own line never came."""
    cut = SERIES_RUN[: SERIES_RUN.index("[   19.146292]")]
    doc = ktap.parse(cut)
    verdict = ktap.verdict(doc, SERIES_CASES)
    assert not verdict.ok
    assert verdict.passed == tuple(SERIES_CASES[:3])
    assert verdict.missing == tuple(SERIES_CASES[3:])
    assert verdict.summary().startswith("3/6 passed (missing: ubcore_seg_map.seg_map_check_range")


def test_a_plan_that_promises_more_than_was_printed_fails_even_with_all_declared_cases() -> None:
    text = SERIES_RUN.replace("    1..6", "    1..7")
    verdict = ktap.verdict(ktap.parse(text), SERIES_CASES)
    assert verdict.gaps == ("ubcore_seg_map: 6 of 7 reported",)
    assert not verdict.ok


def test_a_result_no_source_declares_is_reported() -> None:
    verdict = ktap.verdict(ktap.parse(SERIES_RUN), SERIES_CASES[:-1])
    assert verdict.unexpected == (SERIES_CASES[-1],)
    assert not verdict.ok


@pytest.mark.parametrize("text", ["", "no ktap here\nok 1 not-after-a-version-line\n"])
def test_no_ktap_is_no_result(text: str) -> None:
    doc = ktap.parse(text)
    assert ktap.cases(doc) == []
    verdict = ktap.verdict(doc, SERIES_CASES)
    assert verdict.missing == tuple(SERIES_CASES) and not verdict.ok
    assert not ktap.verdict(doc, []).ok  # nothing expected is nothing proven


def test_a_parameterised_case_is_one_case() -> None:
    text = """\
KTAP version 1
1..1
    KTAP version 1
    # Subtest: suite
    1..1
        KTAP version 1
        # Subtest: param_case
        ok 1 param-0
        ok 2 param-1
    ok 1 param_case
ok 1 suite
"""
    assert ktap.cases(ktap.parse(text)) == [ktap.Case("suite.param_case", ktap.PASS)]


def test_declared_cases_are_read_from_the_registered_suites() -> None:
    source = """
static struct kunit_case a_cases[] = {
	KUNIT_CASE(first),
	KUNIT_CASE_PARAM(second, gen_params),
	{}
};
static struct kunit_case unused_cases[] = {
	KUNIT_CASE(never),
	{}
};
static struct kunit_suite a_suite = {
	.name = "a",
	.test_cases = a_cases,
};
static struct kunit_suite unregistered = {
	.name = "b",
	.test_cases = unused_cases,
};
kunit_test_suite(a_suite);
"""
    assert ktap.declared_cases(source) == ["a.first", "a.second"]
