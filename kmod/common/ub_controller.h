/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The UB bus controllers in sysfs, as the real UB bus prints them
 * (drivers/ub/ubus/sysfs.c), shared by the emulated driver (obmm_emu) and
 * the compat layer the real driver runs on (ub_compat): one copy of the
 * layout, so a program finds the same paths on both drivers.
 *
 *   /sys/devices/ub_bus_controller<index + k>/<names[k]>/
 *       eid %u, primary_cna %#06x, ummu_map %#04x, numa %#04x (proximity
 *       domain), ubc %#05x (the entity number: the name read as hex), upi,
 *       entity_idx, type, vendor, device, class_code, guid
 *   /sys/bus/ub/{ub_feature,cluster,instance}
 *
 * The values come from the module that links this file (struct
 * tb_ubc_source); its state is that module's own.
 */
#ifndef TESTBED_UB_CONTROLLER_H
#define TESTBED_UB_CONTROLLER_H

#include <linux/types.h>

/* libobmm's vendor adaptor looks at ub_bus_controller0..7. */
#define TB_UBC_MAX		8
/* A sysfs directory name of a controller's device: short, no '/'. */
#define TB_UBC_DEV_MAX		32

struct tb_ubc_source {
	u32 (*cna)(unsigned int k);	/* controller k's primary CNA */
	u32 (*eid)(unsigned int k);	/* its EID (first 32 bits) */
	int (*pxm)(void);		/* the controllers' proximity domain */
	u64 (*feature)(void);		/* the bus's feature bits */
};

/*
 * The controllers the module parameters ubc_index and ubc_dev (declared in
 * ub_controller.c, for both modules) name, with @src's values.
 */
int tb_ubc_init(const struct tb_ubc_source *src);
/* How many controllers ubc_dev names. */
unsigned int tb_ubc_count(void);
void tb_ubc_exit(void);

#endif /* TESTBED_UB_CONTROLLER_H */
