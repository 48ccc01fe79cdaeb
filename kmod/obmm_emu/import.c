// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: OBMM_CMD_IMPORT, OBMM_CMD_UNIMPORT and the preimport ioctls.
 *
 * NUMA_REMOTE ("borrow") imports hot-add their window range as memory of
 * a remote NUMA node after every check the real driver makes (borrow.c);
 * UNIMPORT offlines and removes it.  A preimport declaration reserves a
 * range and a node; NUMA_REMOTE|PREIMPORT imports inside it take its
 * memory blocks and hot-add them (the real driver adds the whole range
 * isolated at DECLARE and un-isolates at import; stock kernels cannot
 * isolate hot-added memory, so nothing is added before the import).
 *
 * After the real driver's checks an import is bound to the live export
 * that covers it (access.c; the tokenid plays no part, as in the real
 * driver); one that no export covers is accepted and starts revoked (its
 * accesses fault, as the UMMU makes them on hardware), except a borrow,
 * which is refused with -EACCES: memory nobody exported is never hot-added.
 * The revocation scan then walks the import ranges
 * (obmm_imports_revoke_scan()).  A revoked borrow is unplugged by
 * a kernel thread, and until it is, this node does not acknowledge the
 * exporter's withdrawals: the exporter cannot reuse memory this kernel
 * may still be using.  The thread's tries are bounded (offlining a range
 * with a pinned page retries until a signal): it never holds the hot-plug
 * locks for long, and every other wait for them is killable.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bitmap.h>
#include <linux/kthread.h>
#include <linux/list.h>
#include <linux/memory.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/proc_fs.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/seq_file.h>
#include <linux/signal.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/stringify.h>
#include <linux/sysfs.h>
#include <linux/timer.h>
#include <linux/uaccess.h>

#include "access.h"
#include "borrow.h"
#include "fabric.h"
#include "import.h"
#include "region.h"
#include "shmdev.h"
#include "ubc.h"

/*
 * The real driver's maple tree of PA ranges: direct imports and preimport
 * declarations (which no other range may overlap), and imports inside a
 * declaration (inner: skipped by overlap checks and PA lookups, walked by
 * the revocation scan).
 */
struct obmm_import_range {
	struct list_head link;
	phys_addr_t start;
	phys_addr_t end;	/* inclusive */
	struct obmm_region *region;	/* NULL for a declaration */
	struct obmm_preimport *pre;	/* a declaration */
	bool inner;
};

/* A DECLARE_PREIMPORT range: its node, datapath and memory blocks. */
struct obmm_preimport {
	struct obmm_import_range range;
	bool ready;
	int numa_id;
	u32 scna;
	u32 dcna;
	u8 seid[OBMM_EMU_EID_LEN];
	u8 deid[OBMM_EMU_EID_LEN];
	unsigned int use_count;
	unsigned long nbits;
	unsigned long *blocks;	/* memory blocks taken by imports */
	struct resource res;	/* "PREIMPORT_UBMEM" */
};

/* Lock order: the borrow mutex (borrow.c) before this one. */
static DEFINE_MUTEX(obmm_import_mutex);
static LIST_HEAD(obmm_import_ranges);
/*
 * The span of a node's RAM this kernel's borrows of it may use (plugged
 * or being plugged), as the last revocation scan saw them; end 0: none.
 */
struct obmm_held_span {
	u64 start;
	u64 end;
};

/*
 * This node's own memory, borrowed through loopback; a spinlock, not the
 * import mutex, which a scan may hold long: the pool asks under its lock.
 */
static struct obmm_held_span obmm_own_held;
static DEFINE_SPINLOCK(obmm_own_held_lock);

/*
 * The unplug thread: one try to offline a revoked borrow holds the borrow
 * mutex and the kernel's hot-plug locks for at most OBMM_UNPLUG_TRY_MS
 * (a signal then ends offline_pages()' retries), and a failed round waits
 * OBMM_UNPLUG_BACKOFF_MS with every lock free before the next.
 */
#define OBMM_UNPLUG_TRY_MS	1000
#define OBMM_UNPLUG_BACKOFF_MS	2000

static struct task_struct *obmm_unplug_task;
static bool obmm_unplug_wanted;

#define OBMM_PROC_DIR		"obmm"
#define OBMM_PROC_PREIMPORT	"preimport_info"
/* The real driver passes mode 0 to proc_create_seq(): 0444. */
#define OBMM_PROC_MODE		0444
#define OBMM_PREIMPORT_RES_NAME	"PREIMPORT_UBMEM"

/* /proc/obmm/preimport_info column widths (the real driver's). */
#define OBMM_PI_PA_WIDTH	16
#define OBMM_PI_CNA_WIDTH	8
#define OBMM_PI_HALF_EID_WIDTH	18
#define OBMM_PI_FULL_EID_WIDTH	(2 * OBMM_PI_HALF_EID_WIDTH + 1)
#define OBMM_PI_NID_WIDTH	3

static struct proc_dir_entry *obmm_proc_dir;

/* EID halves as the real driver prints them (native u64 at 8 and 0). */
static u64 obmm_eid_hi(const u8 *eid)
{
	u64 v;

	memcpy(&v, eid + sizeof(v), sizeof(v));
	return v;
}

static u64 obmm_eid_lo(const u8 *eid)
{
	u64 v;

	memcpy(&v, eid, sizeof(v));
	return v;
}

/* /proc/obmm/preimport_info: a header, then one line per declared range. */
static int obmm_preimport_info_show(struct seq_file *m, void *v)
{
	struct obmm_import_range *ir;
	struct obmm_preimport *pre;

	seq_printf(m, "%-*s - %-*s : %-*s %-*s    %-*s %-*s    %-*s\n",
		   OBMM_PI_PA_WIDTH, "pa_start", OBMM_PI_PA_WIDTH, "pa_end",
		   OBMM_PI_CNA_WIDTH, "dcna", OBMM_PI_CNA_WIDTH, "scna",
		   OBMM_PI_FULL_EID_WIDTH, "deid", OBMM_PI_FULL_EID_WIDTH, "seid",
		   OBMM_PI_NID_WIDTH, "nid");
	mutex_lock(&obmm_import_mutex);
	list_for_each_entry(ir, &obmm_import_ranges, link) {
		pre = ir->pre;
		if (!pre || !pre->ready)
			continue;
		seq_printf(m, "%-*llx - %-*llx : %#-*x %#-*x    %#0*llx:%#0*llx %#0*llx:%#0*llx    %-*d\n",
			   OBMM_PI_PA_WIDTH, (u64)ir->start,
			   OBMM_PI_PA_WIDTH, (u64)ir->end,
			   OBMM_PI_CNA_WIDTH, pre->dcna,
			   OBMM_PI_CNA_WIDTH, pre->scna,
			   OBMM_PI_HALF_EID_WIDTH, obmm_eid_hi(pre->deid),
			   OBMM_PI_HALF_EID_WIDTH, obmm_eid_lo(pre->deid),
			   OBMM_PI_HALF_EID_WIDTH, obmm_eid_hi(pre->seid),
			   OBMM_PI_HALF_EID_WIDTH, obmm_eid_lo(pre->seid),
			   OBMM_PI_NID_WIDTH, pre->numa_id);
	}
	mutex_unlock(&obmm_import_mutex);
	return 0;
}

static int obmm_unplug_thread(void *unused);

int obmm_imports_init(void)
{
	struct task_struct *task;

	obmm_borrow_init();
	obmm_proc_dir = proc_mkdir(OBMM_PROC_DIR, NULL);
	if (!obmm_proc_dir)
		return -ENOMEM;
	if (!proc_create_single(OBMM_PROC_PREIMPORT, OBMM_PROC_MODE,
				obmm_proc_dir, obmm_preimport_info_show))
		goto err_proc;
	task = kthread_run(obmm_unplug_thread, NULL, OBMM_EMU_NAME "_unplug");
	if (IS_ERR(task))
		goto err_proc;
	obmm_unplug_task = task;
	return 0;
err_proc:
	proc_remove(obmm_proc_dir);
	obmm_proc_dir = NULL;
	return -ENOMEM;
}

/* After the revocation scan stopped; every region is gone (orphans hold a module reference). */
void obmm_imports_exit(void)
{
	kthread_stop(obmm_unplug_task);
	obmm_unplug_task = NULL;
	proc_remove(obmm_proc_dir);
	obmm_proc_dir = NULL;
}

static bool obmm_range_overlaps(phys_addr_t start, phys_addr_t end)
{
	struct obmm_import_range *ir;

	list_for_each_entry(ir, &obmm_import_ranges, link)
		if (!ir->inner && start <= ir->end && ir->start <= end)
			return true;
	return false;
}

/* The direct import or declaration holding @pa (query_pa_range()). */
static struct obmm_import_range *obmm_range_find(phys_addr_t pa)
{
	struct obmm_import_range *ir;

	list_for_each_entry(ir, &obmm_import_ranges, link)
		if (!ir->inner && ir->start <= pa && pa <= ir->end)
			return ir;
	return NULL;
}

static int obmm_range_insert(struct obmm_region *r, phys_addr_t start,
			     u64 len)
{
	struct obmm_import_range *ir;
	int ret = 0;

	ir = kzalloc(sizeof(*ir), GFP_KERNEL);
	if (!ir)
		return -ENOMEM;
	ir->start = start;
	ir->end = start + len - 1;
	ir->region = r;
	mutex_lock(&obmm_import_mutex);
	if (obmm_range_overlaps(ir->start, ir->end)) {
		ret = -EEXIST;
		kfree(ir);
	} else {
		list_add_tail(&ir->link, &obmm_import_ranges);
	}
	mutex_unlock(&obmm_import_mutex);
	return ret;
}

static void obmm_range_remove(struct obmm_region *r)
{
	struct obmm_import_range *ir, *tmp;

	mutex_lock(&obmm_import_mutex);
	list_for_each_entry_safe(ir, tmp, &obmm_import_ranges, link) {
		if (ir->region == r) {
			list_del(&ir->link);
			kfree(ir);
		}
	}
	mutex_unlock(&obmm_import_mutex);
}

static void obmm_preimport_blocks(const struct obmm_preimport *pre,
				  phys_addr_t start, phys_addr_t end,
				  unsigned long *first, unsigned long *last)
{
	u64 block = obmm_memory_block_bytes();

	*first = (start - pre->range.start) / block;
	*last = (end - pre->range.start) / block;
}

/*
 * preimport_commit_prefilled(): the declaration holding the import's PA
 * must be ready, have its datapath and contain the whole range, whose
 * memory blocks must be free (EFAULT unregistered, EINVAL a direct
 * import, EAGAIN not ready, EINVAL datapath or range, EEXIST a block
 * used).  Takes the blocks and puts the import on the range list.
 */
static int obmm_preimport_commit(struct obmm_region *r,
				 const struct obmm_cmd_import *cmd)
{
	phys_addr_t start = cmd->addr, end = cmd->addr + cmd->length - 1;
	struct obmm_import_range *ir, *inner;
	struct obmm_preimport *pre;
	unsigned long first, last;
	int ret = 0;

	inner = kzalloc(sizeof(*inner), GFP_KERNEL);
	if (!inner)
		return -ENOMEM;
	mutex_lock(&obmm_import_mutex);
	ir = obmm_range_find(start);
	if (!ir) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -EFAULT,
				  "No information found with PA requested.");
		goto out;
	}
	pre = ir->pre;
	if (!pre) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				  "PA requested is not a preimport address.");
		goto out;
	}
	if (!pre->ready) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -EAGAIN,
				  "Preimport process not finished. Try later.");
		goto out;
	}
	if (pre->scna != cmd->scna || pre->dcna != cmd->dcna) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				  "scna-dcna pair mismatch: <%#x, %#x> used in import; <%#x, %#x> in preimport.",
				  cmd->scna, cmd->dcna, pre->scna, pre->dcna);
		goto out;
	}
	if (memcmp(pre->seid, cmd->seid, sizeof(pre->seid))) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				  "seid mismatch: " OBMM_EID_FMT64 " used in import; " OBMM_EID_FMT64 " in preimport.",
				  OBMM_EID_ARGS64(cmd->seid), OBMM_EID_ARGS64(pre->seid));
		goto out;
	}
	if (memcmp(pre->deid, cmd->deid, sizeof(pre->deid))) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				  "deid mismatch: " OBMM_EID_FMT64 " used in import; " OBMM_EID_FMT64 " in preimport.",
				  OBMM_EID_ARGS64(cmd->deid), OBMM_EID_ARGS64(pre->deid));
		goto out;
	}
	if (start < ir->start || end > ir->end) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				  "requested range is not managed by preimport.");
		goto out;
	}
	obmm_preimport_blocks(pre, start, end, &first, &last);
	if (find_next_bit(pre->blocks, last + 1, first) <= last) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -EEXIST,
				  "requested range conflicts on preimport block %lu.",
				  find_next_bit(pre->blocks, last + 1, first));
		goto out;
	}
	bitmap_set(pre->blocks, first, last - first + 1);
	pre->use_count++;
	r->pre = pre;
	r->ubmem = &pre->res;
	r->numa_id = pre->numa_id;
	inner->start = start;
	inner->end = end;
	inner->region = r;
	inner->inner = true;
	list_add_tail(&inner->link, &obmm_import_ranges);
	inner = NULL;
out:
	mutex_unlock(&obmm_import_mutex);
	kfree(inner);
	return ret;
}

/* preimport_uncommit_prefilled(): give the blocks back. */
static void obmm_preimport_uncommit(struct obmm_region *r)
{
	struct obmm_preimport *pre = r->pre;
	unsigned long first, last;

	mutex_lock(&obmm_import_mutex);
	obmm_preimport_blocks(pre, r->pa, r->pa + r->size - 1, &first, &last);
	bitmap_clear(pre->blocks, first, last - first + 1);
	WARN_ON(!pre->use_count);
	pre->use_count--;
	mutex_unlock(&obmm_import_mutex);
	r->pre = NULL;
}

/*
 * Put an import under the revocation scan before it can be mapped, and
 * check its export once more under the scan's lock: a scan that ran since
 * the access check may already have acknowledged the withdrawal of that
 * export (it skipped the untracked import), and its memory may be reused.
 * -EACCES when the export is gone.
 */
static int obmm_range_track(struct obmm_region *r)
{
	bool unsure = false;
	int ret = 0;

	mutex_lock(&obmm_import_mutex);
	if (obmm_access_dep_lost(&r->dep, &unsure))
		ret = -EACCES;
	else
		r->tracked = true;
	mutex_unlock(&obmm_import_mutex);
	return ret;
}

/*
 * NUMA_REMOTE, under the borrow mutex and just before the hot-add: the
 * export may have been withdrawn while the IMPORT waited for that mutex,
 * the import revoked, the withdrawal acknowledged and the memory given to a
 * new export.  Checked under the import mutex, serialised with the
 * revocation scan: either the scan sees r->plugging and holds its
 * acknowledgment back, or this sees the revocation or the withdrawal.
 * -EACCES when the export is gone.
 */
static int obmm_range_plug_begin(struct obmm_region *r)
{
	bool unsure = false;
	int ret = 0;

	mutex_lock(&obmm_import_mutex);
	if (obmm_shmdev_revoked(r) || obmm_access_dep_lost(&r->dep, &unsure))
		ret = -EACCES;
	else
		WRITE_ONCE(r->plugging, true);
	mutex_unlock(&obmm_import_mutex);
	return ret;
}

static void obmm_unplug_kick(void)
{
	WRITE_ONCE(obmm_unplug_wanted, true);
	if (obmm_unplug_task)
		wake_up_process(obmm_unplug_task);
}

/* Widen @span to cover the borrow @r (its range in the exporter's RAM). */
static void obmm_held_add(struct obmm_held_span *span,
			  const struct obmm_region *r)
{
	u64 off;

	/* Outside every window cannot be: the import checked it. */
	if (obmm_fabric_window_node(r->pa, r->size, &off) < 0) {
		span->start = 0;
		span->end = U64_MAX;
		return;
	}
	if (!span->end || off < span->start)
		span->start = off;
	if (off + r->size > span->end)
		span->end = off + r->size;
}

/*
 * The revocation scan: revoke every import whose export is gone.  A
 * revoked import that is still mapped is zapped again on every scan, so a
 * mapping that raced with the revocation (set up by an mmap that passed
 * its check before the region was marked) cannot survive it.  Returns
 * the mask of exporter nodes some record of which could not be read (the
 * scan cannot vouch for their withdrawals this time).
 */
unsigned long obmm_imports_revoke_scan(void)
{
	struct obmm_held_span held[OBMM_EMU_MAX_NODES] = {};
	struct obmm_import_range *ir;
	unsigned long unsure_mask = 0, borrowed = 0;
	struct obmm_region *r;
	const char *why;
	unsigned int mapped;
	bool revoked, unsure;
	int published;

	mutex_lock(&obmm_import_mutex);
	list_for_each_entry(ir, &obmm_import_ranges, link) {
		r = ir->region;
		if (!r || !r->tracked)
			continue;
		/* Each record read may spin on a peer's stuck seq. */
		cond_resched();
		mutex_lock(&r->mmap_lock);
		revoked = r->revoked;
		mapped = r->mmap_count;
		mutex_unlock(&r->mmap_lock);
		if (!revoked) {
			unsure = false;
			why = obmm_access_dep_lost(&r->dep, &unsure);
			if (unsure)
				unsure_mask |= BIT(r->dep.node);
			if (!why)
				continue;
			pr_info("import mem_id %d revoked: %s (node %d record %d)\n",
				r->id, why, r->dep.node, r->dep.slot);
			mapped = 1;
		}
		if (mapped)
			obmm_shmdev_revoke(r);
		/* Held back from reuse while this kernel may use the memory. */
		if (READ_ONCE(r->plugged) || READ_ONCE(r->plugging)) {
			borrowed |= BIT(r->dep.node);
			obmm_held_add(&held[r->dep.node], r);
		}
	}
	spin_lock(&obmm_own_held_lock);
	obmm_own_held = held[obmm_emu_node_id];
	spin_unlock(&obmm_own_held_lock);
	borrowed &= ~BIT(obmm_emu_node_id);
	/*
	 * The node entry names one peer's held span: that peer's other
	 * withdrawals are acknowledged.  Borrows of further peers at once
	 * hold back their acknowledgment as a whole.
	 */
	published = borrowed ? __ffs(borrowed) : -1;
	if (published >= 0) {
		obmm_ctl_write_held(published, held[published].start,
				    held[published].end);
		borrowed &= ~BIT(published);
	} else {
		obmm_ctl_write_held(-1, 0, 0);
	}
	mutex_unlock(&obmm_import_mutex);
	if (published >= 0 || held[obmm_emu_node_id].end)
		obmm_unplug_kick();
	return unsure_mask | borrowed;
}

bool obmm_imports_own_borrow_held(u64 *start, u64 *end)
{
	bool held;

	spin_lock(&obmm_own_held_lock);
	*start = obmm_own_held.start;
	*end = obmm_own_held.end;
	held = obmm_own_held.end;
	spin_unlock(&obmm_own_held_lock);
	return held;
}

static void obmm_import_destroy(struct obmm_region *r);

/*
 * The next region the unplug thread has work for: a revoked borrow still
 * plugged, or an orphan.  Borrow mutex held: no UNIMPORT or failing IMPORT
 * can free a NUMA_REMOTE region meanwhile (both take it first).
 */
static struct obmm_region *obmm_unplug_next(void)
{
	struct obmm_import_range *ir;
	struct obmm_region *r, *found = NULL;

	mutex_lock(&obmm_import_mutex);
	list_for_each_entry(ir, &obmm_import_ranges, link) {
		r = ir->region;
		if (r && (r->orphan ||
			  (r->plugged && obmm_shmdev_revoked(r)))) {
			found = r;
			break;
		}
	}
	mutex_unlock(&obmm_import_mutex);
	return found;
}

struct obmm_unplug_deadline {
	struct timer_list timer;
	struct task_struct *task;
};

static void obmm_unplug_deadline_fn(struct timer_list *t)
{
	struct obmm_unplug_deadline *d = from_timer(d, t, timer);

	send_sig(SIGKILL, d->task, 1);
}

/*
 * One bounded try to offline and remove a borrowed range (the region lives
 * on, revoked, until UNIMPORT; an orphan's MEMID goes with the memory).  A
 * kernel thread gets no signal of its own, and offline_pages() retries a
 * page that cannot move (pinned) until one is pending: the deadline sends
 * it, the removal fails with -EINTR and every lock is dropped.
 */
static int obmm_unplug_try(struct obmm_region *r)
{
	struct obmm_unplug_deadline d = { .task = current };
	int ret;

	timer_setup_on_stack(&d.timer, obmm_unplug_deadline_fn, 0);
	mod_timer(&d.timer, jiffies + msecs_to_jiffies(OBMM_UNPLUG_TRY_MS));
	ret = obmm_borrow_remove_locked(r, !r->orphan);
	del_timer_sync(&d.timer);
	destroy_timer_on_stack(&d.timer);
	flush_signals(current);
	return ret;
}

/* One round over the thread's work; true when nothing is left to do. */
static bool obmm_unplug_round(void)
{
	struct obmm_region *r;
	int ret;

	if (!obmm_borrow_trylock())
		return false;
	while ((r = obmm_unplug_next())) {
		ret = r->plugged ? obmm_unplug_try(r) : 0;
		if (ret) {
			pr_warn_ratelimited("import mem_id %d: borrowed memory not removed yet: %d\n",
					    r->id, ret);
			obmm_borrow_unlock();
			return false;
		}
		if (!r->orphan) {
			pr_info("import mem_id %d: revoked borrowed memory removed from node %d\n",
				r->id, r->numa_id);
			continue;
		}
		if (r->memid_res.parent)
			release_resource(&r->memid_res);
		pr_info("import mem_id %d: the borrowed memory of a failed import removed from node %d\n",
			r->id, r->numa_id);
		obmm_import_destroy(r);
		module_put(THIS_MODULE);
	}
	obmm_borrow_unlock();
	return true;
}

/*
 * Unplug revoked borrows and orphans: offline (migrating the pages in use
 * to local memory) and remove them.  Kicked by the revocation scan, which
 * does so every period while such a borrow is left; a failed round backs
 * off with no lock held.
 */
static int obmm_unplug_thread(void *unused)
{
	/* The deadline's signal, sent by the kernel only. */
	allow_kernel_signal(SIGKILL);
	while (!kthread_should_stop()) {
		set_current_state(TASK_INTERRUPTIBLE);
		if (!READ_ONCE(obmm_unplug_wanted)) {
			schedule();
			continue;
		}
		__set_current_state(TASK_RUNNING);
		WRITE_ONCE(obmm_unplug_wanted, false);
		if (obmm_unplug_round())
			continue;
		WRITE_ONCE(obmm_unplug_wanted, true);
		schedule_timeout_interruptible(msecs_to_jiffies(OBMM_UNPLUG_BACKOFF_MS));
	}
	return 0;
}

/*
 * /sys/kernel/obmm_emu/revoked: mem_ids of revoked imports, space
 * separated, then a newline.  A sysfs file holds one page: when the next
 * id might not fit, the list ends with OBMM_REVOKED_MORE instead.
 */
#define OBMM_REVOKED_MORE	"...\n"
/* An upper bound on the widest entry: a region id and its separator. */
#define OBMM_REVOKED_ENTRY_MAX	sizeof(__stringify(OBMM_MAX_VALID_REGIONID) " ")

ssize_t obmm_imports_show_revoked(char *buf)
{
	const size_t room = PAGE_SIZE - sizeof(OBMM_REVOKED_MORE);
	struct obmm_import_range *ir;
	bool more = false;
	ssize_t len = 0;

	mutex_lock(&obmm_import_mutex);
	list_for_each_entry(ir, &obmm_import_ranges, link) {
		if (!ir->region || ir->region->orphan ||
		    !obmm_shmdev_revoked(ir->region))
			continue;
		if (len + OBMM_REVOKED_ENTRY_MAX > room) {
			more = true;
			break;
		}
		len += sysfs_emit_at(buf, len, "%d ", ir->region->id);
	}
	mutex_unlock(&obmm_import_mutex);
	len += sysfs_emit_at(buf, len, more ? OBMM_REVOKED_MORE : "\n");
	return len;
}

static bool obmm_base_dist_invalid(u8 base_dist)
{
	return base_dist >= 1 && base_dist <= OBMM_LOCAL_DISTANCE;
}

/* IMPORT checks 1, 3 and 4 (2, priv, is done by the caller in order). */
static int obmm_import_check_flags(u64 flags)
{
	bool mmap = flags & OBMM_IMPORT_FLAG_ALLOW_MMAP;
	bool numa = flags & OBMM_IMPORT_FLAG_NUMA_REMOTE;

	if (flags & ~OBMM_IMPORT_FLAG_MASK)
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				   "Invalid import flags %#lx (unknown flags: %#lx).",
				   (unsigned long)flags,
				   (unsigned long)(flags & ~OBMM_IMPORT_FLAG_MASK));
	if (mmap == numa)
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				   "Exactly one of {ALLOW_MMAP, NUMA_REMOTE} must be specified as import flag.");
	if ((flags & OBMM_IMPORT_FLAG_PREIMPORT) && !numa)
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				   "Preimport must be used with NUMA_REMOTE.");
	return 0;
}

static int obmm_import_check_range(const struct obmm_cmd_import *cmd)
{
	u64 end;

	if (!cmd->length)
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				   "Zero memory segment size is invalid");
	if (!IS_ALIGNED(cmd->addr, OBMM_BASIC_GRANU) ||
	    !IS_ALIGNED(cmd->length, OBMM_BASIC_GRANU))
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				   "PA segments not aligned to OBMM basic granu: base=%#llx, size=%#zx, granularity=%#lx.",
				   cmd->addr, (size_t)cmd->length,
				   (unsigned long)OBMM_BASIC_GRANU);
	if (!cmd->addr)
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL, "PA=0 unexpected.");
	if (check_add_overflow(cmd->addr, cmd->length, &end))
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				   "PA range overflow: base=%#llx, size=%#zx.",
				   cmd->addr, (size_t)cmd->length);
	if ((cmd->flags & OBMM_IMPORT_FLAG_NUMA_REMOTE) &&
	    !(cmd->flags & OBMM_IMPORT_FLAG_PREIMPORT) &&
	    obmm_base_dist_invalid(cmd->base_dist))
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				   "invalid numa base distance %d: reserved values used.",
				   cmd->base_dist);
	return 0;
}

#define OBMM_DIRECT_IMPORT_NAME	"DIRECT_IMPORT_UBMEM"

/*
 * Step 9 of IMPORT: the ubmem iomem resource.  It is requested as a child
 * of the window's BAR, never inserted above it: insert_resource() of a
 * range equal to the BAR would make it the BAR's parent, and releasing
 * it would unlink the BAR too.
 */
static int obmm_import_claim_ubmem(struct obmm_region *r,
				   struct resource *window)
{
	r->ubmem_res.name = OBMM_DIRECT_IMPORT_NAME;
	r->ubmem_res.start = r->pa;
	r->ubmem_res.end = r->pa + r->size - 1;
	r->ubmem_res.flags = IORESOURCE_MEM;
	if (request_resource(window, &r->ubmem_res))
		return obmm_refuse(OBMM_OP_IMPORT, -EBUSY,
				   "failed to setup ubmem resource: ret=%pe",
				   ERR_PTR(-EBUSY));
	r->ubmem = &r->ubmem_res;
	return 0;
}

/*
 * Step 11: "MEMID_<id>", under @parent: the import's ubmem resource, or
 * the borrowed "System RAM (Remote)" (found, and claimed under, with the
 * borrow mutex held: sibling imports of a preimport range add and remove
 * children of the same resource).
 */
static int obmm_import_claim_memid(struct obmm_region *r,
				   struct resource *parent)
{
	snprintf(r->memid_name, sizeof(r->memid_name), "MEMID_%d", r->id);
	r->memid_res.name = r->memid_name;
	r->memid_res.start = r->pa;
	r->memid_res.end = r->pa + r->size - 1;
	r->memid_res.flags = IORESOURCE_MEM;
	if (request_resource(parent, &r->memid_res))
		return obmm_refuse(OBMM_OP_IMPORT, -EBUSY,
				   "memid=%d: failed to setup memdev resource: %pe",
				   r->id, ERR_PTR(-EBUSY));
	return 0;
}

/* Direct imports; a borrow's MEMID went with obmm_import_unplug(). */
static void obmm_import_release_iomem(struct obmm_region *r)
{
	if (r->memid_res.parent)
		release_resource(&r->memid_res);
	if (r->ubmem_res.parent)
		release_resource(&r->ubmem_res);
}

/*
 * NUMA_REMOTE: take the borrowed range out again, and its MEMID resource,
 * under the borrow mutex (UNIMPORT, and IMPORT's rollback after a
 * hot-add).  remove_memory_remote()'s errno: -EINTR for a signal (or
 * killed waiting for the mutex), -EBUSY for an unmovable page.
 */
static int obmm_import_unplug(struct obmm_region *r)
{
	int ret;

	ret = obmm_borrow_lock_killable();
	if (ret)
		return ret;
	ret = obmm_borrow_remove_locked(r, false);
	if (!ret && r->memid_res.parent)
		release_resource(&r->memid_res);
	obmm_borrow_unlock();
	return ret;
}

/* What UNIMPORT and the unplug thread (for an orphan) leave of a region: nothing. */
static void obmm_import_destroy(struct obmm_region *r)
{
	obmm_shmdev_unpublish(r);
	obmm_import_release_iomem(r);
	if (r->pre)
		obmm_preimport_uncommit(r);
	obmm_range_remove(r);
	obmm_region_remove_id(r);
	obmm_region_free(r);
}

/*
 * IMPORT failed after its hot-add, and the memory could not be taken out
 * (a signal interrupted the offlining, a page could not move, or the
 * caller was killed): -ENOTRECOVERABLE, as the real driver, but nothing is
 * released under memory that is still online.  The region becomes an
 * orphan of the unplug thread, which removes the memory with its bounded
 * tries and then the region.  Until then it is
 * revoked, keeps its resources (and its preimport blocks: the declaration
 * stays in use), holds back this node's acknowledgment of the exporter's
 * withdrawals like any revoked borrow, and holds a module reference.
 */
static void obmm_import_orphan(struct obmm_region *r)
{
	__module_get(THIS_MODULE);
	obmm_shmdev_revoke(r);
	mutex_lock(&obmm_import_mutex);
	r->orphan = true;
	mutex_unlock(&obmm_import_mutex);
	obmm_unplug_kick();
}

/*
 * Step 10, NUMA_REMOTE: every window range is cacheable (so the real
 * driver's EINVAL for a non-cacheable one cannot occur); the emulated
 * UMMU check comes before anything is added; then add_memory_remote()
 * (EPERM for any failure, as the real driver) and the MEMID resource under
 * the added memory.  base_dist is validated in step 4 but not applied: x86
 * Linux cannot change node distances after boot (FIDELITY.md).  *added is
 * set once memory was hot-added: the caller must take it out on failure.
 */
static int obmm_import_numa(struct obmm_region *r,
			    const struct obmm_cmd_import *cmd, bool *added)
{
	u64 block = obmm_memory_block_bytes();
	int nid, ret;

	/*
	 * What add_memory_remote() refuses without touching anything (whole
	 * memory blocks, a remote node) is refused before the UMMU check, as
	 * every real check is; the hot-add may still fail after it.
	 */
	if (!IS_ALIGNED(cmd->addr, block) || !IS_ALIGNED(cmd->length, block))
		return obmm_refuse(OBMM_OP_IMPORT, -EPERM,
				   "Remote NUMA creation failed: %d", -EINVAL);
	nid = r->pre ? r->numa_id : cmd->numa_id;
	if (nid != NUMA_NO_NODE && !obmm_borrow_node_remote(nid))
		return obmm_refuse(OBMM_OP_IMPORT, -EPERM,
				   "Remote NUMA creation failed: %d", -EINVAL);
	if (!obmm_access_find_export(cmd->addr, cmd->length, &r->dep))
		return obmm_refuse_emu(OBMM_OP_IMPORT, -EACCES,
				   "no live export covers pa=%#llx size=%#llx: memory nobody exported is not hot-added",
				   cmd->addr, cmd->length);
	/*
	 * Memory its exporter's processes map (EXPORT_PID pages, an export
	 * mapped through its shmdev) is not hot-added: this kernel's pages
	 * would land where those mappings read and write (FIDELITY.md).
	 */
	if (r->dep.flags & (OBMM_EMU_REC_FLAG_FROM_USER |
			    OBMM_EMU_REC_FLAG_MAPPED))
		return obmm_refuse_emu(OBMM_OP_IMPORT, -EACCES,
				   "pa=%#llx size=%#llx: its exporter maps that memory (EXPORT_PID or mapped export): not hot-added",
				   cmd->addr, cmd->length);
	ret = obmm_range_track(r);
	if (ret)
		return obmm_refuse_emu(OBMM_OP_IMPORT, ret,
				   "emulated UMMU: the export covering pa=%#llx was withdrawn during the import",
				   cmd->addr);
	/* As the real IMPORT in lock_device_hotplug(): no EINTR (FIDELITY.md). */
	ret = obmm_borrow_lock_killable();
	if (ret)
		return obmm_refuse_emu(OBMM_OP_IMPORT, ret,
				   "killed while waiting for a memory hot-plug to finish (pa=%#llx)",
				   cmd->addr);
	ret = obmm_range_plug_begin(r);
	if (ret) {
		obmm_borrow_unlock();
		return obmm_refuse_emu(OBMM_OP_IMPORT, ret,
				   "emulated UMMU: the export covering pa=%#llx was withdrawn while the import waited for a memory hot-plug",
				   cmd->addr);
	}
	nid = obmm_borrow_add_locked(r, nid);
	WRITE_ONCE(r->plugging, false);
	if (nid < 0) {
		obmm_borrow_unlock();
		return obmm_refuse(OBMM_OP_IMPORT, -EPERM,
				   "Remote NUMA creation failed: %d", nid);
	}
	*added = true;
	r->numa_id = nid;
	ret = obmm_import_claim_memid(r, obmm_borrow_ram_res(r));
	obmm_borrow_unlock();
	return ret;
}

long obmm_import_ioctl(void __user *uarg)
{
	struct obmm_cmd_import cmd;
	struct obmm_region *r;
	bool ranged = false, added = false, prepared = false, numa, pre;
	int node, ret, undo;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_IMPORT, -EFAULT,
				   "failed to load import argument");
	ret = obmm_import_check_flags(cmd.flags);
	if (ret)
		return ret;
	numa = cmd.flags & OBMM_IMPORT_FLAG_NUMA_REMOTE;
	pre = cmd.flags & OBMM_IMPORT_FLAG_PREIMPORT;

	r = obmm_region_alloc(OBMM_REGION_IMPORT);
	if (!r)
		return obmm_refuse_emu(OBMM_OP_IMPORT, -ENOMEM, "no memory for a region");
	ret = obmm_copy_priv(r, cmd.priv, cmd.priv_len, OBMM_OP_IMPORT);
	if (ret)
		goto err_free;
	ret = obmm_import_check_range(&cmd);
	if (ret)
		goto err_free;
	ret = obmm_region_add_id(r, OBMM_OP_IMPORT);
	if (ret)
		goto err_free;
	if (!obmm_ubc_known_cna(cmd.scna)) {
		/* The lookup's ret: ub_mem_get_numa_id()'s NUMA_NO_NODE. */
		ret = obmm_refuse(OBMM_OP_IMPORT, -ENODEV,
				  "%#x is not a known scna, lookup ret=%pe",
				  cmd.scna, ERR_PTR(NUMA_NO_NODE));
		goto err_prepare;
	}
	if (!pre) {
		ret = obmm_range_insert(r, cmd.addr, cmd.length);
		if (ret == -EEXIST)
			/* obmm_addr_check.c:occupy_pa_range(), its pr_fmt's sub-prefix */
			obmm_refuse(OBMM_OP_IMPORT, ret,
				    "addr_check:failed to occupy PA range: ret=%pe",
				    ERR_PTR(ret));
		else if (ret)
			obmm_refuse_emu(OBMM_OP_IMPORT, ret, "no memory for the PA range");
		if (ret)
			goto err_prepare;
		ranged = true;
	}
	/* ub_memory_validate_pa(); scna was checked above. */
	node = obmm_fabric_window_node(cmd.addr, cmd.length, NULL);
	if (node < 0) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				  "PA range invalid. Non-UBMEM memory cannot be mmaped as import memory");
		goto err_range;
	}
	/* get_pa_range_mem_cap(): what the decoder range may be mapped as. */
	r->mem_cap = OBMM_CAP_NONCACHEABLE;
	if (!obmm_fabric_window_nc_only(node))
		r->mem_cap |= OBMM_CAP_CACHEABLE;
	r->pa = cmd.addr;
	r->size = cmd.length;
	r->numa_remote = numa;
	r->preimport = pre;
	r->numa_id = NUMA_NO_NODE;
	if (pre)
		ret = obmm_preimport_commit(r, &cmd);
	else
		ret = obmm_import_claim_ubmem(r, obmm_fabric_window(node)->res);
	if (ret)
		goto err_range;
	if (numa && !(r->mem_cap & OBMM_CAP_CACHEABLE)) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				  "PA range invalid. Cacheable memory cannot be managed with numa.remote");
		goto err_iomem;
	}
	if (numa) {
		ret = obmm_import_numa(r, &cmd, &added);
		if (ret)
			goto err_unplug;
	} else {
		ret = obmm_import_claim_memid(r, r->ubmem);
		if (ret)
			goto err_iomem;
		/*
		 * Emulated UMMU: the import reaches the export that covers
		 * it.  With none (or one withdrawn meanwhile) it is made all
		 * the same, as by the real driver, and starts revoked: every
		 * access faults, as the UMMU makes them fault on hardware.
		 */
		if (!obmm_access_find_export(cmd.addr, cmd.length, &r->dep) ||
		    obmm_range_track(r)) {
			r->revoked = true;
			pr_info("import mem_id %d: no live export covers pa=%#llx size=%#llx: its accesses fault (emulated UMMU)\n",
				r->id, cmd.addr, cmd.length);
		}
	}

	prepared = true;
	r->allow_mmap = !numa;
	r->scna = cmd.scna;
	r->dcna = cmd.dcna;
	memcpy(r->seid, cmd.seid, sizeof(r->seid));
	memcpy(r->deid, cmd.deid, sizeof(r->deid));
	ret = obmm_shmdev_publish(r);
	if (ret) {
		obmm_refuse(OBMM_OP_IMPORT, ret,
			    "Failed to create import device. ret=%pe", ERR_PTR(ret));
		goto err_unplug;
	}
	obmm_region_activate(r);

	cmd.mem_id = r->id;
	cmd.numa_id = r->numa_id;
	if (copy_to_user(uarg, &cmd, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_IMPORT, -EFAULT,
				   "failed to write import result");
	return 0;

err_unplug:
	undo = added ? obmm_import_unplug(r) : 0;
	if (undo) {
		/* The real driver's errno and line (obmm_import.c, the import's rollback). */
		ret = obmm_refuse(OBMM_OP_IMPORT, -ENOTRECOVERABLE,
				  "failed to teardown remote numa on rollback, ret=%pe.",
				  ERR_PTR(undo));
		if (!prepared)
			obmm_klog("Failed to prepare import memory: ret=%pe",
				  ERR_PTR(ret));
		obmm_import_orphan(r);
		return ret;
	}
err_iomem:
	obmm_import_release_iomem(r);
	if (r->pre)
		obmm_preimport_uncommit(r);
err_range:
	if (ranged || pre)
		obmm_range_remove(r);
err_prepare:
	/* The real obmm_import()'s line after prepare_import_memory()'s. */
	if (!prepared)
		obmm_klog("Failed to prepare import memory: ret=%pe",
			  ERR_PTR(ret));
	obmm_region_remove_id(r);
err_free:
	obmm_region_free(r);
	return ret;
}

long obmm_unimport_ioctl(void __user *uarg)
{
	struct obmm_cmd_unimport cmd;
	struct obmm_region *r;
	int ret;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_UNIMPORT, -EFAULT,
				   "failed to load unimport argument");
	ret = obmm_region_deactivate(OBMM_OP_UNIMPORT, cmd.mem_id, cmd.flags,
				     OBMM_UNIMPORT_FLAG_MASK,
				     OBMM_REGION_IMPORT, &r);
	if (ret)
		return ret;
	/* remove_memory_remote()'s errno when the memory cannot go yet. */
	ret = r->numa_remote ? obmm_import_unplug(r) : 0;
	if (ret) {
		obmm_region_reactivate(r);
		return obmm_refuse(OBMM_OP_UNIMPORT, ret,
				   "remove_memory_remote(nid=%d, size=%#llx) failed: ret=%pe.",
				   r->numa_id, r->size, ERR_PTR(ret));
	}
	obmm_import_destroy(r);
	return 0;
}

/* The real driver's check_preimport_cmd(), in its order. */
static int obmm_preimport_check(const struct obmm_cmd_preimport *cmd)
{
	u64 block = obmm_memory_block_bytes();
	phys_addr_t end;

	if (cmd->length % block)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "preimport length not aligned to %#lx.",
				   (unsigned long)block);
	if (cmd->pa % block)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "preimport base PA not aligned to %#lx.",
				   (unsigned long)block);
	if (check_add_overflow(cmd->pa, cmd->length, &end))
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "preimport PA range overflowed.");
	if (!cmd->length)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "invalid preimport length 0.");
	if (cmd->flags & ~OBMM_PREIMPORT_FLAG_MASK)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "undefined preimport flags specified in %#llx.",
				   cmd->flags);
	if (!obmm_ubc_known_cna(cmd->scna))
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -ENODEV,
				   "%#x is not a known scna, lookup ret=%pe",
				   cmd->scna, ERR_PTR(NUMA_NO_NODE));
	if (obmm_base_dist_invalid(cmd->base_dist))
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "invalid numa base distance %d: reserved values used.",
				   cmd->base_dist);
	if (!cmd->pa)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "invalid preimport PA base addr 0.");
	return 0;
}

static void obmm_preimport_free(struct obmm_preimport *pre)
{
	bitmap_free(pre->blocks);
	kfree(pre);
}

/* Take a declaration off the list (it may not be ready yet). */
static void obmm_preimport_unlist(struct obmm_preimport *pre)
{
	mutex_lock(&obmm_import_mutex);
	list_del(&pre->range.link);
	mutex_unlock(&obmm_import_mutex);
}

/*
 * The bitmap of a declaration's memory blocks, after the overlap check as
 * in the real driver (obmm_preimport_prefilled.c:
 * create_prefilled_preimport_range(), called by
 * preimport_prepare_prefilled() after occupy_pa_range()): -ENOMEM when
 * bitmap_zalloc() fails there, which it does for any length whose bitmap
 * is larger than kmalloc can give (above 2^52 bytes with 128 MiB blocks).
 * Such a length is refused before anything is allocated: asking kmalloc
 * for it trips the page allocator's WARN on a too large order.
 */
static int obmm_preimport_alloc_blocks(struct obmm_preimport *pre, u64 length)
{
	pre->nbits = length / obmm_memory_block_bytes();
	if (BITS_TO_LONGS(pre->nbits) > KMALLOC_MAX_SIZE / sizeof(long))
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -ENOMEM,
				   "failed to allocate preimport range bitmap.");
	pre->blocks = bitmap_zalloc(pre->nbits, GFP_KERNEL | __GFP_NOWARN);
	if (!pre->blocks)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -ENOMEM,
				   "failed to allocate preimport range bitmap.");
	return 0;
}

/*
 * Whether insert_resource() at the top of iomem, where the real driver
 * puts "PREIMPORT_UBMEM" (obmm_resource.c:setup_ubmem_resource()), would
 * refuse the range: it does when the range partly overlaps a resource.
 * Asked of the kernel itself with a resource inserted and removed again:
 * the emulator's own nests under the window's BAR (request_resource()),
 * where removing it cannot take the BAR along.
 */
static int obmm_preimport_iomem_conflict(phys_addr_t start, phys_addr_t end)
{
	struct resource probe = {
		.name = OBMM_PREIMPORT_RES_NAME,
		.start = start,
		.end = end,
		.flags = IORESOURCE_MEM,
	};

	if (insert_resource(&iomem_resource, &probe))
		return -EBUSY;
	WARN_ON(remove_resource(&probe));
	return 0;
}

/*
 * DECLARE_PREIMPORT: the real driver's checks and order
 * (obmm_preimport.c:obmm_preimport(), obmm_preimport_prefilled.c:
 * preimport_prepare_prefilled(): module get EPERM, check_preimport_cmd(),
 * EEXIST overlap, ENOMEM block bitmap, EBUSY iomem, EINVAL not UB memory,
 * EPERM no node; but EINVAL before EBUSY, see below), then the range is
 * listed with its node.  No memory is added yet.
 */
static int obmm_preimport_declare(struct obmm_cmd_preimport *cmd)
{
	struct obmm_preimport *pre;
	int node, nid, ret;

	ret = obmm_preimport_check(cmd);
	if (ret)
		return ret;
	pre = kzalloc(sizeof(*pre), GFP_KERNEL);
	if (!pre)
		return obmm_refuse_emu(OBMM_OP_DECLARE_PREIMPORT, -ENOMEM,
				   "no memory for a preimport range");
	pre->range.start = cmd->pa;
	pre->range.end = cmd->pa + cmd->length - 1;
	pre->range.pre = pre;
	pre->scna = cmd->scna;
	pre->dcna = cmd->dcna;
	memcpy(pre->seid, cmd->seid, sizeof(pre->seid));
	memcpy(pre->deid, cmd->deid, sizeof(pre->deid));

	mutex_lock(&obmm_import_mutex);
	ret = obmm_range_overlaps(pre->range.start, pre->range.end) ?
	      -EEXIST : 0;
	if (!ret)
		list_add_tail(&pre->range.link, &obmm_import_ranges);
	mutex_unlock(&obmm_import_mutex);
	if (ret) {
		/* occupy_pa_range()'s line (obmm_addr_check.c) */
		obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, ret,
			    "addr_check:failed to occupy PA range: ret=%pe",
			    ERR_PTR(ret));
		goto err_free;
	}
	ret = obmm_preimport_alloc_blocks(pre, cmd->length);
	if (ret)
		goto err_unlist;
	/*
	 * The window first (the real driver asks iomem first: EBUSY before
	 * EINVAL): the probe below puts a resource into the global tree for
	 * a moment, which for a range outside every window made it, however
	 * briefly, the parent of System RAM or of a device's BAR.
	 */
	node = obmm_fabric_window_node(cmd->pa, cmd->length, NULL);
	if (node < 0 || obmm_fabric_window_nc_only(node)) {
		ret = obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				  "PA range invalid. Cacheable memory cannot be managed with preimport");
		goto err_unlist;
	}
	ret = obmm_preimport_iomem_conflict(pre->range.start, pre->range.end);
	if (ret) {
		obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, ret,
			    "failed to setup ubmem resource on preimport: ret=%pe",
			    ERR_PTR(ret));
		goto err_unlist;
	}
	pre->res.name = OBMM_PREIMPORT_RES_NAME;
	pre->res.start = pre->range.start;
	pre->res.end = pre->range.end;
	pre->res.flags = IORESOURCE_MEM;
	if (request_resource(obmm_fabric_window(node)->res, &pre->res)) {
		ret = obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EBUSY,
				  "failed to setup ubmem resource on preimport: ret=%pe",
				  ERR_PTR(-EBUSY));
		goto err_unlist;
	}
	/* add_memory_remote(numa_id, ..., MEMORY_KEEP_ISOLATED) */
	nid = obmm_borrow_claim_node(cmd->numa_id);
	if (nid == -EINTR) {
		ret = obmm_refuse_emu(OBMM_OP_DECLARE_PREIMPORT, nid,
				      "killed while waiting for a memory hot-plug to finish");
		goto err_res;
	}
	if (nid == NUMA_NO_NODE) {
		ret = obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EPERM,
				  "failed to call add_memory_remote(nid=%d): %pe",
				  cmd->numa_id, ERR_PTR(-EINVAL));
		goto err_res;
	}
	pre->numa_id = nid;
	cmd->numa_id = nid;
	mutex_lock(&obmm_import_mutex);
	pre->ready = true;
	mutex_unlock(&obmm_import_mutex);
	return 0;

err_res:
	release_resource(&pre->res);
err_unlist:
	obmm_preimport_unlist(pre);
err_free:
	obmm_preimport_free(pre);
	return ret;
}

long obmm_declare_preimport_ioctl(void __user *uarg)
{
	struct obmm_cmd_preimport cmd;
	int ret;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EFAULT,
				   "failed to load preimport argument");
	/* Each declared range holds a module reference, as in the real driver. */
	if (!try_module_get(THIS_MODULE))
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EPERM,
				   "Module is dying. Reject all preimport requests");
	ret = obmm_preimport_declare(&cmd);
	if (ret) {
		module_put(THIS_MODULE);
		return ret;
	}
	/* The range stays declared, as in the real driver. */
	if (copy_to_user(uarg, &cmd, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EFAULT,
				   "failed to write preimport result");
	return 0;
}

/*
 * UNDECLARE_PREIMPORT: EINVAL flags, EFAULT PA not registered, EINVAL a
 * direct import, EAGAIN not ready, EINVAL not the exact range, EBUSY
 * still imported from.
 */
long obmm_undeclare_preimport_ioctl(void __user *uarg)
{
	struct obmm_cmd_preimport cmd;
	struct obmm_import_range *ir;
	struct obmm_preimport *pre = NULL;
	int ret = 0;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_UNDECLARE_PREIMPORT, -EFAULT,
				   "failed to load preimport argument");
	if (cmd.flags & ~OBMM_UNPREIMPORT_FLAG_MASK)
		return obmm_refuse(OBMM_OP_UNDECLARE_PREIMPORT, -EINVAL,
				   "undefined unpreimport flags specified in %#llx.",
				   cmd.flags);
	/* remove_memory_remote() of the declared range: the hot-plug lock first. */
	if (obmm_borrow_lock_killable())
		return obmm_refuse_emu(OBMM_OP_UNDECLARE_PREIMPORT, -EINTR,
				   "killed while waiting for a memory hot-plug to finish");
	mutex_lock(&obmm_import_mutex);
	ir = obmm_range_find(cmd.pa);
	/* get_pa_mapping()'s line, then preimport_release_prefilled()'s. */
	if (!ir) {
		obmm_klog("No information found with PA requested.");
		ret = -EFAULT;
	} else if (!ir->pre) {
		obmm_klog("PA requested is not a preimport address.");
		ret = -EINVAL;
	} else if (!ir->pre->ready) {
		obmm_klog("Preimport process not finished. Try later.");
		ret = -EAGAIN;
	}
	if (ret)
		ret = obmm_refuse(OBMM_OP_UNDECLARE_PREIMPORT, ret,
				  "failed to identify preimport range during unpreimport.");
	else if (ir->start != cmd.pa || ir->end != cmd.pa + cmd.length - 1)
		ret = obmm_refuse(OBMM_OP_UNDECLARE_PREIMPORT, -EINVAL,
				  "requested range touches ppr but is not an exact match.");
	else if (ir->pre->use_count)
		ret = obmm_refuse(OBMM_OP_UNDECLARE_PREIMPORT, -EBUSY,
				  "preimport cannot be released: %u active users found.",
				  ir->pre->use_count);
	if (!ret) {
		pre = ir->pre;
		list_del(&pre->range.link);
	}
	mutex_unlock(&obmm_import_mutex);
	if (!ret) {
		release_resource(&pre->res);
		obmm_borrow_release_node_locked(pre->numa_id);
	}
	obmm_borrow_unlock();
	if (ret)
		return ret;
	obmm_preimport_free(pre);
	module_put(THIS_MODULE);
	return 0;
}
