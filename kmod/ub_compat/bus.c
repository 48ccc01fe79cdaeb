// SPDX-License-Identifier: GPL-2.0
/*
 * ub_compat: the UB bus controller's memory decoder, as the OBMM driver
 * asks it (drivers/ub/ubus/memory.c, ubus_controller.c upstream).
 *
 * The testbed's decoder is prefilled: every node's window onto every
 * node's RAM is mapped before any import (kmod/common/testbed_fabric.h).
 * This node has one controller, of CNA ub_compat_cna().
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/numa.h>

#include <ub/ubus/ubus.h>

#include "ub_compat.h"
#include "ub_compat_priv.h"

/*
 * ub_feature_get(): the bus's feature bits, from the UB management
 * subsystem.  Here: memory borrowing and sharing, both cacheable and not,
 * when this node's own window is present; none otherwise (the driver
 * then refuses every ioctl with EOPNOTSUPP).
 */
unsigned long long ub_feature_get(void)
{
	if (!ub_compat_fabric_present())
		return 0;
	return UB_MEM_BORROW_NC | UB_MEM_BORROW_CC | UB_MEM_SHARE_NC |
	       UB_MEM_SHARE_CC;
}
EXPORT_SYMBOL_GPL(ub_feature_get);

/*
 * ub_mem_get_numa_id(): the NUMA node of the controller of CNA @scna, or
 * NUMA_NO_NODE (logged) when no controller has it.  Same here, with one
 * controller on the first online node.
 */
int ub_mem_get_numa_id(u32 scna)
{
	if (!ub_compat_fabric_present() || scna != ub_compat_cna()) {
		pr_err("No ubc has cna of %u\n", scna);
		return NUMA_NO_NODE;
	}
	return ub_compat_controller_nid();
}
EXPORT_SYMBOL_GPL(ub_mem_get_numa_id);

/*
 * ub_mem_drain_start/state(): drain the controller's write queue towards
 * remote memory, and poll for its end.  The windows are shared RAM with
 * no queue: a drain is over as soon as it starts.
 */
void ub_mem_drain_start(u32 scna)
{
}
EXPORT_SYMBOL_GPL(ub_mem_drain_start);

int ub_mem_drain_state(u32 scna)
{
	return 1;
}
EXPORT_SYMBOL_GPL(ub_mem_drain_state);
