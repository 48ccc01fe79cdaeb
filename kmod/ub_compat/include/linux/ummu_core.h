/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ub_compat: the UMMU core's token devices (OLK linux/ummu_core.h), as far
 * as the OBMM driver uses them.  Implemented in ummu.c.
 */
#ifndef UB_COMPAT_LINUX_UMMU_CORE_H
#define UB_COMPAT_LINUX_UMMU_CORE_H

#include <linux/device.h>
#include <linux/string.h>
#include <linux/types.h>

#define UMMU_INVALID_TID	U32_MAX

struct ummu_event_block;

/* What a token device is made for; the OBMM driver sets name and priv. */
struct tdev_attr {
	const char *name;
	void *priv;
	u32 priv_len;
	bool usva;
};

static inline void tdev_attr_init(struct tdev_attr *attr)
{
	memset(attr, 0, sizeof(*attr));
}

struct device *ummu_core_alloc_tdev(struct tdev_attr *attr, u32 *ptid);
int ummu_core_free_tdev(struct device *dev);

#endif /* UB_COMPAT_LINUX_UMMU_CORE_H */
