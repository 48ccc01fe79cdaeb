// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: the `strict` coherence model (module parameter coherence=strict,
 * docs/coherence.md).
 *
 * The real driver maintains caches because cacheable views of UB memory are
 * not kept coherent across nodes: obmm_cache.c:flush_cache_by_pa, at the
 * points obmm_shm_dev.c:obmm_vma_close and obmm_shm_update_range choose
 * (obmm_ownership.c:update_page_ownership).  In strict mode a region keeps,
 * on this node, a shadow page for each region page a cacheable mapping
 * touched (shared by every process of the node), and its twin: the page as
 * memory had it at fill or at the last write-back.  Cacheable loads and
 * stores hit the shadow.  A write-back copies each 64-byte line where shadow
 * and twin differ to memory (a line is written whole); an invalidate zaps
 * the shadow's PTEs and frees it, so the next touch refills from memory.
 *
 * A worker scans the caches every coherence_scan_ms.  A clean cached line
 * whose memory changed is stale: the page's PTEs are zapped, and the next
 * touch (a use) reports it.  With coherence_evict it also evicts lines at
 * random, seeded: dirty ones written back, clean ones refilled.
 *
 * A region's cache is only touched under its mmap_lock.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bitmap.h>
#include <linux/debugfs.h>
#include <linux/io.h>
#include <linux/jiffies.h>
#include <linux/list.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/mutex.h>
#include <linux/prandom.h>
#include <linux/random.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/workqueue.h>

#include "cache.h"
#include "fabric.h"

#define OBMM_LINE		64
#define OBMM_LINES		(PAGE_SIZE / OBMM_LINE)
#define OBMM_REPORTS		256

static bool obmm_strict;

static int obmm_coherence_set(const char *val, const struct kernel_param *kp)
{
	if (sysfs_streq(val, "coherent") || sysfs_streq(val, "strict")) {
		obmm_strict = sysfs_streq(val, "strict");
		return 0;
	}
	/* The kernel's own line names neither value the emulator takes. */
	pr_err("emulator: coherence=%.32s: not coherent or strict\n", val);
	return -EINVAL;
}

static int obmm_coherence_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%s\n", obmm_strict ? "strict" : "coherent");
}

static const struct kernel_param_ops obmm_coherence_ops = {
	.set = obmm_coherence_set,
	.get = obmm_coherence_get,
};
module_param_cb(coherence, &obmm_coherence_ops, NULL, 0444);
MODULE_PARM_DESC(coherence,
		 "emulator: coherent (the fabric is coherent) or strict (each node caches what its cacheable mappings touch; docs/coherence.md)");

static unsigned int coherence_evict;
module_param(coherence_evict, uint, 0444);
MODULE_PARM_DESC(coherence_evict,
		 "emulator, strict: chance per scan, per cached line, in 1/1000, that the line is evicted (dirty: written back; clean: refilled)");

static ulong coherence_seed;
module_param(coherence_seed, ulong, 0444);
MODULE_PARM_DESC(coherence_seed,
		 "emulator, strict: seed of the eviction (0: random, printed at load)");

static unsigned int coherence_scan_ms = 20;
module_param(coherence_scan_ms, uint, 0444);
MODULE_PARM_DESC(coherence_scan_ms,
		 "emulator, strict: period of the stale-line scan and eviction (ms, 5..1000)");

/* One cached page: what this node's cacheable views see of it. */
struct obmm_cline_page {
	struct page *shadow;
	u8 *twin;
	/* lines found stale, whose page waits for its next touch */
	DECLARE_BITMAP(watch, OBMM_LINES);
	/* lines already reported since they were filled */
	DECLARE_BITMAP(reported, OBMM_LINES);
};

struct obmm_cache {
	struct obmm_region *r;
	struct list_head link;		/* obmm_caches */
	void *mem;			/* the region's memory, for the kernel */
	unsigned long nr;
	struct obmm_cline_page **pages;
};

enum obmm_report_kind {
	OBMM_STALE_READ,	/* a clean cached line used after memory changed */
	OBMM_LOST_WRITE,	/* a write-back over a line memory changed under */
	OBMM_DISCARDED,		/* an INVAL dropped a dirty line */
};

static const char *const obmm_report_names[] = {
	[OBMM_STALE_READ] = "stale read",
	[OBMM_LOST_WRITE] = "lost write",
	[OBMM_DISCARDED] = "discarded write",
};

/* What would have made the line right, per kind. */
static const char *const obmm_report_fixes[] = {
	[OBMM_STALE_READ] = "invalidate before reading: UPDATE_RANGE with cache_ops INVAL (or INFER to NO_ACCESS as the last reader), munmap and mmap again, or map it O_SYNC; the writer must have written back (its munmap, or UPDATE_RANGE off READWRITE)",
	[OBMM_LOST_WRITE] = "two nodes held this 64-byte line dirty: give each writer its own lines, or hand ownership over (UPDATE_RANGE off READWRITE, WB) before the other writes",
	[OBMM_DISCARDED] = "INVAL drops dirty lines: use WB_INVAL (or WB_ONLY first) on a range this node wrote",
};

struct obmm_report {
	u64 seq;
	int mem_id;
	u64 offset;		/* of the line in the region */
	u8 kind;
	u16 byte;		/* first differing byte in the line */
	u64 cached;		/* the 8 bytes there: this node's copy */
	u64 memory;		/* and memory's */
};

static DEFINE_MUTEX(obmm_caches_lock);
static LIST_HEAD(obmm_caches);
static struct delayed_work obmm_scan_work;
static struct rnd_state obmm_rnd;
static struct dentry *obmm_debugfs;

static DEFINE_SPINLOCK(obmm_reports_lock);
static struct obmm_report obmm_reports[OBMM_REPORTS];
static u64 obmm_report_seq;

static atomic64_t obmm_stat_fills, obmm_stat_wb_lines, obmm_stat_invals,
	obmm_stat_evictions, obmm_stat_user_lines;

bool obmm_cache_strict(void)
{
	return obmm_strict;
}

/* Whether the region's mappings on this node go through its cache. */
bool obmm_cache_on(const struct obmm_region *r)
{
	return obmm_strict && r->mmap_mode == OBMM_MMAP_MODE_CACHEABLE;
}

static void obmm_report(struct obmm_region *r, u64 line_off, u8 kind,
			const u8 *cached, const u8 *memory)
{
	struct obmm_report *rep;
	unsigned int b = 0;
	u64 c = 0, m = 0;

	while (b < OBMM_LINE - 1 && cached[b] == memory[b])
		b++;
	b = min_t(unsigned int, b, OBMM_LINE - sizeof(u64));
	memcpy(&c, cached + b, sizeof(c));
	memcpy(&m, memory + b, sizeof(m));
	spin_lock(&obmm_reports_lock);
	rep = &obmm_reports[obmm_report_seq % OBMM_REPORTS];
	rep->seq = ++obmm_report_seq;
	rep->mem_id = r->id;
	rep->offset = line_off;
	rep->kind = kind;
	rep->byte = b;
	rep->cached = c;
	rep->memory = m;
	spin_unlock(&obmm_reports_lock);
	pr_warn_ratelimited("coherence: %s: node %d mem_id %d offset 0x%llx: this node's cached line has %#018llx at byte %u, memory %#018llx; %s\n",
			    obmm_report_names[kind], obmm_emu_node_id, r->id,
			    line_off, c, b, m, obmm_report_fixes[kind]);
}

static struct obmm_cache *obmm_cache_get(struct obmm_region *r)
{
	struct obmm_cache *c = r->cache;

	if (c)
		return c;
	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c)
		return NULL;
	c->r = r;
	c->nr = r->size >> PAGE_SHIFT;
	c->pages = kvcalloc(c->nr, sizeof(*c->pages), OBMM_GFP_SIZED);
	/* memremap() of memory that is not RAM is ioremap_cache(). */
	c->mem = memremap(r->pa, r->size, MEMREMAP_WB);
	if (!c->pages || !c->mem) {
		if (c->mem)
			memunmap(c->mem);
		kvfree(c->pages);
		kfree(c);
		return NULL;
	}
	mutex_lock(&obmm_caches_lock);
	list_add(&c->link, &obmm_caches);
	mutex_unlock(&obmm_caches_lock);
	r->cache = c;
	return c;
}

static u8 *obmm_cline_mem(struct obmm_cache *c, unsigned long pg)
{
	return (u8 *)c->mem + (pg << PAGE_SHIFT);
}

/* The cached page @pg, filled from memory if it is not cached. */
static struct obmm_cline_page *obmm_cline_fill(struct obmm_cache *c,
					       unsigned long pg)
{
	struct obmm_cline_page *p = c->pages[pg];

	if (p)
		return p;
	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return NULL;
	p->twin = kmalloc(PAGE_SIZE, GFP_KERNEL);
	p->shadow = alloc_page(GFP_KERNEL);
	if (!p->twin || !p->shadow) {
		if (p->shadow)
			__free_page(p->shadow);
		kfree(p->twin);
		kfree(p);
		return NULL;
	}
	memcpy(p->twin, obmm_cline_mem(c, pg), PAGE_SIZE);
	memcpy(page_address(p->shadow), p->twin, PAGE_SIZE);
	c->pages[pg] = p;
	atomic64_inc(&obmm_stat_fills);
	return p;
}

static bool obmm_line_differs(const u8 *a, const u8 *b, unsigned int line)
{
	return memcmp(a + line * OBMM_LINE, b + line * OBMM_LINE, OBMM_LINE);
}

/*
 * Whether writing @snap over memory loses another writer's store: a byte
 * memory changed since the twin was taken gets another value.
 */
static bool obmm_line_lost(const u8 *mem, const u8 *twin, const u8 *snap)
{
	unsigned int i;

	for (i = 0; i < OBMM_LINE; i++)
		if (mem[i] != twin[i] && snap[i] != mem[i])
			return true;
	return false;
}

/*
 * Write line @line of the page back: memory and twin get the shadow's, as
 * one snapshot, so that a store landing meanwhile stays dirty.
 */
static void obmm_line_write_back(struct obmm_cache *c, unsigned long pg,
				 struct obmm_cline_page *p, unsigned int line)
{
	u8 *mem = obmm_cline_mem(c, pg);
	u8 *shadow = page_address(p->shadow);
	size_t at = line * OBMM_LINE;
	u8 snap[OBMM_LINE];

	memcpy(snap, shadow + at, OBMM_LINE);
	if (obmm_line_lost(mem + at, p->twin + at, snap))
		obmm_report(c->r, ((u64)pg << PAGE_SHIFT) + at, OBMM_LOST_WRITE,
			    snap, mem + at);
	memcpy(mem + at, snap, OBMM_LINE);
	memcpy(p->twin + at, snap, OBMM_LINE);
	atomic64_inc(&obmm_stat_wb_lines);
}

/* Write back every dirty line of the page: shadow differs from twin. */
static void obmm_page_write_back(struct obmm_cache *c, unsigned long pg,
				 struct obmm_cline_page *p)
{
	u8 *shadow = page_address(p->shadow);
	unsigned int line;

	for (line = 0; line < OBMM_LINES; line++)
		if (obmm_line_differs(shadow, p->twin, line))
			obmm_line_write_back(c, pg, p, line);
}

/* No user PTE maps the shadow of page @pg any more (on this node). */
static void obmm_page_zap(struct obmm_cache *c, unsigned long pg)
{
	unmap_mapping_range(c->r->map_inode->i_mapping,
			    (loff_t)pg << PAGE_SHIFT, PAGE_SIZE, 1);
}

static void obmm_page_free(struct obmm_cache *c, unsigned long pg)
{
	struct obmm_cline_page *p = c->pages[pg];

	c->pages[pg] = NULL;
	__free_page(p->shadow);
	kfree(p->twin);
	kfree(p);
}

/*
 * User DC instructions between their trap and the model's maintenance of
 * their line (usermaint.c): the kernel executing one for the task may fault
 * its page in, and that is no use of the line.  A few at a time: one per
 * task, which runs its maintenance before it returns to user mode.
 */
#ifdef CONFIG_ARM64
#define OBMM_DC_SLOTS	16
static DEFINE_SPINLOCK(obmm_dc_lock);
static struct {
	struct task_struct *task;
	unsigned long addr;
} obmm_dc[OBMM_DC_SLOTS];

void obmm_cache_dc_begin(unsigned long addr)
{
	unsigned long flags;
	int i, free = -1;

	spin_lock_irqsave(&obmm_dc_lock, flags);
	for (i = 0; i < OBMM_DC_SLOTS; i++) {
		if (obmm_dc[i].task == current) {
			free = i;
			break;
		}
		if (!obmm_dc[i].task && free < 0)
			free = i;
	}
	if (free >= 0) {
		obmm_dc[free].task = current;
		obmm_dc[free].addr = addr;
	}
	spin_unlock_irqrestore(&obmm_dc_lock, flags);
}

void obmm_cache_dc_end(void)
{
	unsigned long flags;
	int i;

	spin_lock_irqsave(&obmm_dc_lock, flags);
	for (i = 0; i < OBMM_DC_SLOTS; i++)
		if (obmm_dc[i].task == current)
			obmm_dc[i].task = NULL;
	spin_unlock_irqrestore(&obmm_dc_lock, flags);
}

/* Whether a DC of this task is on the page at user address @page. */
static bool obmm_dc_pending(unsigned long page)
{
	unsigned long flags;
	bool found = false;
	int i;

	spin_lock_irqsave(&obmm_dc_lock, flags);
	for (i = 0; i < OBMM_DC_SLOTS; i++)
		if (obmm_dc[i].task == current &&
		    (obmm_dc[i].addr & PAGE_MASK) == (page & PAGE_MASK))
			found = true;
	spin_unlock_irqrestore(&obmm_dc_lock, flags);
	return found;
}
#else
static bool obmm_dc_pending(unsigned long page)
{
	return false;
}
#endif

/* Report the watched lines of a touched page that are still stale. */
static void obmm_page_used(struct obmm_cache *c, unsigned long pg,
			   struct obmm_cline_page *p)
{
	u8 *mem = obmm_cline_mem(c, pg);
	u8 *shadow = page_address(p->shadow);
	unsigned int line;

	/* One report per use of the page: its first stale line. */
	for_each_set_bit(line, p->watch, OBMM_LINES) {
		if (obmm_line_differs(shadow, p->twin, line) ||
		    !obmm_line_differs(mem, p->twin, line))
			continue;
		if (bitmap_empty(p->reported, OBMM_LINES))
			obmm_report(c->r, ((u64)pg << PAGE_SHIFT) +
				    line * OBMM_LINE, OBMM_STALE_READ,
				    shadow + line * OBMM_LINE,
				    mem + line * OBMM_LINE);
		set_bit(line, p->reported);
	}
	bitmap_zero(p->watch, OBMM_LINES);
}

/*
 * The fault of a cacheable mapping in strict mode: map the page's shadow
 * (filled now if it is not cached).  mmap_lock held.
 */
vm_fault_t obmm_cache_fault(struct obmm_region *r, struct vm_area_struct *vma,
			    unsigned long addr, u64 off, pgprot_t prot)
{
	struct obmm_cache *c = obmm_cache_get(r);
	struct obmm_cline_page *p;
	unsigned long pg = off >> PAGE_SHIFT;

	if (!c || pg >= c->nr)
		return c ? VM_FAULT_SIGBUS : VM_FAULT_OOM;
	p = obmm_cline_fill(c, pg);
	if (!p)
		return VM_FAULT_OOM;
	/*
	 * The kernel executing a user DC for the task faults the page in: no
	 * use.  Its maintenance zaps the page again while lines stay watched.
	 */
	if (!bitmap_empty(p->watch, OBMM_LINES) && !obmm_dc_pending(addr))
		obmm_page_used(c, pg, p);
	return vmf_insert_pfn_prot(vma, addr, page_to_pfn(p->shadow), prot);
}

/* ptrace and /proc/pid/mem of a strict cacheable mapping: the shadow. */
int obmm_cache_access(struct obmm_region *r, u64 off, void *buf, int len,
		      bool write)
{
	struct obmm_cache *c = obmm_cache_get(r);
	struct obmm_cline_page *p;
	u8 *shadow;

	if (!c)
		return -ENOMEM;
	if ((off >> PAGE_SHIFT) >= c->nr)
		return -EINVAL;
	p = obmm_cline_fill(c, off >> PAGE_SHIFT);
	if (!p)
		return -ENOMEM;
	len = min_t(int, len, PAGE_SIZE - offset_in_page(off));
	shadow = (u8 *)page_address(p->shadow) + offset_in_page(off);
	if (write)
		memcpy(shadow, buf, len);
	else
		memcpy(buf, shadow, len);
	return len;
}

/*
 * A user's maintenance of the line holding region offset @off (arm64 EL0
 * DC CVAC, CVAP, CVADP, CVAU: clean; DC CIVAC: clean and invalidate): a
 * clean writes the line back if it is dirty, an invalidate then refills it
 * from memory, so the next load sees memory.  The rest of the page stays
 * cached.  Nothing when the page is not cached.  mmap_lock held.
 */
void obmm_cache_line_maintain(struct obmm_region *r, u64 off, bool inval)
{
	struct obmm_cache *c = r->cache;
	unsigned long pg = off >> PAGE_SHIFT;
	unsigned int line = offset_in_page(off) / OBMM_LINE;
	size_t at = line * OBMM_LINE;
	struct obmm_cline_page *p;
	u8 *shadow;

	if (!c || pg >= c->nr || !c->pages[pg])
		return;
	p = c->pages[pg];
	shadow = page_address(p->shadow);
	atomic64_inc(&obmm_stat_user_lines);
	if (!r->revoked && obmm_line_differs(shadow, p->twin, line))
		obmm_line_write_back(c, pg, p, line);
	if (inval && !r->revoked) {
		memcpy(p->twin + at, obmm_cline_mem(c, pg) + at, OBMM_LINE);
		memcpy(shadow + at, p->twin + at, OBMM_LINE);
		clear_bit(line, p->watch);
		clear_bit(line, p->reported);
	}
	/* Stale lines left: the next touch is a use again (obmm_cache_fault). */
	if (!bitmap_empty(p->watch, OBMM_LINES))
		obmm_page_zap(c, pg);
}

/*
 * Cache maintenance @ops (OBMM_SHM_CACHE_*) of region range [off, off +
 * len) on this node: what obmm_cache.c:flush_cache_by_pa does there.
 * mmap_lock held.
 */
void obmm_cache_maintain(struct obmm_region *r, u64 off, u64 len, u8 ops)
{
	struct obmm_cache *c = r->cache;
	bool wb = ops == OBMM_SHM_CACHE_WB_ONLY || ops == OBMM_SHM_CACHE_WB_INVAL;
	bool inval = ops == OBMM_SHM_CACHE_INVAL || ops == OBMM_SHM_CACHE_WB_INVAL;
	unsigned long pg, end;
	struct obmm_cline_page *p;
	unsigned int line;

	if (!c || !len || (!wb && !inval))
		return;
	end = min_t(u64, (off + len + PAGE_SIZE - 1) >> PAGE_SHIFT, c->nr);
	for (pg = off >> PAGE_SHIFT; pg < end; pg++) {
		p = c->pages[pg];
		if (!p)
			continue;
		/* No store may land in the shadow while it goes. */
		if (inval)
			obmm_page_zap(c, pg);
		if (wb && !r->revoked)
			obmm_page_write_back(c, pg, p);
		if (!inval)
			continue;
		for (line = 0; line < OBMM_LINES && !wb; line++)
			if (obmm_line_differs(page_address(p->shadow), p->twin,
					      line)) {
				obmm_report(r, ((u64)pg << PAGE_SHIFT) +
					    line * OBMM_LINE, OBMM_DISCARDED,
					    (u8 *)page_address(p->shadow) +
					    line * OBMM_LINE,
					    p->twin + line * OBMM_LINE);
				break;
			}
		obmm_page_free(c, pg);
		atomic64_inc(&obmm_stat_invals);
	}
}

/*
 * The region's cache goes (its last cacheable mapping closed, or the
 * import was revoked): dirty lines are written back, as a cache evicts
 * them in time, unless @write_back is false (the memory is gone).
 * mmap_lock held.
 */
void obmm_cache_release(struct obmm_region *r, bool write_back)
{
	struct obmm_cache *c = r->cache;
	unsigned long pg;

	if (!c)
		return;
	mutex_lock(&obmm_caches_lock);
	list_del(&c->link);
	mutex_unlock(&obmm_caches_lock);
	for (pg = 0; pg < c->nr; pg++) {
		if (!c->pages[pg])
			continue;
		obmm_page_zap(c, pg);
		if (write_back)
			obmm_page_write_back(c, pg, c->pages[pg]);
		obmm_page_free(c, pg);
	}
	r->cache = NULL;
	memunmap(c->mem);
	kvfree(c->pages);
	kfree(c);
}

/*
 * One scan of one cached page: stale lines are watched, lines evicted.  A
 * page with a line to evict is zapped first, so no store lands in a clean
 * line while it is refilled.
 */
static void obmm_scan_page(struct obmm_cache *c, unsigned long pg,
			   struct obmm_cline_page *p)
{
	DECLARE_BITMAP(evict, OBMM_LINES);
	u8 *mem = obmm_cline_mem(c, pg);
	u8 *shadow = page_address(p->shadow);
	bool zap = false;
	unsigned int line;
	size_t at;

	bitmap_zero(evict, OBMM_LINES);
	for (line = 0; coherence_evict && line < OBMM_LINES; line++)
		if (prandom_u32_state(&obmm_rnd) % 1000 < coherence_evict)
			set_bit(line, evict);
	if (!bitmap_empty(evict, OBMM_LINES))
		obmm_page_zap(c, pg);
	for (line = 0; line < OBMM_LINES; line++) {
		at = line * OBMM_LINE;
		if (test_bit(line, evict)) {
			atomic64_inc(&obmm_stat_evictions);
			if (obmm_line_differs(shadow, p->twin, line)) {
				obmm_line_write_back(c, pg, p, line);
			} else {
				memcpy(p->twin + at, mem + at, OBMM_LINE);
				memcpy(shadow + at, p->twin + at, OBMM_LINE);
				clear_bit(line, p->reported);
				clear_bit(line, p->watch);
			}
			continue;
		}
		if (test_bit(line, p->reported) || test_bit(line, p->watch) ||
		    obmm_line_differs(shadow, p->twin, line) ||
		    !obmm_line_differs(mem, p->twin, line))
			continue;
		set_bit(line, p->watch);
		zap = true;
	}
	/* The next touch of the page faults: a use of its stale lines. */
	if (zap)
		obmm_page_zap(c, pg);
}

static void obmm_scan(struct work_struct *work)
{
	struct obmm_cache *c;
	unsigned long pg;

	mutex_lock(&obmm_caches_lock);
	list_for_each_entry(c, &obmm_caches, link) {
		/* A cache goes under mmap_lock, taking obmm_caches_lock. */
		if (!mutex_trylock(&c->r->mmap_lock))
			continue;
		for (pg = 0; pg < c->nr; pg++)
			if (c->pages[pg])
				obmm_scan_page(c, pg, c->pages[pg]);
		mutex_unlock(&c->r->mmap_lock);
		cond_resched();
	}
	mutex_unlock(&obmm_caches_lock);
	schedule_delayed_work(&obmm_scan_work,
			      msecs_to_jiffies(coherence_scan_ms));
}

static int obmm_reports_show(struct seq_file *m, void *v)
{
	struct obmm_report rep;
	u64 seq, first;

	spin_lock(&obmm_reports_lock);
	seq = obmm_report_seq;
	spin_unlock(&obmm_reports_lock);
	first = seq > OBMM_REPORTS ? seq - OBMM_REPORTS + 1 : 1;
	for (; first <= seq; first++) {
		spin_lock(&obmm_reports_lock);
		rep = obmm_reports[(first - 1) % OBMM_REPORTS];
		spin_unlock(&obmm_reports_lock);
		if (rep.seq != first)
			continue;
		seq_printf(m, "%llu node=%d mem_id=%d offset=0x%llx kind=%s byte=%u cached=%#018llx memory=%#018llx fix=%s\n",
			   rep.seq, obmm_emu_node_id, rep.mem_id, rep.offset,
			   obmm_report_names[rep.kind], rep.byte, rep.cached,
			   rep.memory, obmm_report_fixes[rep.kind]);
	}
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(obmm_reports);

static int obmm_stats_show(struct seq_file *m, void *v)
{
	seq_printf(m, "coherence %s\nevict %u\nseed %lu\nscan_ms %u\nfills %lld\nwriteback_lines %lld\ninvalidated_pages %lld\nevictions %lld\nuser_lines %lld\nreports %llu\n",
		   obmm_strict ? "strict" : "coherent", coherence_evict,
		   coherence_seed, coherence_scan_ms,
		   (long long)atomic64_read(&obmm_stat_fills),
		   (long long)atomic64_read(&obmm_stat_wb_lines),
		   (long long)atomic64_read(&obmm_stat_invals),
		   (long long)atomic64_read(&obmm_stat_evictions),
		   (long long)atomic64_read(&obmm_stat_user_lines),
		   obmm_report_seq);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(obmm_stats);

int obmm_cache_init(void)
{
	/* Checked under either model: a typo should not wait for strict. */
	if (coherence_evict > 1000) {
		pr_err("emulator: coherence_evict=%u out of range (0..1000, in 1/1000)\n",
		       coherence_evict);
		return -EINVAL;
	}
	if (coherence_scan_ms < 5 || coherence_scan_ms > 1000) {
		pr_err("emulator: coherence_scan_ms=%u out of range (5..1000)\n",
		       coherence_scan_ms);
		return -EINVAL;
	}
	if (!obmm_strict)
		return 0;
	if (!coherence_seed)
		coherence_seed = get_random_u64() ?: 1;
	prandom_seed_state(&obmm_rnd, coherence_seed);
	pr_info("coherence: strict, eviction %u/1000 per line per %u ms, seed %lu\n",
		coherence_evict, coherence_scan_ms, coherence_seed);
	obmm_debugfs = debugfs_create_dir("obmm_coherence", NULL);
	debugfs_create_file("reports", 0444, obmm_debugfs, NULL,
			    &obmm_reports_fops);
	debugfs_create_file("stats", 0444, obmm_debugfs, NULL,
			    &obmm_stats_fops);
	INIT_DELAYED_WORK(&obmm_scan_work, obmm_scan);
	schedule_delayed_work(&obmm_scan_work,
			      msecs_to_jiffies(coherence_scan_ms));
	return 0;
}

/* After every region is gone. */
void obmm_cache_exit(void)
{
	if (!obmm_strict)
		return;
	cancel_delayed_work_sync(&obmm_scan_work);
	debugfs_remove_recursive(obmm_debugfs);
}
