/* SPDX-License-Identifier: GPL-2.0 */
/*
 * urma_compat.h: what ubcore and uburma, written for OLK-6.6, take from
 * kernels newer than the guests' Debian 6.1.
 *
 * Force-included (-include) into every object of an out-of-tree build of
 * drivers/ub/urma/{ubcore,uburma} from an upstream tree given by path, by
 * obmm.testbed.builds.urmabuild, and only for guest kernels older than 6.6; nothing
 * of that tree is copied here. README.md beside it says, shim by shim, what
 * the newer kernel has and how the shim differs.
 */
#ifndef URMA_COMPAT_H
#define URMA_COMPAT_H

#include <linux/mm.h>
#include <net/genetlink.h>

/*
 * 6.2 moved a dump's parsed attributes to genl_dumpit_info(cb)->info.attrs
 * (a struct genl_info); 6.1 has them at ->attrs. The shim hands out a
 * compound literal with the one member ubcore reads. Parenthesising the
 * name calls 6.1's inline function instead of expanding this macro again.
 */
struct urma_compat_dumpit_info {
	struct {
		struct nlattr **attrs;
	} info;
};

#define genl_dumpit_info(cb)						\
	(&(const struct urma_compat_dumpit_info) {			\
		.info.attrs = (genl_dumpit_info)(cb)->attrs,		\
	})

/* 6.3 made vma->vm_flags read-only behind these setters. */
static inline void vm_flags_set(struct vm_area_struct *vma, vm_flags_t flags)
{
	vma->vm_flags |= flags;
}

static inline void vm_flags_clear(struct vm_area_struct *vma, vm_flags_t flags)
{
	vma->vm_flags &= ~flags;
}

#endif /* URMA_COMPAT_H */
