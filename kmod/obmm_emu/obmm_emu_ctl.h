/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: layout of the shared control region (ivshmem-plain at PCI
 * slot 0x0f, 2 MiB) and of the emulated UBA.
 *
 * Every field is little endian.  Node i writes only its node-table entry
 * and its own export-record slots; readers never take a lock: each entry
 * starts with a sequence counter that is odd while its owner rewrites it,
 * so a reader retries until it sees the same even value before and after
 * copying the entry.  Export records also carry a generation counter that
 * grows on every publish and withdraw of the slot, so an importer can tell
 * a re-used slot from the export it resolved.
 *
 * Nothing here is trusted: any node can write any byte.  A node keeps the
 * seq and generation counts of its own entry and records in private memory
 * and never reads its shared bytes back (after load); readers validate
 * what they copy (README.md, "Trust of the control region").
 *
 * Acknowledged revocation: a node counts its withdrawals in its own entry
 * (withdraw_epoch, +1 after every record it withdraws).  Node i, once its
 * revocation scan has zapped every import of node j's withdrawn exports,
 * writes in its own entry ack[j] = (node j's boot id, the withdraw_epoch of
 * node j it read before that scan).  Node j reuses memory withdrawn at
 * epoch E only when every live peer's ack[j] carries its boot id and an
 * epoch >= E (no greater than its own), or the peer was declared dead,
 * and the memory is outside the range the peer says it holds (held_*).
 *
 *   0x000000  struct obmm_emu_ctl_header (constant content; any node may
 *             write it when the magic is absent, all write the same bytes)
 *   0x001000  node table: OBMM_EMU_MAX_NODES x OBMM_EMU_CTL_NODE_STRIDE
 *   0x010000  export records: node i's slots start at
 *             OBMM_EMU_CTL_RECORDS_OFF + i * OBMM_EMU_CTL_RECORDS_PER_NODE *
 *             OBMM_EMU_CTL_RECORD_SIZE
 */
#ifndef OBMM_EMU_CTL_H
#define OBMM_EMU_CTL_H

#include <linux/bits.h>
#include <linux/types.h>

#include "testbed_fabric.h"

#define OBMM_EMU_MAX_NODES		TB_FABRIC_MAX_NODES
#define OBMM_EMU_EID_LEN		16

/* ASCII "OBMMEMU1" read as a little-endian u64 */
#define OBMM_EMU_CTL_MAGIC		0x31554d454d4d424fULL
#define OBMM_EMU_CTL_VERSION		1
#define OBMM_EMU_CTL_NODE_TABLE_OFF	0x1000
#define OBMM_EMU_CTL_NODE_STRIDE	0x100
#define OBMM_EMU_CTL_RECORDS_OFF	0x10000
#define OBMM_EMU_CTL_RECORD_SIZE	0x80
#define OBMM_EMU_CTL_RECORDS_PER_NODE	1024
#define OBMM_EMU_CTL_MIN_SIZE		(OBMM_EMU_CTL_RECORDS_OFF + \
					 OBMM_EMU_MAX_NODES * \
					 OBMM_EMU_CTL_RECORDS_PER_NODE * \
					 OBMM_EMU_CTL_RECORD_SIZE)

/* node-table entry state */
#define OBMM_EMU_NODE_ABSENT		0
#define OBMM_EMU_NODE_ONLINE		1
#define OBMM_EMU_NODE_OFFLINE		2

/* export-record state */
#define OBMM_EMU_REC_FREE		0
#define OBMM_EMU_REC_LIVE		1

/* export-record flags: OBMM_EXPORT_FLAG_* in the low bits, plus */
#define OBMM_EMU_REC_FLAG_FROM_USER	BIT(16)
/*
 * EXPORT_PID memory that is not physically contiguous: [pa, pa + size)
 * is not the export, so no import can be made of it.
 */
#define OBMM_EMU_REC_FLAG_SCATTERED	BIT(17)
/*
 * The exporter maps the export (from its first mmap until its last
 * mapping goes): its processes read and write the memory, so no node
 * borrows it (import.c).
 */
#define OBMM_EMU_REC_FLAG_MAPPED	BIT(18)

/* The UBA encoding is the fabric's (kmod/common/testbed_fabric.h). */
#define OBMM_EMU_UBA_VALID		TB_UBA_VALID
#define OBMM_EMU_UBA_NODE_SHIFT		TB_UBA_NODE_SHIFT
#define OBMM_EMU_UBA_NODE_MASK		TB_UBA_NODE_MASK
#define OBMM_EMU_UBA_PA_MASK		TB_UBA_PA_MASK

struct obmm_emu_ctl_header {
	__le64 magic;
	__le32 version;
	__le32 max_nodes;
	__le32 node_table_off;
	__le32 node_stride;
	__le32 records_off;
	__le32 record_size;
	__le32 records_per_node;
	__le32 reserved;
};

/* What a node acknowledged of node j's withdrawals (in its own entry). */
struct obmm_emu_ctl_ack {
	__le64 boot_id;
	__le64 epoch;
};

struct obmm_emu_ctl_node {
	__le32 seq;
	__le32 state;
	__le32 node_id;
	__le32 cna;
	__u8 eid[OBMM_EMU_EID_LEN];
	__le64 heartbeat;
	__le64 boot_id;
	__le64 pool_base;
	__le64 pool_size;
	__le64 ram_size;
	__le32 heartbeat_ms;
	__le32 reserved;
	__le64 withdraw_epoch;
	struct obmm_emu_ctl_ack ack[OBMM_EMU_MAX_NODES];
	/*
	 * Memory of node held_node - 1 (0: none) that this node's kernel may
	 * still use, [held_start, held_end) in that node's RAM: borrows not
	 * unplugged yet (one stuck on a pinned page may stay for good).  Its
	 * ack[] covers every other withdrawal of that node (access.c).
	 */
	__le32 held_node;
	__le32 held_reserved;
	__le64 held_start;
	__le64 held_end;
};

struct obmm_emu_ctl_export {
	__le32 seq;
	__le32 state;
	__le64 generation;
	__le64 boot_id;
	__le64 mem_id;
	__le64 uba;
	__le64 pa;
	__le64 size;
	__le32 tokenid;
	__le32 flags;
	__u8 deid[OBMM_EMU_EID_LEN];
	__le32 pxm_numa;
	__le32 reserved[5];
};

#endif /* OBMM_EMU_CTL_H */
