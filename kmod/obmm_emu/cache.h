/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what cache.c offers the files above it: the `strict` coherence
 * model (docs/coherence.md), one cache per region per node.
 */
#ifndef OBMM_EMU_CACHE_H
#define OBMM_EMU_CACHE_H

#include <linux/mm.h>

#include "obmm_emu.h"

int obmm_cache_init(void);
void obmm_cache_exit(void);
bool obmm_cache_strict(void);
bool obmm_cache_on(const struct obmm_region *r);
vm_fault_t obmm_cache_fault(struct obmm_region *r, struct vm_area_struct *vma,
			    unsigned long addr, u64 off, pgprot_t prot);
int obmm_cache_access(struct obmm_region *r, u64 off, void *buf, int len,
		      bool write);
void obmm_cache_maintain(struct obmm_region *r, u64 off, u64 len, u8 ops);
void obmm_cache_line_maintain(struct obmm_region *r, u64 off, bool inval);
#ifdef CONFIG_ARM64
void obmm_cache_dc_begin(unsigned long addr);
void obmm_cache_dc_end(void);
#endif
void obmm_cache_release(struct obmm_region *r, bool write_back);

#endif /* OBMM_EMU_CACHE_H */
