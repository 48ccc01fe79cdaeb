/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what fabric.c offers the files above it: fabric windows, the
 * control region, heartbeat, export records, UBA.
 */
#ifndef OBMM_EMU_FABRIC_H
#define OBMM_EMU_FABRIC_H

#include "obmm_emu.h"

/* This node's index in the fabric (module parameter node_id). */
extern int obmm_emu_node_id;

int obmm_fabric_init(void);
const struct tb_fabric_window *obmm_fabric_own_window(void);
void obmm_fabric_start(phys_addr_t pool_base, u64 pool_size);
void obmm_fabric_stop(void);
void obmm_fabric_exit(void);
bool obmm_fabric_enabled(void);
u32 obmm_fabric_cna(void);
u32 obmm_fabric_eid(void);
const struct tb_fabric_window *obmm_fabric_window(int node);
phys_addr_t obmm_fabric_ctl_base(void);
u64 obmm_fabric_ctl_size(void);
struct tb_fabric *obmm_fabric_tb(void);
u64 obmm_fabric_make_uba(phys_addr_t pa);
int obmm_ctl_publish_export(struct obmm_region *r);
u64 obmm_ctl_withdraw_export(struct obmm_region *r);
void obmm_ctl_export_set_mapped(struct obmm_region *r, bool mapped);
u64 obmm_fabric_withdraw_epoch(void);
void obmm_ctl_write_ack(int node, u64 boot_id, u64 epoch);
void obmm_ctl_write_held(int node, u64 start, u64 end);
int obmm_fabric_window_node(phys_addr_t start, u64 len, u64 *offset);
bool obmm_fabric_window_nc_only(int node);
u64 obmm_fabric_boot_id(void);
bool obmm_ctl_read_node(int node, struct obmm_emu_ctl_node *out);
bool obmm_ctl_read_record(int node, int slot,
			  struct obmm_emu_ctl_export *out);
u32 obmm_ctl_record_state(int node, int slot);

#endif /* OBMM_EMU_FABRIC_H */
