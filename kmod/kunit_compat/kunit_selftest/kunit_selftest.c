// SPDX-License-Identifier: GPL-2.0
/*
 * kunit_selftest: suites whose results are known, to prove that kunit_run.ko
 * and the host's KTAP reading report what KUnit found (tests/testbed).
 *
 * kunit_selftest_pass holds two cases that pass; kunit_selftest_mixed one
 * that passes, one that fails an expectation and one that skips.
 */

#include <kunit/test.h>
#include <linux/module.h>

static void selftest_pass_one(struct kunit *test)
{
	KUNIT_EXPECT_EQ(test, 1 + 1, 2);
}

static void selftest_pass_two(struct kunit *test)
{
	KUNIT_EXPECT_STREQ(test, "kunit", "kunit");
}

static void selftest_fails(struct kunit *test)
{
	int answer = 41;

	KUNIT_EXPECT_EQ_MSG(test, answer, 42, "the expected failure");
}

static void selftest_skips(struct kunit *test)
{
	kunit_skip(test, "the expected skip");
}

static struct kunit_case kunit_selftest_pass_cases[] = {
	KUNIT_CASE(selftest_pass_one),
	KUNIT_CASE(selftest_pass_two),
	{}
};

static struct kunit_case kunit_selftest_mixed_cases[] = {
	KUNIT_CASE(selftest_pass_one),
	KUNIT_CASE(selftest_fails),
	KUNIT_CASE(selftest_skips),
	{}
};

static struct kunit_suite kunit_selftest_pass = {
	.name = "kunit_selftest_pass",
	.test_cases = kunit_selftest_pass_cases,
};

static struct kunit_suite kunit_selftest_mixed = {
	.name = "kunit_selftest_mixed",
	.test_cases = kunit_selftest_mixed_cases,
};

kunit_test_suites(&kunit_selftest_pass, &kunit_selftest_mixed);

MODULE_DESCRIPTION("KUnit suites with known results, for kunit_run.ko's own test");
MODULE_LICENSE("GPL");
