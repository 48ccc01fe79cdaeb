// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: the export pool, and its counters in
 * /sys/kernel/obmm_mempool/obmm-<nid>/ (the real driver's names).
 *
 * The guest kernel is booted with mem= below the end of its RAM; the
 * memory above (up to the end of the node's own
 * fabric window) is never used by the kernel and is handed out here in
 * physically contiguous runs of mem_allocator_granu bytes.  Freed memory
 * is zeroed by a background worker; export zeroes any granule that is
 * still dirty before handing it out.  Granules (up to gigabytes each) are
 * zeroed with the pool lock dropped: the worker claims its granule in
 * used_map (the_pool.zeroing says which), an export zeroes granules it has
 * already reserved.
 *
 * Unexported memory first sits in quarantine: it is released (zeroed,
 * then exported again) only once quarantine_ms (at least four
 * revocation-scan periods) have passed *and* every live peer acknowledged
 * the withdrawal in its own control-region entry, i.e. revoked and zapped
 * its imports of it (access.c); a peer declared dead no longer holds it.
 * No cross-VM lock is involved (README.md).  An EXPORT that only
 * quarantine keeps from succeeding waits for it, interruptibly, at most
 * quarantine_ms plus one scan period; memory still unacknowledged then
 * (a peer stopped, not yet declared dead) makes it fail with -EBUSY.
 * The pool of a new boot (reload, crash, reboot) starts quarantined the
 * same way, until every live peer acknowledged this boot: peers' imports
 * of the previous boot may still map it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bitmap.h>
#include <linux/delay.h>
#include <linux/io.h>
#include <linux/ioport.h>
#include <linux/jiffies.h>
#include <linux/kobject.h>
#include <linux/log2.h>
#include <linux/minmax.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/nodemask.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/wait.h>
#include <linux/sysfs.h>
#include <linux/workqueue.h>

#include "access.h"
#include "borrow.h"
#include "pool.h"
#include "testbed_fabric.h"

static unsigned long pool_base;
module_param(pool_base, ulong, 0444);
MODULE_PARM_DESC(pool_base,
		 "Pool physical base (default 0: the end of the kernel's RAM, mem=)");

static unsigned long pool_size;
module_param(pool_size, ulong, 0444);
MODULE_PARM_DESC(pool_size,
		 "Pool size in bytes (default 0: up to the end of the node's own window)");

/*
 * The real driver's pool parameters (drivers/ub/obmm/ubmempool_allocator.c,
 * obmm_cache.c): names, defaults, modes and what their parser accepts.
 * After load they read as the real ones do: mem_allocator_granu is set to
 * the granule in use.
 */
#define OBMM_PARAM_LEN			20

static char obmm_default_mempool_size[OBMM_PARAM_LEN] = "1G";
static char *mempool_size = obmm_default_mempool_size;
module_param(mempool_size, charp, 0440);
MODULE_PARM_DESC(mempool_size,
		 "Most memory the pools cache, split over the local nodes (default 1G); the pool's size when pool_size is 0");

#define OBMM_DEFAULT_REFILL_TIMEOUT_MS	30000

static int mempool_refill_timeout = OBMM_DEFAULT_REFILL_TIMEOUT_MS;
module_param(mempool_refill_timeout, int, 0440);
MODULE_PARM_DESC(mempool_refill_timeout,
		 "Accepted as by the real driver; the emulated pool never contracts, so it never refills");

enum obmm_allocator_id {
	OBMM_ALLOCATOR_HUGETLB_PMD,
	OBMM_ALLOCATOR_HUGETLB_PUD,
	OBMM_ALLOCATOR_BUDDY_HIGHMEM,
	OBMM_ALLOCATOR_MAX,
};

static const char * const obmm_allocator_names[] = {
	[OBMM_ALLOCATOR_HUGETLB_PMD] = "hugetlb_pmd",
	[OBMM_ALLOCATOR_HUGETLB_PUD] = "hugetlb_pud",
	[OBMM_ALLOCATOR_BUDDY_HIGHMEM] = "buddy_highmem",
};

static char obmm_default_allocator[OBMM_PARAM_LEN] = "buddy_highmem";
static char *mempool_allocator = obmm_default_allocator;
module_param(mempool_allocator, charp, 0440);
MODULE_PARM_DESC(mempool_allocator,
		 "hugetlb_pmd, hugetlb_pud or buddy_highmem (default); the emulated pool is the same memory above mem= for all three, the allocator sets its granule");

static bool skip_cache_maintain;
module_param(skip_cache_maintain, bool, 0444);
MODULE_PARM_DESC(skip_cache_maintain,
		 "Accepted as by the real driver; no effect (the emulator's cache model is the coherence parameter)");

static char *mem_allocator_granu;
module_param(mem_allocator_granu, charp, 0440);
MODULE_PARM_DESC(mem_allocator_granu,
		 "Pool granule (memseg size): 2M multiple, power of two; PMD_SIZE for hugetlb_pmd, PUD_SIZE for hugetlb_pud; set to the granule in use after load");

/* Decimal digits of a node id in "obmm-<nid>" */
#define OBMM_POOL_NID_LEN		8

#define OBMM_EMU_DEFAULT_QUARANTINE_MS	1000
/* quarantine_ms is raised to at least this many revocation-scan periods */
#define OBMM_EMU_QUARANTINE_MIN_SCANS	4

static unsigned int quarantine_ms = OBMM_EMU_DEFAULT_QUARANTINE_MS;
module_param(quarantine_ms, uint, 0444);
MODULE_PARM_DESC(quarantine_ms,
		 "Time in ms unexported memory waits before reuse (default 1000, min 4 revoke_scan_ms)");

#ifdef OBMM_EMU_TEST
static unsigned int test_zero_delay_ms;
module_param(test_zero_delay_ms, uint, 0600);
MODULE_PARM_DESC(test_zero_delay_ms,
		 "test only: the zero worker holds each granule it claimed this long before clearing it (ms, at most 5000)");

static unsigned int obmm_pool_test_zero_delay(void)
{
	return min_t(unsigned int, READ_ONCE(test_zero_delay_ms),
		     OBMM_TEST_DELAY_MAX_MS);
}
#endif

struct obmm_pool_state {
	bool present;
	int nid;
	phys_addr_t base;
	u64 size;
	u64 granu;
	unsigned long nr;
	unsigned long nr_used;
	unsigned long *used_map;
	unsigned long *dirty_map;
	/*
	 * quarantined granules stay set in used_map until release_at has
	 * passed and every live peer acknowledged their withdraw epoch
	 */
	unsigned long *quarantine_map;
	unsigned long *release_at;	/* jiffies, per granule */
	u64 *epoch;			/* withdraw epoch, per granule */
	unsigned long nr_quarantined;
	/* the granule the zero worker claimed, OBMM_POOL_NOT_ZEROING if none */
	unsigned long zeroing;
	wait_queue_head_t zeroing_wq;	/* woken when the claim ends */
	bool stopping;		/* module unload: the zero worker stops */
	struct resource *res;
	struct mutex lock;	/* protects the bitmaps and counters */
	struct work_struct zero_work;
	struct delayed_work quarantine_work;
};

#define OBMM_POOL_NOT_ZEROING	ULONG_MAX

/* mempool_size: the most this node's pool holds, when pool_size is 0 */
static u64 pool_cap;

static struct obmm_pool_state the_pool = {
	.granu = OBMM_DEFAULT_MEMSEG_SIZE,
	.zeroing = OBMM_POOL_NOT_ZEROING,
};

static enum obmm_allocator_id obmm_pool_allocator(void)
{
	int i;

	for (i = 0; i < OBMM_ALLOCATOR_MAX; i++)
		if (!strcmp(obmm_allocator_names[i], mempool_allocator))
			return i;
	pr_err("invalid mem allocator specified: %s\n", mempool_allocator);
	return OBMM_ALLOCATOR_MAX;
}

/* "2M", "1G": the granule in the largest unit that divides it. */
static void obmm_pool_print_granu(char *buf, size_t len, u64 granu)
{
	static const char * const units[] = { "", "K", "M", "G", "T" };
	unsigned int i = 0;

	while (granu >= SZ_1K && !(granu % SZ_1K) && i < ARRAY_SIZE(units) - 1) {
		granu /= SZ_1K;
		i++;
	}
	snprintf(buf, len, "%llu%s", granu, units[i]);
}

/* The real parser's checks, in its order, with its messages. */
static int obmm_pool_parse_granu(enum obmm_allocator_id aid)
{
	static char granu_in_use[OBMM_PARAM_LEN];
	char *end;
	u64 granu;

	if (!mem_allocator_granu) {
		if (aid == OBMM_ALLOCATOR_HUGETLB_PUD)
			granu = PUD_SIZE;
		else if (aid == OBMM_ALLOCATOR_HUGETLB_PMD)
			granu = PMD_SIZE;
		else
			granu = OBMM_DEFAULT_MEMSEG_SIZE;
		obmm_pool_print_granu(granu_in_use, sizeof(granu_in_use), granu);
		mem_allocator_granu = granu_in_use;
		the_pool.granu = granu;
		return 0;
	}
	granu = memparse(mem_allocator_granu, &end);
	if (*end) {
		pr_err("invalid mem_allocator_granu: %s\n", mem_allocator_granu);
		return -EINVAL;
	}
	if (granu < OBMM_BASIC_GRANU || granu % OBMM_BASIC_GRANU) {
		pr_err("unsupported mem_allocator_granu: %s\n", mem_allocator_granu);
		return -EINVAL;
	}
	if (!is_power_of_2(granu)) {
		pr_err("mem_allocator_granu must be power of 2: %s\n",
		       mem_allocator_granu);
		return -EINVAL;
	}
	if ((aid == OBMM_ALLOCATOR_HUGETLB_PUD && granu != PUD_SIZE) ||
	    (aid == OBMM_ALLOCATOR_HUGETLB_PMD && granu != PMD_SIZE)) {
		pr_err("unsupported mem_allocator_granu for %s allocator: %s\n",
		       obmm_allocator_names[aid], mem_allocator_granu);
		return -EINVAL;
	}
	the_pool.granu = granu;
	return 0;
}

/*
 * The pool parameters, checked as the real allocator's init checks them
 * (mempool_size, then the allocator, then the granule); -EINVAL fails the
 * load.  The emulator has one local node: mempool_size is its pool's cap.
 */
int obmm_pool_parse_params(void)
{
	enum obmm_allocator_id aid;
	char *end;

	if (mempool_size) {
		pool_cap = memparse(mempool_size, &end);
		pr_info("nid=%d, pool size = %#llx bytes.\n", first_online_node,
			pool_cap);
	}
	aid = obmm_pool_allocator();
	if (aid == OBMM_ALLOCATOR_MAX)
		return -EINVAL;
	return obmm_pool_parse_granu(aid);
}

bool obmm_pool_present(void)
{
	return the_pool.present;
}

int obmm_pool_nid(void)
{
	return the_pool.nid;
}

u64 obmm_pool_granu(void)
{
	return the_pool.granu;
}

phys_addr_t obmm_pool_base(void)
{
	return the_pool.base;
}

u64 obmm_pool_size(void)
{
	return the_pool.size;
}

static phys_addr_t obmm_pool_granule_pa(unsigned long idx)
{
	return the_pool.base + (phys_addr_t)idx * the_pool.granu;
}

/*
 * Zero one granule the caller owns (reserved by an export, or claimed by
 * the zero worker); called without the pool lock.
 */
static int obmm_pool_zero_granule(unsigned long idx)
{
	void *va;

	va = memremap(obmm_pool_granule_pa(idx), the_pool.granu, MEMREMAP_WB);
	if (!va)
		return -ENOMEM;
	memset(va, 0, the_pool.granu);
	memunmap(va);
	return 0;
}

#ifdef OBMM_EMU_TEST
/*
 * Test only: how a granule's delay ended, so that a test sees unload cut the
 * worker short from the log (an event) rather than from rmmod's wall time:
 * served (no unload yet), ended by unload, or served while unload waited.
 */
static void obmm_pool_test_zero_delay_wait(unsigned long idx)
{
	unsigned long delay = msecs_to_jiffies(obmm_pool_test_zero_delay());
	unsigned long end = jiffies + delay;
	const char *how = "served";

	if (!delay)
		return;
	/* Its return cannot tell: it is 1 when the delay ran out with stopping set. */
	wait_event_timeout(the_pool.zeroing_wq, READ_ONCE(the_pool.stopping),
			   delay);
	if (READ_ONCE(the_pool.stopping))
		how = time_before(jiffies, end) ? "ended by unload" :
						  "served while unload waited";
	pr_info("test: zero worker: granule %lu: delay %s\n", idx, how);
}
#else
static inline void obmm_pool_test_zero_delay_wait(unsigned long idx)
{
}
#endif

/*
 * Clear freed granules one by one, lowest first, until none is dirty or
 * the module unloads (what is left dirty then is nobody's: a load clears
 * the whole pool anew).
 */
static void obmm_pool_zero_work(struct work_struct *work)
{
	unsigned long idx = 0;
	int ret;

	for (;;) {
		mutex_lock(&the_pool.lock);
		if (the_pool.stopping) {
			mutex_unlock(&the_pool.lock);
			return;
		}
		for (;;) {
			idx = find_next_bit(the_pool.dirty_map, the_pool.nr, idx);
			if (idx >= the_pool.nr || !test_bit(idx, the_pool.used_map))
				break;
			idx++;
		}
		if (idx >= the_pool.nr) {
			mutex_unlock(&the_pool.lock);
			return;
		}
		/* Claim it: no export can take it while it is zeroed. */
		set_bit(idx, the_pool.used_map);
		WRITE_ONCE(the_pool.zeroing, idx);
		mutex_unlock(&the_pool.lock);

		obmm_pool_test_zero_delay_wait(idx);
		ret = obmm_pool_zero_granule(idx);

		mutex_lock(&the_pool.lock);
		if (!ret)
			clear_bit(idx, the_pool.dirty_map);
		clear_bit(idx, the_pool.used_map);
		WRITE_ONCE(the_pool.zeroing, OBMM_POOL_NOT_ZEROING);
		mutex_unlock(&the_pool.lock);
		wake_up_all(&the_pool.zeroing_wq);
		if (ret)
			idx++;
		cond_resched();
	}
}

/*
 * Free granules for an export of n granules, lowest first.  An export of
 * whole memory blocks first looks for a block-aligned run: only such a
 * range can be borrowed (NUMA_REMOTE hot-adds whole memory blocks, and a
 * window maps the pool at its own physical offsets).
 */
static unsigned long obmm_pool_find_aligned(unsigned long n, bool fast,
					    unsigned long align)
{
	unsigned long start = 0, idx, dirty, off;

	/* Granule index 0 sits at the_pool.base, which may not be aligned. */
	off = (the_pool.base / the_pool.granu) & align;
	for (;;) {
		idx = bitmap_find_next_zero_area_off(the_pool.used_map,
						     the_pool.nr, start, n,
						     align, off);
		if (idx >= the_pool.nr || !fast)
			return idx;
		dirty = find_next_bit(the_pool.dirty_map, idx + n, idx);
		if (dirty >= idx + n)
			return idx;
		start = dirty + 1;
	}
}

/*
 * The lowest run for n granules.  *@claimed: a lower run holds the granule
 * the zero worker is clearing; the caller waits for that claim to end, so
 * placement does not depend on where the worker is (right after a
 * quarantine ends it walks the freed memory granule by granule).  An
 * export of whole memory blocks first looks for a block-aligned run: only
 * such a range can be borrowed.
 */
static unsigned long obmm_pool_find(unsigned long n, bool fast, bool *claimed)
{
	u64 block = obmm_memory_block_bytes();
	unsigned long idx, lower, align = 0, z = the_pool.zeroing;

	*claimed = false;
	if (block > the_pool.granu && !(n * the_pool.granu % block))
		align = block / the_pool.granu - 1;
	for (;;) {
		idx = obmm_pool_find_aligned(n, fast, align);
		/* FAST takes cleared memory only, and the claimed granule is dirty. */
		if (z != OBMM_POOL_NOT_ZEROING && !fast) {
			clear_bit(z, the_pool.used_map);
			lower = obmm_pool_find_aligned(n, fast, align);
			set_bit(z, the_pool.used_map);
			if (lower < idx) {
				*claimed = true;
				return lower;
			}
		}
		if (idx < the_pool.nr || !align)
			return idx;
		align = 0;	/* no block-aligned run: any run */
	}
}

/* Until the zero worker's current claim ends; pool lock held, dropped meanwhile. */
static int obmm_pool_wait_zeroing(void)
{
	unsigned long z = the_pool.zeroing;
	int ret;

	mutex_unlock(&the_pool.lock);
	ret = wait_event_interruptible(the_pool.zeroing_wq,
				       READ_ONCE(the_pool.zeroing) != z);
	mutex_lock(&the_pool.lock);
	return ret;
}

/*
 * Return quarantined granules whose time passed and whose withdrawal every
 * live peer acknowledged to the free pool; pool lock held.  Returns the
 * jiffies until it is worth looking again (an expiry, or one scan period
 * while acknowledgments are outstanding), 0 when none is left.
 */
static unsigned long obmm_pool_release_quarantine(void)
{
	unsigned long i, now = jiffies, next = 0, left;
	unsigned long poll = msecs_to_jiffies(obmm_access_scan_ms());
	struct obmm_access_acks acks;
	bool released = false;

	if (!the_pool.nr_quarantined)
		return 0;
	obmm_access_acks(&acks);
	for_each_set_bit(i, the_pool.quarantine_map, the_pool.nr) {
		/* A borrower's held range stays out, the rest is released. */
		if (time_after_eq(now, the_pool.release_at[i]) &&
		    obmm_access_acked(&acks, the_pool.epoch[i],
				      the_pool.base + i * the_pool.granu,
				      the_pool.granu)) {
			clear_bit(i, the_pool.quarantine_map);
			clear_bit(i, the_pool.used_map);
			the_pool.nr_quarantined--;
			released = true;
			continue;
		}
		left = time_after_eq(now, the_pool.release_at[i]) ? poll :
		       the_pool.release_at[i] - now;
		if (!next || left < next)
			next = left;
	}
	if (released)
		schedule_work(&the_pool.zero_work);
	return next;
}

static void obmm_pool_quarantine_work(struct work_struct *work)
{
	unsigned long next;

	mutex_lock(&the_pool.lock);
	next = obmm_pool_release_quarantine();
	mutex_unlock(&the_pool.lock);
	if (next)
		schedule_delayed_work(&the_pool.quarantine_work, next);
}

/*
 * Free space that only quarantine or the zero worker's claim withholds:
 * wait for it (until @deadline) instead of failing.  Pool lock held;
 * dropped while sleeping.  0 when it is worth looking again, -ENOMEM when
 * waiting cannot help, -EBUSY when the deadline passed with quarantined
 * memory still unacknowledged by a live peer, -ERESTARTSYS when a signal
 * ended the wait (EINTR to the caller, or the ioctl restarted under
 * SA_RESTART: nothing was allocated yet).
 */
static int obmm_pool_wait_quarantine(unsigned long n, unsigned long deadline)
{
	unsigned long next, now;
	int ret;

	if (the_pool.zeroing != OBMM_POOL_NOT_ZEROING) {
		mutex_unlock(&the_pool.lock);
		ret = wait_event_interruptible(the_pool.zeroing_wq,
					       READ_ONCE(the_pool.zeroing) ==
					       OBMM_POOL_NOT_ZEROING);
		mutex_lock(&the_pool.lock);
		return ret;
	}
	if (n > the_pool.nr - the_pool.nr_used || !the_pool.nr_quarantined)
		return -ENOMEM;
	next = obmm_pool_release_quarantine();
	if (!next)
		return 0;
	now = jiffies;
	if (time_after_eq(now, deadline))
		return -EBUSY;
	next = min(next, deadline - now);
	mutex_unlock(&the_pool.lock);
	schedule_timeout_interruptible(next);
	mutex_lock(&the_pool.lock);
	obmm_pool_release_quarantine();
	return signal_pending(current) ? -ERESTARTSYS : 0;
}

/*
 * Allocate size bytes of zeroed, physically contiguous pool memory.
 * -EINVAL for a size that is not a multiple of the granule, -ENOMEM when
 * the pool cannot satisfy it (FAST: only already-cleared memory counts),
 * -EBUSY when only quarantined memory a live peer has not acknowledged
 * could (see obmm_pool_wait_quarantine()).
 */
int obmm_pool_alloc(u64 size, bool fast, phys_addr_t *pa)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(quarantine_ms) +
				 msecs_to_jiffies(obmm_access_scan_ms());
	unsigned long n, idx, i;
	bool claimed;
	int ret;

	if (!the_pool.present)
		return -ENODEV;
	if (!size || size % the_pool.granu)
		return -EINVAL;
	n = size / the_pool.granu;

	mutex_lock(&the_pool.lock);
	if (n > the_pool.nr - the_pool.nr_used) {
		ret = -ENOMEM;
		goto out;
	}
	for (;;) {
		idx = obmm_pool_find(n, fast, &claimed);
		if (idx < the_pool.nr && claimed) {
			ret = obmm_pool_wait_zeroing();
			if (ret)
				goto out;
			continue;
		}
		if (idx < the_pool.nr)
			break;
		/* FAST takes cleared memory only: waiting cannot help. */
		ret = fast ? -ENOMEM : obmm_pool_wait_quarantine(n, deadline);
		if (ret)
			goto out;
	}
	/* Reserve, then zero the dirty granules without the lock. */
	bitmap_set(the_pool.used_map, idx, n);
	the_pool.nr_used += n;
	mutex_unlock(&the_pool.lock);

	for (i = idx; i < idx + n; i++) {
		/* Reserved: only this export changes their dirty bits now. */
		if (!test_bit(i, the_pool.dirty_map))
			continue;
		ret = obmm_pool_zero_granule(i);
		if (ret)
			break;
		clear_bit(i, the_pool.dirty_map);
		cond_resched();
	}

	mutex_lock(&the_pool.lock);
	if (ret) {
		bitmap_clear(the_pool.used_map, idx, n);
		the_pool.nr_used -= n;
	} else {
		*pa = obmm_pool_granule_pa(idx);
	}
out:
	mutex_unlock(&the_pool.lock);
	return ret;
}

/*
 * Quarantine [pa, pa + size) until quarantine_ms passed and every live
 * peer acknowledged the withdraw @epoch (0: nothing to acknowledge).
 */
void obmm_pool_free(phys_addr_t pa, u64 size, u64 epoch)
{
	unsigned long idx = (pa - the_pool.base) / the_pool.granu;
	unsigned long n = size / the_pool.granu;

	unsigned long release = jiffies + msecs_to_jiffies(quarantine_ms);
	unsigned long i;

	mutex_lock(&the_pool.lock);
	/* Still set in used_map: quarantined until release. */
	for (i = idx; i < idx + n; i++) {
		set_bit(i, the_pool.quarantine_map);
		the_pool.release_at[i] = release;
		the_pool.epoch[i] = epoch;
	}
	bitmap_set(the_pool.dirty_map, idx, n);
	the_pool.nr_used -= n;
	the_pool.nr_quarantined += n;
	mutex_unlock(&the_pool.lock);
	schedule_delayed_work(&the_pool.quarantine_work,
			      msecs_to_jiffies(quarantine_ms));
}

/* quarantine_ms, raised at obmm_pool_init() to its minimum. */
unsigned long obmm_pool_quarantine_jiffies(void)
{
	return msecs_to_jiffies(quarantine_ms);
}

u64 obmm_pool_quarantined(void)
{
	u64 bytes;

	if (!the_pool.present)
		return 0;
	mutex_lock(&the_pool.lock);
	bytes = (u64)the_pool.nr_quarantined * the_pool.granu;
	mutex_unlock(&the_pool.lock);
	return bytes;
}

void obmm_pool_stats(u64 *total, u64 *used, u64 *cleared, u64 *uncleared)
{
	unsigned long dirty_free = 0, i;

	mutex_lock(&the_pool.lock);
	for_each_set_bit(i, the_pool.dirty_map, the_pool.nr)
		if (!test_bit(i, the_pool.used_map) || i == the_pool.zeroing)
			dirty_free++;
	*total = (u64)the_pool.nr * the_pool.granu;
	*used = (u64)the_pool.nr_used * the_pool.granu;
	*uncleared = (u64)(dirty_free + the_pool.nr_quarantined) *
		     the_pool.granu;
	*cleared = *total - *used - *uncleared;
	mutex_unlock(&the_pool.lock);
}

/* ---- /sys/kernel/obmm_mempool/obmm-<nid>/ ---- */

enum obmm_pool_stat {
	OBMM_POOL_TOTAL,
	OBMM_POOL_USED,
	OBMM_POOL_CLEARED,
	OBMM_POOL_UNCLEARED,
};

static ssize_t obmm_pool_stat_show(char *buf, enum obmm_pool_stat which)
{
	u64 v[] = { 0, 0, 0, 0 };

	obmm_pool_stats(&v[OBMM_POOL_TOTAL], &v[OBMM_POOL_USED],
			&v[OBMM_POOL_CLEARED], &v[OBMM_POOL_UNCLEARED]);
	return sysfs_emit(buf, "0x%llx\n", v[which]);
}

static ssize_t total_show(struct kobject *kobj, struct kobj_attribute *attr,
			  char *buf)
{
	return obmm_pool_stat_show(buf, OBMM_POOL_TOTAL);
}

static struct kobj_attribute obmm_pool_total_attr = __ATTR_RO_MODE(total, 0400);

static ssize_t used_show(struct kobject *kobj, struct kobj_attribute *attr,
			 char *buf)
{
	return obmm_pool_stat_show(buf, OBMM_POOL_USED);
}

static struct kobj_attribute obmm_pool_used_attr = __ATTR_RO_MODE(used, 0400);

static ssize_t available_cleared_show(struct kobject *kobj,
				      struct kobj_attribute *attr, char *buf)
{
	return obmm_pool_stat_show(buf, OBMM_POOL_CLEARED);
}

static struct kobj_attribute obmm_pool_cleared_attr =
	__ATTR_RO_MODE(available_cleared, 0400);

static ssize_t available_uncleared_show(struct kobject *kobj,
					struct kobj_attribute *attr, char *buf)
{
	return obmm_pool_stat_show(buf, OBMM_POOL_UNCLEARED);
}

static struct kobj_attribute obmm_pool_uncleared_attr =
	__ATTR_RO_MODE(available_uncleared, 0400);

static struct attribute *obmm_pool_attrs[] = {
	&obmm_pool_total_attr.attr,
	&obmm_pool_used_attr.attr,
	&obmm_pool_cleared_attr.attr,
	&obmm_pool_uncleared_attr.attr,
	NULL,
};

static const struct attribute_group obmm_pool_group = {
	.attrs = obmm_pool_attrs,
};

static struct kobject *obmm_mempool_kobj;
static struct kobject *obmm_pool_node_kobj;

static int obmm_pool_sysfs_init(void)
{
	char name[sizeof("obmm-") + OBMM_POOL_NID_LEN];
	int ret;

	obmm_mempool_kobj = kobject_create_and_add("obmm_mempool", kernel_kobj);
	if (!obmm_mempool_kobj)
		return -ENOMEM;
	snprintf(name, sizeof(name), "obmm-%d", the_pool.nid);
	obmm_pool_node_kobj = kobject_create_and_add(name, obmm_mempool_kobj);
	if (!obmm_pool_node_kobj) {
		ret = -ENOMEM;
		goto err_put;
	}
	ret = sysfs_create_group(obmm_pool_node_kobj, &obmm_pool_group);
	if (ret)
		goto err_node;
	return 0;
err_node:
	kobject_put(obmm_pool_node_kobj);
	obmm_pool_node_kobj = NULL;
err_put:
	kobject_put(obmm_mempool_kobj);
	obmm_mempool_kobj = NULL;
	return ret;
}

static void obmm_pool_sysfs_exit(void)
{
	if (obmm_pool_node_kobj) {
		sysfs_remove_group(obmm_pool_node_kobj, &obmm_pool_group);
		kobject_put(obmm_pool_node_kobj);
	}
	obmm_pool_node_kobj = NULL;
	kobject_put(obmm_mempool_kobj);
	obmm_mempool_kobj = NULL;
}

/* Claim [base, end) or the largest prefix of it that is free in iomem. */
static int obmm_pool_claim(phys_addr_t base, phys_addr_t end)
{
	while (end > base) {
		the_pool.res = request_mem_region(base, end - base,
						  "obmm_emu pool");
		if (the_pool.res) {
			the_pool.base = base;
			the_pool.size = end - base;
			return 0;
		}
		end -= the_pool.granu;
	}
	return -EBUSY;
}

static void obmm_pool_free_maps(void)
{
	kfree(the_pool.epoch);
	kfree(the_pool.release_at);
	bitmap_free(the_pool.quarantine_map);
	bitmap_free(the_pool.used_map);
	bitmap_free(the_pool.dirty_map);
	release_mem_region(the_pool.base, the_pool.size);
	the_pool.res = NULL;
}

static int obmm_pool_ram_end_cb(struct resource *res, void *arg)
{
	phys_addr_t *end = arg;

	if (!(res->flags & IORESOURCE_SYSRAM_DRIVER_MANAGED))
		*end = max_t(phys_addr_t, *end, res->end + 1);
	return 0;
}

/*
 * The end of the kernel's own RAM (mem=): of the System RAM that is not
 * driver-managed.  Not high_memory: a borrow's hot-add (borrow.c) raises
 * it to the window it added and removing the memory does not lower it.
 */
static phys_addr_t obmm_pool_ram_end(void)
{
	phys_addr_t end = 0;

	walk_iomem_res_desc(IORES_DESC_NONE,
			    IORESOURCE_SYSTEM_RAM | IORESOURCE_BUSY, 0, -1,
			    &end, obmm_pool_ram_end_cb);
	return end ?: virt_to_phys(high_memory - 1) + 1;
}

/*
 * The pool in [RAM end, RAM base + win_size) of this node, and its sysfs.  No room
 * for a pool is not an error: EXPORT then fails with -ENODEV.  scan_ms is
 * the revocation-scan period that quarantine_ms must cover.
 */
int obmm_pool_init(phys_addr_t win_size, unsigned int scan_ms)
{
	phys_addr_t ram_end, base, end;
	unsigned long i;
	/* The window holds this node's RAM from its base (testbed_fabric.h). */
	phys_addr_t win_end = TB_FABRIC_RAM_BASE + win_size;
	int ret;

	mutex_init(&the_pool.lock);
	init_waitqueue_head(&the_pool.zeroing_wq);
	INIT_WORK(&the_pool.zero_work, obmm_pool_zero_work);
	INIT_DELAYED_WORK(&the_pool.quarantine_work, obmm_pool_quarantine_work);
	the_pool.nid = first_online_node;
	quarantine_ms = max(quarantine_ms,
			    OBMM_EMU_QUARANTINE_MIN_SCANS * scan_ms);

	ram_end = obmm_pool_ram_end();
	base = pool_base ? pool_base : ram_end;
	base = ALIGN(base, the_pool.granu);
	if (pool_size)
		end = base + pool_size;
	else if (mempool_size)
		end = min_t(u64, base + pool_cap, win_end);
	else
		end = win_end;
	end = ALIGN_DOWN(end, the_pool.granu);
	if (base < ram_end || end > win_end || end <= base) {
		pr_warn("no export pool: RAM ends at %pa, window size %pa\n",
			&ram_end, &win_size);
		return 0;
	}
	ret = obmm_pool_claim(base, end);
	if (ret) {
		pr_warn("no export pool: [%pa, %pa) is busy\n", &base, &end);
		return 0;
	}
	the_pool.nr = the_pool.size / the_pool.granu;
	the_pool.used_map = bitmap_zalloc(the_pool.nr, GFP_KERNEL);
	the_pool.dirty_map = bitmap_zalloc(the_pool.nr, GFP_KERNEL);
	the_pool.quarantine_map = bitmap_zalloc(the_pool.nr, GFP_KERNEL);
	the_pool.release_at = kcalloc(the_pool.nr, sizeof(*the_pool.release_at),
				      GFP_KERNEL);
	the_pool.epoch = kcalloc(the_pool.nr, sizeof(*the_pool.epoch),
				 GFP_KERNEL);
	if (!the_pool.used_map || !the_pool.dirty_map ||
	    !the_pool.quarantine_map || !the_pool.release_at ||
	    !the_pool.epoch) {
		ret = -ENOMEM;
		goto err;
	}
	/* Nothing is known about the content left by a previous boot. */
	bitmap_fill(the_pool.dirty_map, the_pool.nr);
	/*
	 * Nor who maps it: peers' imports of the previous boot (a reload, a
	 * crash, a reboot) live until their scan sees this boot.  The pool
	 * starts quarantined (and is zeroed only once released): every live
	 * peer must acknowledge this boot first (obmm_pool_start()).
	 */
	bitmap_fill(the_pool.used_map, the_pool.nr);
	bitmap_fill(the_pool.quarantine_map, the_pool.nr);
	for (i = 0; i < the_pool.nr; i++) {
		the_pool.release_at[i] = jiffies;
		the_pool.epoch[i] = OBMM_ACCESS_EPOCH_BOOT;
	}
	the_pool.nr_quarantined = the_pool.nr;
	ret = obmm_pool_sysfs_init();
	if (ret)
		goto err;
	the_pool.present = true;
	pr_info("export pool %pa + 0x%llx, granule 0x%llx, node %d\n",
		&the_pool.base, the_pool.size, the_pool.granu, the_pool.nid);
	return 0;
err:
	obmm_pool_free_maps();
	return ret;
}

void obmm_pool_exit(void)
{
	if (!the_pool.present)
		return;
	obmm_pool_sysfs_exit();
	cancel_delayed_work_sync(&the_pool.quarantine_work);
	/* The worker stops after the granule it is clearing, not at the last one. */
	mutex_lock(&the_pool.lock);
	the_pool.stopping = true;
	mutex_unlock(&the_pool.lock);
	wake_up_all(&the_pool.zeroing_wq);
	cancel_work_sync(&the_pool.zero_work);
	the_pool.present = false;
	obmm_pool_free_maps();
	mutex_destroy(&the_pool.lock);
}

/* The scan runs: release the boot's quarantine once peers acknowledge. */
void obmm_pool_start(void)
{
	if (the_pool.present)
		schedule_delayed_work(&the_pool.quarantine_work, 0);
}
