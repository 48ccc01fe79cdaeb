// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_testhook - placeholder module for the obmm-testbed plumbing tests.
 *
 * Creates /dev/obmm_testhook (root only).  Reading it returns a fixed
 * banner; writing a command makes the kernel emit the matching splat so
 * the testbed can prove that its log scanner and crash handling see it:
 *
 *   warn   WARN(1, ...)      - non-fatal splat, machine keeps running
 *   oops   NULL dereference  - oops; with oops=panic the guest dies
 *   panic  panic(...)        - the guest dies
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/compiler.h>
#include <linux/fs.h>
#include <linux/kernel.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#define TESTHOOK_NAME		"obmm_testhook"
#define TESTHOOK_BANNER		"obmm_testhook ready\n"
/* Longest command plus a trailing newline from `echo`. */
#define TESTHOOK_CMD_MAX	16

static ssize_t testhook_read(struct file *file, char __user *buf,
			     size_t count, loff_t *ppos)
{
	return simple_read_from_buffer(buf, count, ppos, TESTHOOK_BANNER,
				       strlen(TESTHOOK_BANNER));
}

/*
 * Store through a NULL pointer the compiler cannot see through, so the
 * fault really happens at run time instead of being optimised away.
 */
static noinline void testhook_oops(void)
{
	int *ptr = NULL;

	OPTIMIZER_HIDE_VAR(ptr);
	pr_emerg("oops requested by test\n");
	WRITE_ONCE(*ptr, 0);
}

static ssize_t testhook_write(struct file *file, const char __user *buf,
			      size_t count, loff_t *ppos)
{
	char cmd[TESTHOOK_CMD_MAX];
	size_t len = min(count, sizeof(cmd) - 1);

	if (copy_from_user(cmd, buf, len))
		return -EFAULT;
	cmd[len] = '\0';
	strim(cmd);

	if (!strcmp(cmd, "warn")) {
		WARN(1, "obmm_testhook: WARN requested by test\n");
	} else if (!strcmp(cmd, "oops")) {
		testhook_oops();
	} else if (!strcmp(cmd, "panic")) {
		panic("obmm_testhook: panic requested by test\n");
	} else {
		pr_info("unknown command '%s'\n", cmd);
		return -EINVAL;
	}

	return count;
}

static const struct file_operations testhook_fops = {
	.owner = THIS_MODULE,
	.read = testhook_read,
	.write = testhook_write,
	.llseek = default_llseek,
};

static struct miscdevice testhook_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = TESTHOOK_NAME,
	.fops = &testhook_fops,
	.mode = 0600,
};

static int __init testhook_init(void)
{
	int ret;

	ret = misc_register(&testhook_dev);
	if (ret) {
		pr_err("misc_register failed: %d\n", ret);
		return ret;
	}

	pr_info("loaded\n");
	return 0;
}

static void __exit testhook_exit(void)
{
	misc_deregister(&testhook_dev);
	pr_info("unloaded\n");
}

module_init(testhook_init);
module_exit(testhook_exit);

MODULE_DESCRIPTION("obmm-testbed plumbing hook: triggers WARN, oops or panic on request");
MODULE_AUTHOR("obmm-testbed contributors");
MODULE_LICENSE("GPL");
