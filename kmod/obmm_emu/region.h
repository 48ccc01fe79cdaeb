/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what region.c offers the files above it: regions, the one id
 * space, their pseudo filesystem, ADDR_QUERY.
 */
#ifndef OBMM_EMU_REGION_H
#define OBMM_EMU_REGION_H

#include "obmm_emu.h"

struct obmm_region *obmm_region_alloc(enum obmm_region_type type);
void obmm_region_free(struct obmm_region *r);
int obmm_region_add_id(struct obmm_region *r, const char *op);
void obmm_region_remove_id(struct obmm_region *r);
void obmm_region_activate(struct obmm_region *r);
int obmm_region_deactivate(const char *op, u64 mem_id, u64 flags,
			   u64 valid_flags, enum obmm_region_type type,
			   struct obmm_region **out);
void obmm_region_reactivate(struct obmm_region *r);
struct obmm_region *obmm_region_get_by_id(int id, int *err);
void obmm_region_put(struct obmm_region *r);
int obmm_copy_priv(struct obmm_region *r, const void __user *priv, u16 len,
		   const char *op);
int obmm_check_vendor(const void __user *vendor, u16 len, const char *op);
long obmm_addr_query_ioctl(void __user *uarg);
void obmm_regions_init(void);
void obmm_regions_exit(void);
int obmm_region_fs_init(void);
void obmm_region_fs_exit(void);

#endif /* OBMM_EMU_REGION_H */
