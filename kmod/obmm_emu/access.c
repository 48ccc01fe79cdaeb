// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: the access control a UMMU enforces on hardware, emulated from
 * the control region.
 *
 * IMPORT: after every check of the real driver, the live export record
 * that covers the range (one node's window, published by the node's
 * current boot, the node's heartbeat fresh) is looked up.  The import's
 * tokenid plays no part: the real IMPORT never reads it, and on hardware
 * the token an access carries comes from the decoder that management
 * software programmed, not from the IMPORT.  The import remembers the
 * record (node, slot, generation, boot id); an import no record covers is
 * accepted, as by the real driver, and starts revoked: on hardware the
 * UMMU faults its accesses (import.c).
 *
 * Revocation: every revoke_scan_ms a delayed work re-reads the node table
 * and, for every import, its record.  An import whose record was withdrawn
 * or re-used (state or generation changed), whose exporter rebooted (boot
 * id changed), went offline, or whose heartbeat did not change for
 * heartbeat_misses of the exporter's heartbeat periods, is revoked: its
 * user mappings are zapped (the next access faults: SIGBUS) and new
 * mmaps fail.  No cross-VM lock is taken: entries are read seqcount-style.
 *
 * Acknowledgment: each scan first reads every peer's withdraw_epoch, then
 * revokes, then writes ack[peer] = (peer's boot id, that epoch) in this
 * node's own entry; a peer any of whose records could not be read this
 * time is not acknowledged.  An exporter reuses withdrawn memory only
 * once every live peer acknowledged its epoch (obmm_access_acks()), and
 * its pool at all only once every live peer acknowledged its boot.  A
 * borrow the importer cannot unplug yet (a pinned page may keep it for
 * good) does not hold back the ack: the importer names the range it still
 * uses in its entry (held_*), and only that range stays withdrawn.
 *
 * This file is a leaf over the fabric: the imports it revokes and the
 * borrows it waits for are reached through the obmm_access_ops that core.c
 * registers (import.c's), never by calling import.c.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/jiffies.h>
#include <linux/minmax.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/mutex.h>
#include <linux/sched.h>
#include <linux/workqueue.h>

#include "access.h"
#include "fabric.h"

#define OBMM_EMU_DEFAULT_SCAN_MS	50
#define OBMM_EMU_MIN_SCAN_MS		10
#define OBMM_EMU_MAX_SCAN_MS		OBMM_ACCESS_MAX_SCAN_MS
#define OBMM_EMU_DEFAULT_MISSES		8
#define OBMM_EMU_MIN_MISSES		2
#define OBMM_EMU_MAX_MISSES		100
/* Heartbeat period assumed for an entry that publishes none. */
#define OBMM_EMU_FALLBACK_HB_MS		1000
/* Bounds on a peer's published period (shared memory is not trusted). */
#define OBMM_EMU_MIN_HB_MS		10
#define OBMM_EMU_MAX_HB_MS		60000

static unsigned int revoke_scan_ms = OBMM_EMU_DEFAULT_SCAN_MS;
module_param(revoke_scan_ms, uint, 0444);
MODULE_PARM_DESC(revoke_scan_ms,
		 "Period in ms of the import revocation scan (10..1000, default 50)");

static unsigned int heartbeat_misses = OBMM_EMU_DEFAULT_MISSES;
module_param(heartbeat_misses, uint, 0444);
MODULE_PARM_DESC(heartbeat_misses,
		 "A node whose heartbeat did not change for this many of its periods is dead (2..100, default 8)");

/* What this node knows of a peer's liveness (peer_lock). */
struct obmm_peer {
	bool seen;
	bool alive;
	u64 boot_id;
	u64 heartbeat;
	unsigned int heartbeat_ms;
	unsigned long changed;	/* jiffies when heartbeat last changed */
	u64 epoch;		/* its withdraw_epoch, as last read */
	u64 ack_boot;		/* its ack of this node's withdrawals */
	u64 ack_epoch;
	bool held;		/* it may still use [held_start, held_end) */
	u64 held_start;		/* of this node's RAM */
	u64 held_end;
};

static struct obmm_peer peers[OBMM_EMU_MAX_NODES];
static DEFINE_MUTEX(peer_lock);
static void obmm_access_scan_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(scan_work, obmm_access_scan_fn);
static bool scan_running;
/* The importer's side, registered by core.c before anything runs. */
static const struct obmm_access_ops *access_ops;

void obmm_access_register(const struct obmm_access_ops *ops)
{
	access_ops = ops;
}

unsigned int obmm_access_scan_ms(void)
{
	return clamp_t(unsigned int, revoke_scan_ms, OBMM_EMU_MIN_SCAN_MS,
		       OBMM_EMU_MAX_SCAN_MS);
}

static unsigned long obmm_peer_timeout(const struct obmm_peer *p)
{
	unsigned int ms = p->heartbeat_ms ? p->heartbeat_ms :
		OBMM_EMU_FALLBACK_HB_MS;

	ms = clamp_t(unsigned int, ms, OBMM_EMU_MIN_HB_MS, OBMM_EMU_MAX_HB_MS);
	return msecs_to_jiffies(ms) * heartbeat_misses;
}

/*
 * A node entry that cannot be node @node's (another node id, no boot id)
 * carries no information: it is judged like an unreadable one.
 */
static bool obmm_node_entry_valid(int node, const struct obmm_emu_ctl_node *n)
{
	return le32_to_cpu(n->node_id) == node && n->boot_id;
}

/* Refresh peer liveness from the node table; peer_lock held. */
static void obmm_peers_update(void)
{
	struct obmm_emu_ctl_node n;
	struct obmm_peer *p;
	u64 hb, boot;
	int j;

	for (j = 0; j < OBMM_EMU_MAX_NODES; j++) {
		p = &peers[j];
		if (j == obmm_emu_node_id) {
			p->seen = true;
			p->alive = true;
			p->boot_id = obmm_fabric_boot_id();
			continue;
		}
		if (!obmm_fabric_window(j)->present) {
			p->alive = false;
			continue;
		}
		if (obmm_ctl_read_node(j, &n) && obmm_node_entry_valid(j, &n)) {
			if (le32_to_cpu(n.state) != OBMM_EMU_NODE_ONLINE) {
				p->seen = false;
				p->alive = false;
				continue;
			}
			hb = le64_to_cpu(n.heartbeat);
			boot = le64_to_cpu(n.boot_id);
			if (!p->seen || hb != p->heartbeat ||
			    boot != p->boot_id) {
				p->seen = true;
				p->heartbeat = hb;
				p->boot_id = boot;
				p->heartbeat_ms = le32_to_cpu(n.heartbeat_ms);
				p->changed = jiffies;
			}
			p->epoch = le64_to_cpu(n.withdraw_epoch);
			p->ack_boot = le64_to_cpu(n.ack[obmm_emu_node_id].boot_id);
			p->ack_epoch = le64_to_cpu(n.ack[obmm_emu_node_id].epoch);
			p->held = le32_to_cpu(n.held_node) ==
				  obmm_emu_node_id + 1;
			p->held_start = le64_to_cpu(n.held_start);
			p->held_end = le64_to_cpu(n.held_end);
			/* An empty or inverted range holds everything. */
			if (p->held && p->held_start >= p->held_end) {
				p->held_start = 0;
				p->held_end = U64_MAX;
			}
		}
		/* An unreadable or invalid entry is judged by its last change. */
		p->alive = p->seen &&
			   time_before(jiffies, p->changed + obmm_peer_timeout(p));
	}
}

/* Copy of a peer's state, refreshed first; false if it is not alive. */
static bool obmm_peer_get(int node, struct obmm_peer *out)
{
	mutex_lock(&peer_lock);
	obmm_peers_update();
	*out = peers[node];
	mutex_unlock(&peer_lock);
	return out->alive;
}

static bool obmm_record_covers(const struct obmm_emu_ctl_export *rec,
			       u64 boot_id, u64 off, u64 len)
{
	u64 pa = le64_to_cpu(rec->pa), size = le64_to_cpu(rec->size);

	if (le32_to_cpu(rec->state) != OBMM_EMU_REC_LIVE ||
	    le64_to_cpu(rec->boot_id) != boot_id ||
	    le32_to_cpu(rec->flags) & OBMM_EMU_REC_FLAG_SCATTERED)
		return false;
	return off >= pa && off - pa < size && len <= size - (off - pa);
}

bool obmm_access_find_export(phys_addr_t addr, u64 len,
			     struct obmm_export_dep *dep)
{
	struct obmm_emu_ctl_export rec;
	struct obmm_peer peer;
	u64 off;
	int node, slot;

	node = obmm_fabric_window_node(addr, len, &off);
	if (node < 0 || !obmm_peer_get(node, &peer))
		return false;
	for (slot = 0; slot < OBMM_EMU_CTL_RECORDS_PER_NODE; slot++) {
		if (obmm_ctl_record_state(node, slot) != OBMM_EMU_REC_LIVE)
			continue;
		/* A peer can make every slot LIVE with a stuck seq. */
		cond_resched();
		if (!obmm_ctl_read_record(node, slot, &rec) ||
		    !obmm_record_covers(&rec, peer.boot_id, off, len))
			continue;
		dep->node = node;
		dep->slot = slot;
		dep->generation = le64_to_cpu(rec.generation);
		dep->boot_id = peer.boot_id;
		dep->flags = le32_to_cpu(rec.flags);
		dep->unreadable = false;
		return true;
	}
	return false;
}

/*
 * Why the export an import depends on is gone, or NULL while it is live
 * (or cannot be told this time: an entry being rewritten).  A record that
 * stays unreadable as long as its node would take to be declared dead
 * (a stuck odd seq, a seq that never settles) counts as withdrawn: a
 * peer's bytes cannot keep an import alive forever.  peer_lock held.
 */
static const char *obmm_dep_lost_locked(struct obmm_export_dep *dep,
					bool *unsure)
{
	const struct obmm_peer *p = &peers[dep->node];
	struct obmm_emu_ctl_export rec;

	if (!p->alive)
		return "exporter node dead or offline";
	if (p->boot_id != dep->boot_id)
		return "exporter node rebooted";
	if (!obmm_ctl_read_record(dep->node, dep->slot, &rec)) {
		if (!dep->unreadable) {
			dep->unreadable = true;
			dep->unreadable_since = jiffies;
		} else if (time_after(jiffies, dep->unreadable_since +
				      obmm_peer_timeout(p))) {
			return "export record unreadable";
		}
		*unsure = true;
		return NULL;
	}
	dep->unreadable = false;
	if (le32_to_cpu(rec.state) != OBMM_EMU_REC_LIVE ||
	    le64_to_cpu(rec.generation) != dep->generation ||
	    le64_to_cpu(rec.boot_id) != dep->boot_id)
		return "export withdrawn";
	return NULL;
}

/*
 * Why the export is gone (NULL: live); *unsure is set when its record
 * could not be read this time (being rewritten, or a stuck writer).
 */
const char *obmm_access_dep_lost(struct obmm_export_dep *dep, bool *unsure)
{
	const char *why;

	mutex_lock(&peer_lock);
	why = obmm_dep_lost_locked(dep, unsure);
	mutex_unlock(&peer_lock);
	return why;
}

/*
 * What every live peer acknowledged of this node's withdrawals: the lowest
 * epoch any of them acknowledged (U64_MAX when no peer is alive), and the
 * ranges of this node's RAM some borrower (a peer, or this node) may still
 * use: those stay withdrawn whatever the epoch.  An ack of another boot of
 * this node, or beyond what this node withdrew (a peer's bytes are not
 * trusted), acknowledges nothing.  Dead, offline and absent peers do not
 * hold memory back: their importers were revoked by their own death.
 */
void obmm_access_acks(struct obmm_access_acks *acks)
{
	u64 own_boot = obmm_fabric_boot_id(), top, start, end;
	const struct obmm_peer *p;
	int j;

	acks->epoch = U64_MAX;
	acks->boot_acked = true;
	acks->nr_held = 0;
	/* A loopback borrow not unplugged yet (a revoked one is withdrawn). */
	if (access_ops->own_borrow_held(&start, &end)) {
		acks->held[acks->nr_held].start = start;
		acks->held[acks->nr_held++].end = end;
	}
	top = obmm_fabric_withdraw_epoch();
	mutex_lock(&peer_lock);
	obmm_peers_update();
	for (j = 0; j < OBMM_EMU_MAX_NODES; j++) {
		p = &peers[j];
		if (j == obmm_emu_node_id || !p->alive)
			continue;
		if (p->ack_boot != own_boot)
			acks->boot_acked = false;
		if (p->ack_boot != own_boot || p->ack_epoch > top)
			acks->epoch = 0;
		else
			acks->epoch = min(acks->epoch, p->ack_epoch);
		if (p->held && acks->nr_held < ARRAY_SIZE(acks->held)) {
			acks->held[acks->nr_held].start = p->held_start;
			acks->held[acks->nr_held++].end = p->held_end;
		}
	}
	mutex_unlock(&peer_lock);
}

/* Whether memory [start, start + len) withdrawn at @epoch may be reused. */
bool obmm_access_acked(const struct obmm_access_acks *acks, u64 epoch,
		       u64 start, u64 len)
{
	unsigned int i;

	if (epoch == OBMM_ACCESS_EPOCH_BOOT ? !acks->boot_acked :
	    epoch > acks->epoch)
		return false;
	for (i = 0; i < acks->nr_held; i++)
		if (start < acks->held[i].end &&
		    acks->held[i].start < start + len)
			return false;
	return true;
}

/*
 * The lowest epoch of this node's withdrawals that every live peer has
 * acknowledged, for memory that may be anywhere (EXPORT_PID pages): 0
 * while any borrower holds some of this node's memory.
 */
u64 obmm_access_acked_epoch(void)
{
	struct obmm_access_acks acks;

	obmm_access_acks(&acks);
	return acks.nr_held ? 0 : acks.epoch;
}

static void obmm_access_scan_fn(struct work_struct *work)
{
	u64 boot[OBMM_EMU_MAX_NODES], epoch[OBMM_EMU_MAX_NODES];
	bool seen[OBMM_EMU_MAX_NODES];
	unsigned long unsure;
	int j;

	/* The epochs are read before the records that the scan re-reads. */
	mutex_lock(&peer_lock);
	obmm_peers_update();
	for (j = 0; j < OBMM_EMU_MAX_NODES; j++) {
		seen[j] = peers[j].seen;
		boot[j] = peers[j].boot_id;
		epoch[j] = peers[j].epoch;
	}
	mutex_unlock(&peer_lock);
	/*
	 * A peer this node thinks dead is acknowledged too: the scan revoked
	 * every import of it.  It may see itself alive, and wait for this ack.
	 */
	unsure = access_ops->revoke_scan();
	for (j = 0; j < OBMM_EMU_MAX_NODES; j++)
		if (j != obmm_emu_node_id && seen[j] && !(unsure & BIT(j)))
			obmm_ctl_write_ack(j, boot[j], epoch[j]);
	schedule_delayed_work(&scan_work, msecs_to_jiffies(revoke_scan_ms));
}

/* Start the revocation scan (the fabric is up). */
void obmm_access_start(void)
{
	revoke_scan_ms = obmm_access_scan_ms();
	heartbeat_misses = clamp_t(unsigned int, heartbeat_misses,
				   OBMM_EMU_MIN_MISSES, OBMM_EMU_MAX_MISSES);
	mutex_lock(&peer_lock);
	obmm_peers_update();
	mutex_unlock(&peer_lock);
	WRITE_ONCE(scan_running, true);
	schedule_delayed_work(&scan_work, msecs_to_jiffies(revoke_scan_ms));
}

void obmm_access_stop(void)
{
	if (!READ_ONCE(scan_running))
		return;
	WRITE_ONCE(scan_running, false);
	cancel_delayed_work_sync(&scan_work);
}
