/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what borrow.c offers the files above it: NUMA_REMOTE memory
 * hot-plug.
 */
#ifndef OBMM_EMU_BORROW_H
#define OBMM_EMU_BORROW_H

#include "obmm_emu.h"

u64 obmm_memory_block_bytes(void);
void obmm_borrow_init(void);
int obmm_borrow_lock_killable(void);
bool obmm_borrow_trylock(void);
void obmm_borrow_unlock(void);
bool obmm_borrow_node_remote(int nid);
int obmm_borrow_claim_node(int nid);
void obmm_borrow_release_node_locked(int nid);
int obmm_borrow_add_locked(struct obmm_region *r, int nid);
int obmm_borrow_remove_locked(struct obmm_region *r, bool keep_memid);
struct resource *obmm_borrow_ram_res(struct obmm_region *r);

#endif /* OBMM_EMU_BORROW_H */
