// SPDX-License-Identifier: GPL-2.0
/*
 * ub_compat: this node's UB bus controllers in sysfs, where libobmm's
 * vendor adaptor, obmm.identity and ubs-test read them, in the layout the
 * emulated driver prints too (one copy: kmod/common/ub_controller.c, the
 * UB bus driver's sysfs.c upstream):
 *
 *   /sys/devices/ub_bus_controller<ubc_index + k>/<ubc_dev[k]>/
 *   /sys/bus/ub/{ub_feature,cluster,instance}
 *
 * Controller 0 has the node's CNA and EID; controller k adds k times
 * UB_COMPAT_UBC_ID_STRIDE, as in the emulated driver.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/errno.h>
#include <linux/moduleparam.h>
#include <linux/printk.h>

#include <ub/ubus/ubus.h>

#include "ub_compat.h"
#include "ub_compat_priv.h"
#include "ub_controller.h"

#define UB_COMPAT_UBC_ID_STRIDE	0x100

static unsigned int ubc_index;
module_param(ubc_index, uint, 0444);
MODULE_PARM_DESC(ubc_index,
		 "Index i of the first controller's /sys/devices/ub_bus_controller<i>/ (0..7, default 0)");

static char *ubc_dev[TB_UBC_MAX] = { "00001" };
static unsigned int ubc_count = 1;
module_param_array(ubc_dev, charp, &ubc_count, 0444);
MODULE_PARM_DESC(ubc_dev,
		 "Device directory name of each controller under ub_bus_controller<ubc_index + k>/ (default \"00001\": one controller)");

static u32 ub_compat_ubc_cna(unsigned int k)
{
	return ub_compat_cna() + k * UB_COMPAT_UBC_ID_STRIDE;
}

static u32 ub_compat_ubc_eid(unsigned int k)
{
	return ub_compat_eid() + k * UB_COMPAT_UBC_ID_STRIDE;
}

static u64 ub_compat_ubc_feature(void)
{
	return ub_feature_get();
}

static const struct tb_ubc_source ub_compat_ubc_source = {
	.cna = ub_compat_ubc_cna,
	.eid = ub_compat_ubc_eid,
	.pxm = ub_compat_controller_nid,
	.feature = ub_compat_ubc_feature,
};

int ub_compat_controller_init(void)
{
	unsigned int k;

	if (ubc_index + ubc_count > TB_UBC_MAX) {
		pr_err("ubc_index %u out of range (0..%u for %u controller(s))\n",
		       ubc_index, TB_UBC_MAX - ubc_count, ubc_count);
		return -EINVAL;
	}
	for (k = 0; k < ubc_count; k++) {
		if (!tb_ubc_devname_valid(ubc_dev[k])) {
			pr_err("ubc_dev \"%s\" is not a directory name (1..%d characters, no '/')\n",
			       ubc_dev[k], TB_UBC_DEV_MAX);
			return -EINVAL;
		}
	}
	return tb_ubc_init(&ub_compat_ubc_source, ubc_index, ubc_dev, ubc_count);
}

void ub_compat_controller_exit(void)
{
	tb_ubc_exit();
}
