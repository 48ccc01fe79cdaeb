// SPDX-License-Identifier: GPL-2.0
/*
 * kunit_run: run the KUnit suites linked into a loaded module, on a kernel
 * built without CONFIG_KUNIT.
 *
 * Such a kernel's module loader does not collect a module's
 * .kunit_test_suites section (struct module has no kunit_suites), so a test
 * module loads but its suites never run, even with kunit.ko (built out of
 * tree) loaded. This module runs them: the caller names the module, the
 * address of its .kunit_test_suites section (from
 * /sys/module/<target>/sections/) and the number of suite pointers in it
 * (the section's size in the .ko over the size of a pointer). The section
 * and every suite it points to must lie in the named module, else nothing
 * runs and loading fails with -EINVAL.
 *
 * The results go to the kernel log as one KTAP document: the version line
 * and plan written here, then each suite as KUnit prints it.
 */

#include <kunit/test.h>
#include <linux/kallsyms.h>
#include <linux/module.h>
#include <linux/string.h>

static char *target;
module_param(target, charp, 0444);
MODULE_PARM_DESC(target, "name of the loaded module whose suites to run");

static unsigned long suites;
module_param(suites, ulong, 0444);
MODULE_PARM_DESC(suites, "address of the target's .kunit_test_suites section");

static uint count;
module_param(count, uint, 0444);
MODULE_PARM_DESC(count, "number of suite pointers in that section");

/* Whether kallsyms places @addr in a symbol of module @name. */
static bool kunit_run_in_module(unsigned long addr, const char *name)
{
	char sym[KSYM_SYMBOL_LEN];
	char tail[MODULE_NAME_LEN + 3];
	size_t len, tail_len;

	len = sprint_symbol(sym, addr);
	tail_len = snprintf(tail, sizeof(tail), " [%s]", name);
	return len > tail_len && !strcmp(sym + len - tail_len, tail);
}

static int __init kunit_run_init(void)
{
	struct kunit_suite **list = (struct kunit_suite **)suites;
	uint i;

	if (!target || !suites || !count) {
		pr_err("kunit_run: target, suites and count are required\n");
		return -EINVAL;
	}
	for (i = 0; i < count; i++) {
		if (!kunit_run_in_module((unsigned long)&list[i], target) ||
		    !list[i] || !kunit_run_in_module((unsigned long)list[i], target)) {
			pr_err("kunit_run: suite pointer %u of %u is not in module %s\n",
			       i, count, target);
			return -EINVAL;
		}
	}

	pr_info("KTAP version 1\n");
	pr_info("1..%u\n", count);
	__kunit_test_suites_init(list, count);
	__kunit_test_suites_exit(list, count);
	return 0;
}
module_init(kunit_run_init);

static void __exit kunit_run_exit(void)
{
}
module_exit(kunit_run_exit);

MODULE_DESCRIPTION("Run a loaded module's KUnit suites on a kernel without CONFIG_KUNIT");
MODULE_LICENSE("GPL");
