/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what access.c offers the files above it: emulated UMMU access
 * control and revocation, a leaf over the fabric.
 */
#ifndef OBMM_EMU_ACCESS_H
#define OBMM_EMU_ACCESS_H

#include "obmm_emu.h"

/* What the UMMU asks of the importer's side (import.c; wired by core.c). */
struct obmm_access_ops {
	/* revoke what lost its export; bit j: node j's records unsure */
	unsigned long (*revoke_scan)(void);
	/* [*start, *end) of this node's RAM its own borrows may use */
	bool (*own_borrow_held)(u64 *start, u64 *end);
};

/* A range of this node's RAM a borrower may still use (end exclusive). */
struct obmm_access_held {
	u64 start;
	u64 end;
};

/*
 * What the live peers acknowledged: every withdrawal up to @epoch, except
 * memory in one of the @nr_held ranges (this node's own borrows included).
 */
struct obmm_access_acks {
	u64 epoch;
	bool boot_acked;	/* every live peer acknowledged this boot */
	unsigned int nr_held;
	struct obmm_access_held held[OBMM_EMU_MAX_NODES];
};

void obmm_access_register(const struct obmm_access_ops *ops);
void obmm_access_start(void);
void obmm_access_stop(void);
u64 obmm_access_acked_epoch(void);
void obmm_access_acks(struct obmm_access_acks *acks);
bool obmm_access_acked(const struct obmm_access_acks *acks, u64 epoch,
		       u64 start, u64 len);
/*
 * The epoch of memory a new boot of this node starts with: peers may still
 * map it through imports of the previous boot until their scan sees this
 * one (issue 36, finding 11).
 */
#define OBMM_ACCESS_EPOCH_BOOT		U64_MAX
/* The longest revocation scan period a node may run with (ms). */
#define OBMM_ACCESS_MAX_SCAN_MS		1000

unsigned int obmm_access_scan_ms(void);
/* The live export record covering the range, if any (no tokenid check). */
bool obmm_access_find_export(phys_addr_t addr, u64 len,
			     struct obmm_export_dep *dep);
const char *obmm_access_dep_lost(struct obmm_export_dep *dep,
				 bool *unsure);

#endif /* OBMM_EMU_ACCESS_H */
