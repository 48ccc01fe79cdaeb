/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what ownership.c offers the files above it: per-mapping access
 * and per-entry ownership counters.
 */
#ifndef OBMM_EMU_OWNERSHIP_H
#define OBMM_EMU_OWNERSHIP_H

#include "obmm_emu.h"

bool obmm_state_reader(u8 state);
bool obmm_state_writer(u8 state);
u8 obmm_mem_state_of(vm_flags_t flags, bool cacheable);
vm_flags_t obmm_state_vm_flags(u8 state);
void obmm_ownership_free(struct obmm_region *r);
struct obmm_vmap *obmm_vmap_new(struct obmm_region *r, unsigned long first,
				unsigned long nr, unsigned int shift, u8 state,
				bool counted);
struct obmm_region *obmm_vmap_region(const struct obmm_vmap *vm);
void obmm_vmap_get(struct obmm_vmap *vm);
void obmm_vmap_put(struct obmm_vmap *vm);
void obmm_vmap_cover(struct obmm_vmap *vm, unsigned long from,
		     unsigned long to);
u8 obmm_vmap_state(const struct obmm_vmap *vm, unsigned long entry);
u8 obmm_vmap_release(struct obmm_vmap *vm, unsigned long from,
		     unsigned long to);
int obmm_vmap_move(struct obmm_vmap *vm, unsigned long from, unsigned long to,
		   u8 new, u8 *ops);
void obmm_vmap_unmove(struct obmm_vmap *vm, unsigned long from,
		      unsigned long to, u8 new);
void obmm_vmap_commit(struct obmm_vmap *vm, unsigned long from,
		      unsigned long to, u8 new);
vm_flags_t obmm_vmap_vm_flags(const struct obmm_vmap *vm, unsigned long from,
			      unsigned long to);

#endif /* OBMM_EMU_OWNERSHIP_H */
