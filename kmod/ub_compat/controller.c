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
#include <ub/ubus/ubus.h>

#include "ub_compat.h"
#include "ub_compat_priv.h"
#include "ub_controller.h"

#define UB_COMPAT_UBC_ID_STRIDE	0x100

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
	return tb_ubc_init(&ub_compat_ubc_source);
}

void ub_compat_controller_exit(void)
{
	tb_ubc_exit();
}
