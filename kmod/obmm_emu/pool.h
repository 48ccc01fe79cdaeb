/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what pool.c offers the files above it: the export pool above
 * mem=.
 */
#ifndef OBMM_EMU_POOL_H
#define OBMM_EMU_POOL_H

#include "obmm_emu.h"

int obmm_pool_init(phys_addr_t win_size, unsigned int scan_ms);
void obmm_pool_exit(void);
void obmm_pool_start(void);
bool obmm_pool_present(void);
int obmm_pool_nid(void);
u64 obmm_pool_granu(void);
int obmm_pool_alloc(u64 size, bool fast, phys_addr_t *pa);
void obmm_pool_free(phys_addr_t pa, u64 size, u64 epoch);
void obmm_pool_stats(u64 *total, u64 *used, u64 *cleared, u64 *uncleared);
phys_addr_t obmm_pool_base(void);
u64 obmm_pool_size(void);
int obmm_pool_parse_params(void);
u64 obmm_pool_quarantined(void);
unsigned long obmm_pool_quarantine_jiffies(void);

#endif /* OBMM_EMU_POOL_H */
