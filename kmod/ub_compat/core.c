// SPDX-License-Identifier: GPL-2.0
/*
 * ub_compat: module init and exit, the composition root: the only file
 * that calls every other one; none calls into it.
 *
 * Bring-up, in order (each step unwound in reverse): this node (its
 * identity and the fabric windows, node.c), the export pool, numa_remote,
 * the mm helpers, /sys/kernel/ub_compat, the UB controller.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>

#include "ub_compat.h"
#include "ub_compat_priv.h"

static int __init ub_compat_init(void)
{
	int ret;

	ret = ub_compat_node_init();
	if (ret)
		return ret;
	ret = ub_compat_pool_init(ub_compat_pool_base(), ub_compat_pool_size(),
				  ub_compat_controller_nid());
	if (ret)
		goto err_fabric;
	ret = ub_compat_numa_remote_init();
	if (ret)
		goto err_pool;
	ub_compat_mm_init();
	ret = ub_compat_sysfs_init();
	if (ret)
		goto err_numa_remote;
	ret = ub_compat_controller_init();
	if (ret)
		goto err_sysfs;
	pr_info("node %d, cna 0x%x, eid 0x%x, pool %#lx bytes\n",
		ub_compat_node_id, ub_compat_cna(), ub_compat_eid(),
		ub_compat_pool_size());
	return 0;

err_sysfs:
	ub_compat_sysfs_exit();
err_numa_remote:
	ub_compat_numa_remote_exit();
err_pool:
	ub_compat_pool_exit();
err_fabric:
	ub_compat_node_exit();
	return ret;
}

static void __exit ub_compat_exit(void)
{
	ub_compat_controller_exit();
	ub_compat_sysfs_exit();
	ub_compat_ummu_exit();
	ub_compat_numa_remote_exit();
	ub_compat_pool_exit();
	ub_compat_node_exit();
}

module_init(ub_compat_init);
module_exit(ub_compat_exit);

MODULE_DESCRIPTION("obmm-testbed: what the UB drivers take from an OLK kernel, on a stock kernel");
MODULE_LICENSE("GPL");
