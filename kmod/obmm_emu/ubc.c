// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: the emulated UB bus controllers: their identity (module
 * parameters ubc_index, ubc_dev; the fabric's CNA and EID) and the bus's
 * feature bits.  What sysfs shows of them, as the real UB bus prints it,
 * is one copy shared with ub_compat (kmod/common/ub_controller.c):
 *
 *   /sys/devices/ub_bus_controller<ubc_index + k>/<ubc_dev[k]>/
 *   /sys/bus/ub/{ub_feature,cluster,instance}
 *
 * One controller per ubc_dev name, k = 0, 1, ...; the testbed loads two,
 * as UB hosts have (ub_bus_controller0/00001, ub_bus_controller1/00002),
 * and a program that hard-codes its host's path runs unchanged once the
 * module is loaded with that name.  Controller 0 has the node's CNA and
 * EID (the control region's); controller k the next ones out of the
 * fabric's use (obmm_ubc_cna()).  An IMPORT's scna may be any of them.
 */
#include <linux/bits.h>
#include <linux/types.h>

#include "fabric.h"
#include "pool.h"
#include "ubc.h"
#include "ub_controller.h"

/*
 * CNAs and EIDs of controllers past the first: node CNAs and EIDs are
 * node_id + 1 (1..8, fabric.c); controller k of a node adds k times this.
 */
#define OBMM_UBC_ID_STRIDE	0x100

/* The UB bus's feature bits (include/ub/ubus/ubus.h of OLK). */
#define OBMM_UB_MEM_BORROW_NC	BIT_ULL(0)
#define OBMM_UB_MEM_BORROW_CC	BIT_ULL(1)
#define OBMM_UB_MEM_SHARE_NC	BIT_ULL(2)
#define OBMM_UB_MEM_SHARE_CC	BIT_ULL(3)

static u32 obmm_ubc_cna(unsigned int k)
{
	return obmm_fabric_cna() + k * OBMM_UBC_ID_STRIDE;
}

static u32 obmm_ubc_eid(unsigned int k)
{
	return obmm_fabric_eid() + k * OBMM_UBC_ID_STRIDE;
}

/* Whether @cna is one of this node's controllers' (ub_mem_get_numa_id()). */
bool obmm_ubc_known_cna(u32 cna)
{
	unsigned int k;

	for (k = 0; k < tb_ubc_count(); k++)
		if (cna == obmm_ubc_cna(k))
			return true;
	return false;
}

/*
 * The controller's proximity domain: the pool's node, whose SRAT domain
 * has the same number in the testbed's guests (node_to_pxm() is not for
 * modules).
 */
static int obmm_ubc_pxm(void)
{
	return obmm_pool_nid();
}

/* The bus's feature bits, as ub_feature_get() gives them. */
u64 obmm_ubc_feature(void)
{
	if (!obmm_fabric_enabled())
		return 0;
	return OBMM_UB_MEM_BORROW_NC | OBMM_UB_MEM_BORROW_CC |
	       OBMM_UB_MEM_SHARE_NC | OBMM_UB_MEM_SHARE_CC;
}

static const struct tb_ubc_source obmm_ubc_source = {
	.cna = obmm_ubc_cna,
	.eid = obmm_ubc_eid,
	.pxm = obmm_ubc_pxm,
	.feature = obmm_ubc_feature,
};

int obmm_ubc_init(void)
{
	return tb_ubc_init(&obmm_ubc_source);
}

void obmm_ubc_exit(void)
{
	tb_ubc_exit();
}
