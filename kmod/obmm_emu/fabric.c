// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: the emulated UB fabric on this node: the windows (found by
 * kmod/common/testbed_fabric.c), and the control region's node table,
 * heartbeat and export records.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bitmap.h>
#include <linux/io.h>
#include <linux/jiffies.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/random.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>

#include "fabric.h"

#define OBMM_EMU_DEFAULT_HEARTBEAT_MS	250
#define OBMM_EMU_MIN_HEARTBEAT_MS	10
/* Seqcount read attempts before an entry counts as unreadable. */
#define OBMM_EMU_CTL_READ_TRIES		1000

int obmm_emu_node_id;
module_param_named(node_id, obmm_emu_node_id, int, 0444);
MODULE_PARM_DESC(node_id, "Fabric node id of this guest (0..7, default 0)");

static unsigned int cna;
module_param(cna, uint, 0444);
MODULE_PARM_DESC(cna, "Primary CNA of this node's UB controller (default node_id + 1)");

static unsigned int eid;
module_param(eid, uint, 0444);
MODULE_PARM_DESC(eid, "EID (first 32 bits) of this node's UB controller (default node_id + 1)");

/*
 * The windows whose decoder ranges are non-cacheable only (node ids): the
 * UB decoder's answer to ub_memory_validate_pa(scna, start, end, true)
 * for them is no, so an import there may be opened with O_SYNC only
 * (obmm_import.c:get_pa_range_mem_cap).  Default: none, every range both.
 */
static int decoder_nc_only[TB_FABRIC_MAX_NODES];
static unsigned int decoder_nc_only_count;
module_param_array(decoder_nc_only, int, &decoder_nc_only_count, 0444);
MODULE_PARM_DESC(decoder_nc_only,
		 "Node ids whose window's decoder range is non-cacheable only (default none)");

static unsigned int heartbeat_ms = OBMM_EMU_DEFAULT_HEARTBEAT_MS;
module_param(heartbeat_ms, uint, 0444);
MODULE_PARM_DESC(heartbeat_ms, "Control-region heartbeat period in ms (default 250)");

struct obmm_fabric {
	bool enabled;
	/* windows and control region (win, ctl_base, ctl_size) */
	struct tb_fabric tb;
	void *ctl;
	u64 boot_id;
	/* this node's export pool, published in its node table entry */
	phys_addr_t pool_base;
	u64 pool_size;
	u64 heartbeat;
	/*
	 * This node's writer state of its entry and records.  The shared
	 * bytes are never read back after load (any peer may have scribbled
	 * on them): every write is made from here, and a write of the entry
	 * rewrites all of it, so a corrupted entry heals at the next beat.
	 */
	u32 node_seq;
	u32 node_state;
	u64 withdraw_epoch;
	struct obmm_emu_ctl_ack acks[OBMM_EMU_MAX_NODES];
	/* what this node holds of a peer's memory (held_node: node + 1) */
	u32 held_node;
	u64 held_start;
	u64 held_end;
	/*
	 * Between obmm_fabric_init() and obmm_fabric_exit(): the locks exist.
	 * Module exit cancels every work that reads the fabric before it goes;
	 * one that still ran after would use destroyed locks and an unmapped
	 * region, and WARNs instead.
	 */
	bool up;
	struct mutex node_lock;	/* serialises the writers of this node's entry */
	struct delayed_work heartbeat_work;
	struct mutex rec_lock;	/* protects rec_used, rec_seq, rec_gen, records */
	DECLARE_BITMAP(rec_used, OBMM_EMU_CTL_RECORDS_PER_NODE);
	u32 rec_seq[OBMM_EMU_CTL_RECORDS_PER_NODE];
	u64 rec_gen[OBMM_EMU_CTL_RECORDS_PER_NODE];
	/*
	 * What this node's records say (seq aside): its own lookups (a
	 * loopback import, its revocation) are answered from here, never from
	 * the shared bytes, which a peer may forge.  own_lock: a leaf, taken
	 * under peer_lock by access.c's lookups.
	 */
	spinlock_t own_lock;
	struct obmm_emu_ctl_export own_rec[OBMM_EMU_CTL_RECORDS_PER_NODE];
};

static struct obmm_fabric fab;

bool obmm_fabric_enabled(void)
{
	return fab.enabled;
}

u32 obmm_fabric_cna(void)
{
	return cna;
}

u32 obmm_fabric_eid(void)
{
	return eid;
}

const struct tb_fabric_window *obmm_fabric_window(int node)
{
	if (node < 0 || node >= OBMM_EMU_MAX_NODES)
		return NULL;
	return &fab.tb.win[node];
}

phys_addr_t obmm_fabric_ctl_base(void)
{
	return fab.tb.ctl_base;
}

u64 obmm_fabric_ctl_size(void)
{
	return fab.tb.ctl_size;
}

struct tb_fabric *obmm_fabric_tb(void)
{
	return &fab.tb;
}

/* ub_memory_validate_pa(): a range is UB memory when one window holds it. */
int obmm_fabric_window_node(phys_addr_t start, u64 len, u64 *offset)
{
	return tb_fabric_window_node(&fab.tb, start, len, offset);
}

bool obmm_fabric_window_nc_only(int node)
{
	unsigned int i;

	for (i = 0; i < decoder_nc_only_count; i++)
		if (decoder_nc_only[i] == node)
			return true;
	return false;
}

u64 obmm_fabric_boot_id(void)
{
	return fab.boot_id;
}

u64 obmm_fabric_make_uba(phys_addr_t pa)
{
	return tb_uba_make(obmm_emu_node_id, pa);
}

static struct obmm_emu_ctl_node *obmm_ctl_node(int node)
{
	return fab.ctl + OBMM_EMU_CTL_NODE_TABLE_OFF +
	       node * OBMM_EMU_CTL_NODE_STRIDE;
}

static struct obmm_emu_ctl_export *obmm_ctl_node_record(int node, int slot)
{
	return fab.ctl + OBMM_EMU_CTL_RECORDS_OFF +
	       ((size_t)node * OBMM_EMU_CTL_RECORDS_PER_NODE +
		slot) * OBMM_EMU_CTL_RECORD_SIZE;
}

static struct obmm_emu_ctl_export *obmm_ctl_record(int slot)
{
	return obmm_ctl_node_record(obmm_emu_node_id, slot);
}

/*
 * Seqcount reader side on shared memory: copy an entry whose first field
 * is its seq, retrying while the owner rewrites it.  False when the entry
 * stayed odd or kept changing (its owner died mid-write, or is stalled).
 */
static bool obmm_ctl_read(const void *entry, void *out, size_t len)
{
	const __le32 *seqp = entry;
	u32 before, after;
	int tries;

	for (tries = 0; tries < OBMM_EMU_CTL_READ_TRIES; tries++) {
		before = le32_to_cpu(READ_ONCE(*seqp));
		if (before & 1) {
			cpu_relax();
			continue;
		}
		/* The data must be read after the seq that validates it. */
		rmb();
		memcpy(out, entry, len);
		/* ... and before the seq that confirms it did not change. */
		rmb();
		after = le32_to_cpu(READ_ONCE(*seqp));
		if (before == after)
			return true;
	}
	return false;
}

bool obmm_ctl_read_node(int node, struct obmm_emu_ctl_node *out)
{
	if (!fab.ctl || node < 0 || node >= OBMM_EMU_MAX_NODES)
		return false;
	return obmm_ctl_read(obmm_ctl_node(node), out, sizeof(*out));
}

bool obmm_ctl_read_record(int node, int slot, struct obmm_emu_ctl_export *out)
{
	if (!fab.ctl || node < 0 || node >= OBMM_EMU_MAX_NODES ||
	    slot < 0 || slot >= OBMM_EMU_CTL_RECORDS_PER_NODE)
		return false;
	if (node == obmm_emu_node_id) {
		spin_lock(&fab.own_lock);
		*out = fab.own_rec[slot];
		spin_unlock(&fab.own_lock);
		return true;
	}
	return obmm_ctl_read(obmm_ctl_node_record(node, slot), out,
			     sizeof(*out));
}

/* Unlocked peek at a record's state, to skip free slots quickly. */
u32 obmm_ctl_record_state(int node, int slot)
{
	struct obmm_emu_ctl_export *rec;

	if (!fab.ctl || node < 0 || node >= OBMM_EMU_MAX_NODES ||
	    slot < 0 || slot >= OBMM_EMU_CTL_RECORDS_PER_NODE)
		return OBMM_EMU_REC_FREE;
	rec = node == obmm_emu_node_id ? &fab.own_rec[slot] :
	      obmm_ctl_node_record(node, slot);
	return le32_to_cpu(READ_ONCE(rec->state));
}

/*
 * Seqcount writer side on shared memory, from this node's private count
 * (@seq): odd while the entry changes.  A peer that wrote our seq cannot
 * make a write of ours look stable halfway.
 */
static void obmm_ctl_write_begin(__le32 *shared, u32 *seq)
{
	*seq = (*seq + 1) | 1;
	WRITE_ONCE(*shared, cpu_to_le32(*seq));
	/* Readers on other nodes must see the odd seq before the data. */
	wmb();
}

static void obmm_ctl_write_end(__le32 *shared, u32 *seq)
{
	/* The data must be visible before the even seq that validates it. */
	wmb();
	WRITE_ONCE(*shared, cpu_to_le32(++*seq));
}

static void obmm_ctl_header_expected(struct obmm_emu_ctl_header *h)
{
	memset(h, 0, sizeof(*h));
	h->magic = cpu_to_le64(OBMM_EMU_CTL_MAGIC);
	h->version = cpu_to_le32(OBMM_EMU_CTL_VERSION);
	h->max_nodes = cpu_to_le32(OBMM_EMU_MAX_NODES);
	h->node_table_off = cpu_to_le32(OBMM_EMU_CTL_NODE_TABLE_OFF);
	h->node_stride = cpu_to_le32(OBMM_EMU_CTL_NODE_STRIDE);
	h->records_off = cpu_to_le32(OBMM_EMU_CTL_RECORDS_OFF);
	h->record_size = cpu_to_le32(OBMM_EMU_CTL_RECORD_SIZE);
	h->records_per_node = cpu_to_le32(OBMM_EMU_CTL_RECORDS_PER_NODE);
}

/*
 * Write the header when the magic is absent.  With the magic present the
 * header is checked once, at load: a layout other than this module's is
 * refused (-EPROTO: the fabric stays disabled), never interpreted.  It is
 * not read again: the layout this module uses is its own, compiled in.
 */
static int obmm_ctl_init_header(void)
{
	struct obmm_emu_ctl_header *h = fab.ctl, want, seen;

	BUILD_BUG_ON(sizeof(struct obmm_emu_ctl_node) >
		     OBMM_EMU_CTL_NODE_STRIDE);
	BUILD_BUG_ON(sizeof(struct obmm_emu_ctl_export) >
		     OBMM_EMU_CTL_RECORD_SIZE);
	obmm_ctl_header_expected(&want);
	if (le64_to_cpu(READ_ONCE(h->magic)) == OBMM_EMU_CTL_MAGIC) {
		memcpy(&seen, h, sizeof(seen));
		if (!memcmp(&seen, &want, offsetof(typeof(want), reserved)))
			return 0;
		pr_warn("control region header: version %u, %u nodes, layout %#x/%#x/%#x/%#x/%u, not this module's: fabric disabled\n",
			le32_to_cpu(seen.version), le32_to_cpu(seen.max_nodes),
			le32_to_cpu(seen.node_table_off),
			le32_to_cpu(seen.node_stride),
			le32_to_cpu(seen.records_off),
			le32_to_cpu(seen.record_size),
			le32_to_cpu(seen.records_per_node));
		return -EPROTO;
	}
	memcpy((u8 *)h + sizeof(h->magic), (u8 *)&want + sizeof(want.magic),
	       sizeof(want) - sizeof(want.magic));
	/* The layout fields must be visible before the magic. */
	wmb();
	WRITE_ONCE(h->magic, want.magic);
	return 0;
}

/* Write all of this node's entry from its private state; node_lock held. */
static void obmm_ctl_node_write_locked(void)
{
	struct obmm_emu_ctl_node *n = obmm_ctl_node(obmm_emu_node_id);
	const struct tb_fabric_window *own = &fab.tb.win[obmm_emu_node_id];
	__le32 eid_le = cpu_to_le32(eid);

	lockdep_assert_held(&fab.node_lock);
	obmm_ctl_write_begin(&n->seq, &fab.node_seq);
	n->state = cpu_to_le32(fab.node_state);
	n->node_id = cpu_to_le32(obmm_emu_node_id);
	n->cna = cpu_to_le32(cna);
	memset(n->eid, 0, sizeof(n->eid));
	memcpy(n->eid, &eid_le, sizeof(eid_le));
	n->boot_id = cpu_to_le64(fab.boot_id);
	n->pool_base = cpu_to_le64(fab.pool_base);
	n->pool_size = cpu_to_le64(fab.pool_size);
	n->ram_size = cpu_to_le64(own->size);
	n->heartbeat_ms = cpu_to_le32(heartbeat_ms);
	n->reserved = 0;
	n->heartbeat = cpu_to_le64(fab.heartbeat);
	n->withdraw_epoch = cpu_to_le64(fab.withdraw_epoch);
	memcpy(n->ack, fab.acks, sizeof(n->ack));
	n->held_node = cpu_to_le32(fab.held_node);
	n->held_reserved = 0;
	n->held_start = cpu_to_le64(fab.held_start);
	n->held_end = cpu_to_le64(fab.held_end);
	obmm_ctl_write_end(&n->seq, &fab.node_seq);
}

static void obmm_ctl_node_update(u32 state)
{
	mutex_lock(&fab.node_lock);
	fab.node_state = state;
	obmm_ctl_node_write_locked();
	mutex_unlock(&fab.node_lock);
}

static void obmm_heartbeat_fn(struct work_struct *work)
{
	mutex_lock(&fab.node_lock);
	fab.heartbeat++;
	obmm_ctl_node_write_locked();
	mutex_unlock(&fab.node_lock);
	schedule_delayed_work(&fab.heartbeat_work,
			      msecs_to_jiffies(heartbeat_ms));
}

/*
 * Write record @slot as @own says, in the private copy and the shared
 * slot (@own's seq is not used).  rec_lock held.
 */
static void obmm_ctl_record_write_locked(int slot,
					 const struct obmm_emu_ctl_export *own)
{
	struct obmm_emu_ctl_export *rec = obmm_ctl_record(slot);

	spin_lock(&fab.own_lock);
	fab.own_rec[slot] = *own;
	fab.own_rec[slot].seq = 0;
	spin_unlock(&fab.own_lock);
	obmm_ctl_write_begin(&rec->seq, &fab.rec_seq[slot]);
	memcpy((u8 *)rec + sizeof(rec->seq), (const u8 *)own + sizeof(own->seq),
	       sizeof(*rec) - sizeof(rec->seq));
	obmm_ctl_write_end(&rec->seq, &fab.rec_seq[slot]);
}

/*
 * Publish an export's record in this node's slots.  -ENOSPC when every
 * slot is taken: an export no importer could find is refused, not made.
 */
int obmm_ctl_publish_export(struct obmm_region *r)
{
	struct obmm_emu_ctl_export own;
	u32 flags;
	int slot;

	if (!fab.ctl)
		return 0;
	mutex_lock(&fab.rec_lock);
	slot = find_first_zero_bit(fab.rec_used, OBMM_EMU_CTL_RECORDS_PER_NODE);
	if (slot >= OBMM_EMU_CTL_RECORDS_PER_NODE) {
		mutex_unlock(&fab.rec_lock);
		return -ENOSPC;
	}
	set_bit(slot, fab.rec_used);
	r->record_slot = slot;
	flags = (u32)r->export_flags;
	if (r->from_user)
		flags |= OBMM_EMU_REC_FLAG_FROM_USER;
	if (r->from_user && !r->phys_contig)
		flags |= OBMM_EMU_REC_FLAG_SCATTERED;

	memset(&own, 0, sizeof(own));
	own.generation = cpu_to_le64(++fab.rec_gen[slot]);
	own.boot_id = cpu_to_le64(fab.boot_id);
	own.mem_id = cpu_to_le64(r->id);
	own.uba = cpu_to_le64(r->uba);
	own.pa = cpu_to_le64(r->pa);
	own.size = cpu_to_le64(r->size);
	own.tokenid = cpu_to_le32(r->tokenid);
	own.flags = cpu_to_le32(flags);
	memcpy(own.deid, r->deid, sizeof(own.deid));
	own.pxm_numa = cpu_to_le32(r->pxm_numa);
	own.state = cpu_to_le32(OBMM_EMU_REC_LIVE);
	obmm_ctl_record_write_locked(slot, &own);
	mutex_unlock(&fab.rec_lock);
	return 0;
}

/*
 * Withdraw an export's record, then count the withdrawal in this node's
 * entry (in that order: a peer that read the new withdraw_epoch sees the
 * withdrawn record).  Returns the epoch every live peer must acknowledge
 * before the export's memory is reused (0: nothing to wait for).
 */
u64 obmm_ctl_withdraw_export(struct obmm_region *r)
{
	struct obmm_emu_ctl_export own;
	int slot = r->record_slot;
	u64 epoch;

	if (!fab.ctl || slot < 0)
		return 0;
	mutex_lock(&fab.rec_lock);
	own = fab.own_rec[slot];
	own.state = cpu_to_le32(OBMM_EMU_REC_FREE);
	own.generation = cpu_to_le64(++fab.rec_gen[slot]);
	obmm_ctl_record_write_locked(slot, &own);
	clear_bit(slot, fab.rec_used);
	r->record_slot = -1;

	mutex_lock(&fab.node_lock);
	epoch = ++fab.withdraw_epoch;
	obmm_ctl_node_write_locked();
	mutex_unlock(&fab.node_lock);
	mutex_unlock(&fab.rec_lock);
	return epoch;
}

/*
 * The export's first mapping came or its last one went: its record says
 * so (same generation: importers keep their imports; borrows are refused
 * while it is mapped).
 */
void obmm_ctl_export_set_mapped(struct obmm_region *r, bool mapped)
{
	struct obmm_emu_ctl_export own;
	u32 flags;
	int slot;

	if (!fab.ctl)
		return;
	mutex_lock(&fab.rec_lock);
	slot = r->record_slot;
	if (slot >= 0) {
		own = fab.own_rec[slot];
		flags = le32_to_cpu(own.flags) & ~OBMM_EMU_REC_FLAG_MAPPED;
		own.flags = cpu_to_le32(flags |
					(mapped ? OBMM_EMU_REC_FLAG_MAPPED : 0));
		obmm_ctl_record_write_locked(slot, &own);
	}
	mutex_unlock(&fab.rec_lock);
}

/* This node's count of withdrawn exports (what peers acknowledge). */
u64 obmm_fabric_withdraw_epoch(void)
{
	u64 epoch;

	if (WARN_ON_ONCE(!fab.up))
		return 0;
	mutex_lock(&fab.node_lock);
	epoch = fab.withdraw_epoch;
	mutex_unlock(&fab.node_lock);
	return epoch;
}

/*
 * Acknowledge, in this node's own entry, node @node's withdrawals up to
 * @epoch of its boot @boot_id: every import of them is revoked and zapped.
 */
void obmm_ctl_write_ack(int node, u64 boot_id, u64 epoch)
{
	struct obmm_emu_ctl_ack ack = {
		.boot_id = cpu_to_le64(boot_id),
		.epoch = cpu_to_le64(epoch),
	};

	if (WARN_ON_ONCE(!fab.up) || !fab.ctl || node < 0 ||
	    node >= OBMM_EMU_MAX_NODES)
		return;
	mutex_lock(&fab.node_lock);
	if (memcmp(&fab.acks[node], &ack, sizeof(ack))) {
		fab.acks[node] = ack;
		obmm_ctl_node_write_locked();
	}
	mutex_unlock(&fab.node_lock);
}

/*
 * Say in this node's entry that its kernel may still use [start, end) of
 * node @node's RAM (@node < 0: nothing).  Written before the ack that
 * relies on it.
 */
void obmm_ctl_write_held(int node, u64 start, u64 end)
{
	u32 held = node >= 0 && node < OBMM_EMU_MAX_NODES ? node + 1 : 0;

	if (WARN_ON_ONCE(!fab.up) || !fab.ctl)
		return;
	if (!held)
		start = end = 0;
	mutex_lock(&fab.node_lock);
	if (fab.held_node != held || fab.held_start != start ||
	    fab.held_end != end) {
		fab.held_node = held;
		fab.held_start = start;
		fab.held_end = end;
		obmm_ctl_node_write_locked();
	}
	mutex_unlock(&fab.node_lock);
}

/*
 * Withdraw whatever a previous incarnation of this node left behind, and
 * take over the seq and generation counts of the entry and the slots (the
 * only time this node reads its own shared bytes): readers then never see
 * a count go back, and a slot's generation keeps growing across reloads.
 */
static void obmm_ctl_clear_own_records(void)
{
	struct obmm_emu_ctl_node *n = obmm_ctl_node(obmm_emu_node_id);
	struct obmm_emu_ctl_export *rec;
	int slot;

	fab.node_seq = (le32_to_cpu(READ_ONCE(n->seq)) + 1) & ~1U;
	for (slot = 0; slot < OBMM_EMU_CTL_RECORDS_PER_NODE; slot++) {
		rec = obmm_ctl_record(slot);
		fab.rec_seq[slot] = (le32_to_cpu(READ_ONCE(rec->seq)) + 1) & ~1U;
		fab.rec_gen[slot] = le64_to_cpu(READ_ONCE(rec->generation));
		if (le32_to_cpu(rec->state) == OBMM_EMU_REC_FREE &&
		    !(le32_to_cpu(rec->seq) & 1))
			continue;
		obmm_ctl_write_begin(&rec->seq, &fab.rec_seq[slot]);
		rec->state = cpu_to_le32(OBMM_EMU_REC_FREE);
		rec->generation = cpu_to_le64(++fab.rec_gen[slot]);
		obmm_ctl_write_end(&rec->seq, &fab.rec_seq[slot]);
	}
}

/*
 * Find the windows and the control region and map the region.  Without
 * this node's own window or the control region the fabric stays disabled
 * (every ioctl: -EOPNOTSUPP), which is not an error.
 */
int obmm_fabric_init(void)
{
	if (!cna)
		cna = obmm_emu_node_id + 1;
	if (!eid)
		eid = obmm_emu_node_id + 1;
	if (heartbeat_ms < OBMM_EMU_MIN_HEARTBEAT_MS)
		heartbeat_ms = OBMM_EMU_MIN_HEARTBEAT_MS;
	mutex_init(&fab.rec_lock);
	mutex_init(&fab.node_lock);
	spin_lock_init(&fab.own_lock);
	fab.up = true;
	INIT_DELAYED_WORK(&fab.heartbeat_work, obmm_heartbeat_fn);
	fab.boot_id = get_random_u64();

	tb_fabric_probe(&fab.tb);

	if (!fab.tb.win[obmm_emu_node_id].present || !fab.tb.ctl_pdev ||
	    fab.tb.ctl_size < OBMM_EMU_CTL_MIN_SIZE) {
		pr_warn("own window or control region missing: fabric disabled\n");
		return 0;
	}
	/*
	 * Write-combining, not write-back: on x86 a WB kernel mapping would
	 * make PAT refuse every other mapping type of the region, and the
	 * region must stay mappable through sysfs resource2 (the host tools
	 * and the Python library read it there).
	 */
	fab.ctl = memremap(fab.tb.ctl_base, fab.tb.ctl_size, MEMREMAP_WC);
	if (!fab.ctl) {
		tb_fabric_release(&fab.tb);
		fab.up = false;
		mutex_destroy(&fab.node_lock);
		mutex_destroy(&fab.rec_lock);
		return -ENOMEM;
	}
	if (obmm_ctl_init_header()) {
		/* Not an error of the load: the fabric is absent (EOPNOTSUPP). */
		memunmap(fab.ctl);
		fab.ctl = NULL;
		tb_fabric_release(&fab.tb);
		return 0;
	}
	obmm_ctl_clear_own_records();
	return 0;
}

/* This node's own window once obmm_fabric_init() mapped the fabric. */
const struct tb_fabric_window *obmm_fabric_own_window(void)
{
	return fab.ctl ? &fab.tb.win[obmm_emu_node_id] : NULL;
}

/* Go online in the node table (with this node's pool) and beat. */
void obmm_fabric_start(phys_addr_t pool_base, u64 pool_size)
{
	if (!fab.ctl)
		return;
	fab.pool_base = pool_base;
	fab.pool_size = pool_size;
	obmm_ctl_node_update(OBMM_EMU_NODE_ONLINE);
	schedule_delayed_work(&fab.heartbeat_work,
			      msecs_to_jiffies(heartbeat_ms));
	fab.enabled = true;
}

void obmm_fabric_stop(void)
{
	if (!fab.enabled)
		return;
	fab.enabled = false;
	cancel_delayed_work_sync(&fab.heartbeat_work);
	obmm_ctl_node_update(OBMM_EMU_NODE_OFFLINE);
}

void obmm_fabric_exit(void)
{
	if (fab.ctl) {
		memunmap(fab.ctl);
		fab.ctl = NULL;
	}
	tb_fabric_release(&fab.tb);
	fab.up = false;
	mutex_destroy(&fab.node_lock);
	mutex_destroy(&fab.rec_lock);
}
