// SPDX-License-Identifier: GPL-2.0
/*
 * ub_compat: where exported memory comes from.
 *
 * OLK's pfn_range_alloc() takes a physically contiguous folio from the
 * buddy allocator; the driver's pool keeps a few of them ready and exports
 * hand them out.  On a UB host the UMMU maps an export's folios, wherever
 * they are, to one contiguous UBA range.  The testbed's UBA is the
 * exporter's physical address (ummu.c), so an export is only reachable
 * from other nodes when its folios are physically contiguous in order.
 *
 * So the folios come from memory of our own: the RAM the guest kernel does
 * not use (above mem=, docs/testbed.md), given struct pages as device memory
 * (memremap_pages(), MEMORY_DEVICE_GENERIC) whose vmemmap is made of 2 MiB
 * compound pages: pfn_folio() of a granule is a 2 MiB folio, as the
 * driver expects of a buddy allocation.
 *
 * Which granule each call gets is chosen so that exports come out in one
 * ascending run as often as the driver's pool allows.  Its pool thread
 * refills by calling here once per granule; the clearing thread moves each
 * one, in that order, to the head of the ready list, and an export takes
 * the head of that list (then, when it runs short, calls here itself).  So
 * a refill gets the highest free granule below every granule the pool
 * holds: the ready list stays ascending from its head.  An export's own
 * calls continue the run it took from the pool.  Which granules the pool
 * holds is known from the calls (the pool thread's), from the UMMU's
 * mappings (exported: ub_compat_pool_mapped()) and from the frees.  An
 * export still alive leaves a hole a later run may have to jump; such an
 * export's UBA is marked scattered (ummu.c).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/err.h>
#include <linux/ioport.h>
#include <linux/memremap.h>
#include <linux/minmax.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/spinlock.h>

#include "ub_compat.h"
#include "ub_compat_priv.h"

/* The granule: one compound folio of the pool's vmemmap. */
#define UB_COMPAT_GRANULE_SHIFT	PMD_SHIFT
#define UB_COMPAT_GRANULE	BIT(UB_COMPAT_GRANULE_SHIFT)

/* What holds each granule. */
enum ub_compat_granule {
	UB_COMPAT_FREE,
	UB_COMPAT_POOLED,	/* given to the driver's pool thread */
	UB_COMPAT_TAKEN,	/* given to an export (its own call, or mapped) */
};

struct ub_compat_pool {
	bool present;
	int nid;
	phys_addr_t base;
	unsigned long nr;	/* granules */
	u8 *state;		/* enum ub_compat_granule, per granule */
	spinlock_t lock;	/* protects state and the run below */
	/* the run an export's own calls extend: its task and last granule */
	struct task_struct *run_task;
	unsigned long run_last;
	struct resource *res;
	struct dev_pagemap pgmap;
};

static struct ub_compat_pool pool = {
	.lock = __SPIN_LOCK_UNLOCKED(pool.lock),
};

#ifdef CONFIG_ZONE_DEVICE
#define ub_compat_memremap_pages	memremap_pages
#define ub_compat_memunmap_pages	memunmap_pages
#else
/* Kernels without ZONE_DEVICE (Debian's arm64) have no device struct pages. */
static void *ub_compat_memremap_pages(struct dev_pagemap *pgmap, int nid)
{
	return ERR_PTR(-EOPNOTSUPP);
}

static void ub_compat_memunmap_pages(struct dev_pagemap *pgmap)
{
}
#endif

/* OLK: the huge page percentage mapped at PMD level; hugetlb pools unused. */
int contig_mem_pool_percent;
EXPORT_SYMBOL_GPL(contig_mem_pool_percent);

int ub_compat_pool_init(phys_addr_t base, u64 size, int nid)
{
	void *va;
	int ret;

	if (!size)
		return 0;
	if (!IS_ENABLED(CONFIG_ZONE_DEVICE)) {
		pr_err("no pool: struct pages for it need CONFIG_ZONE_DEVICE\n");
		return -EOPNOTSUPP;
	}
	if (!IS_ALIGNED(base, UB_COMPAT_GRANULE) ||
	    !IS_ALIGNED(size, UB_COMPAT_GRANULE)) {
		pr_err("pool %pa + %#llx is not made of %#lx granules\n", &base,
		       size, UB_COMPAT_GRANULE);
		return -EINVAL;
	}
	pool.nr = size >> UB_COMPAT_GRANULE_SHIFT;
	pool.state = kcalloc(pool.nr, sizeof(*pool.state), GFP_KERNEL);
	if (!pool.state)
		return -ENOMEM;
	pool.res = request_mem_region(base, size, "ub_compat pool");
	if (!pool.res) {
		pr_err("pool %pa + %#llx is in use\n", &base, size);
		ret = -EBUSY;
		goto err_state;
	}
	pool.pgmap.type = MEMORY_DEVICE_GENERIC;
	pool.pgmap.range.start = base;
	pool.pgmap.range.end = base + size - 1;
	pool.pgmap.nr_range = 1;
	pool.pgmap.vmemmap_shift = UB_COMPAT_GRANULE_SHIFT - PAGE_SHIFT;
	va = ub_compat_memremap_pages(&pool.pgmap, nid);
	if (IS_ERR(va)) {
		ret = PTR_ERR(va);
		pr_err("pool %pa + %#llx: no struct pages (%d)\n", &base, size,
		       ret);
		goto err_region;
	}
	pool.base = base;
	pool.nid = nid;
	pool.present = true;
	return 0;

err_region:
	release_mem_region(base, size);
	pool.res = NULL;
err_state:
	kfree(pool.state);
	pool.state = NULL;
	return ret;
}

void ub_compat_pool_exit(void)
{
	unsigned long idx, left = 0;

	if (!pool.present)
		return;
	for (idx = 0; idx < pool.nr; idx++)
		left += pool.state[idx] != UB_COMPAT_FREE;
	if (left)
		pr_err("%lu pool granules still allocated at exit\n", left);
	ub_compat_memunmap_pages(&pool.pgmap);
	release_mem_region(pool.base, pool.nr << UB_COMPAT_GRANULE_SHIFT);
	kfree(pool.state);
	pool.state = NULL;
	pool.present = false;
}

/* The highest free granule below @limit (exclusive), or pool.nr. */
static unsigned long highest_free_below(unsigned long limit)
{
	while (limit-- > 0)
		if (pool.state[limit] == UB_COMPAT_FREE)
			return limit;
	return pool.nr;
}

/* The first granule of the longest run of free ones, or pool.nr. */
static unsigned long longest_free_run(void)
{
	unsigned long idx, start = 0, best = pool.nr, best_len = 0;

	for (idx = 0; idx <= pool.nr; idx++) {
		if (idx < pool.nr && pool.state[idx] == UB_COMPAT_FREE)
			continue;
		if (idx - start > best_len) {
			best = start;
			best_len = idx - start;
		}
		start = idx + 1;
	}
	return best;
}

/* The pool thread's refill: below everything its pool holds. */
static unsigned long pick_for_pool(void)
{
	unsigned long idx, lowest = pool.nr, pick;

	for (idx = 0; idx < pool.nr; idx++) {
		if (pool.state[idx] == UB_COMPAT_POOLED) {
			lowest = idx;
			break;
		}
	}
	pick = highest_free_below(lowest);
	return pick < pool.nr ? pick : highest_free_below(pool.nr);
}

/*
 * An export's own call: the granule after the last it got, else after the
 * highest one the pool held (the export took the pool's whole ascending
 * list first), else the start of the longest free run.
 */
static unsigned long pick_for_export(void)
{
	unsigned long idx, after = pool.nr;

	if (pool.run_task == current)
		after = pool.run_last + 1;
	else
		for (idx = pool.nr; idx > 0; idx--)
			if (pool.state[idx - 1] == UB_COMPAT_POOLED) {
				after = idx;
				break;
			}
	if (after < pool.nr && pool.state[after] == UB_COMPAT_FREE)
		return after;
	return longest_free_run();
}

/*
 * pfn_range_alloc(): a folio of @nr_pages physically contiguous pages on
 * node @nid, or an ERR_PTR.  Here: one granule of the pool (placed as the
 * comment at the top says), when @nid is the pool's node and @nr_pages one
 * granule.
 */
struct folio *pfn_range_alloc(unsigned long nr_pages, int nid)
{
	bool refill = current->flags & PF_KTHREAD;
	unsigned long idx;

	if (!pool.present || nid != pool.nid ||
	    nr_pages != UB_COMPAT_GRANULE >> PAGE_SHIFT)
		return ERR_PTR(-EINVAL);
	spin_lock(&pool.lock);
	idx = refill ? pick_for_pool() : pick_for_export();
	if (idx >= pool.nr) {
		spin_unlock(&pool.lock);
		return ERR_PTR(-ENOMEM);
	}
	pool.state[idx] = refill ? UB_COMPAT_POOLED : UB_COMPAT_TAKEN;
	if (!refill) {
		pool.run_task = current;
		pool.run_last = idx;
	}
	spin_unlock(&pool.lock);
	return pfn_folio(PHYS_PFN(pool.base) +
			 (idx << (UB_COMPAT_GRANULE_SHIFT - PAGE_SHIFT)));
}
EXPORT_SYMBOL_GPL(pfn_range_alloc);

/* The pool's granule of @pa, or pool.nr when @pa is not the pool's. */
static unsigned long granule_of(phys_addr_t pa)
{
	if (!pool.present || pa < pool.base)
		return pool.nr;
	return min_t(u64, (pa - pool.base) >> UB_COMPAT_GRANULE_SHIFT, pool.nr);
}

/* pfn_range_free(): give back a folio pfn_range_alloc() handed out. */
int pfn_range_free(struct folio *folio)
{
	phys_addr_t pa = PFN_PHYS(folio_pfn(folio));
	unsigned long idx = granule_of(pa);

	if (idx >= pool.nr || !IS_ALIGNED(pa - pool.base, UB_COMPAT_GRANULE))
		return -EINVAL;
	spin_lock(&pool.lock);
	if (pool.state[idx] == UB_COMPAT_FREE) {
		spin_unlock(&pool.lock);
		return -EINVAL;
	}
	pool.state[idx] = UB_COMPAT_FREE;
	if (pool.run_task == current)
		pool.run_task = NULL;
	spin_unlock(&pool.lock);
	return 0;
}
EXPORT_SYMBOL_GPL(pfn_range_free);

/*
 * The UMMU mapped [pa, pa + len) for an export: those granules left the
 * driver's pool, and the export's run (if it made one) is complete.
 */
void ub_compat_pool_mapped(phys_addr_t pa, u64 len)
{
	unsigned long idx, end;

	spin_lock(&pool.lock);
	end = granule_of(pa + len - 1);
	for (idx = granule_of(pa); idx < pool.nr && idx <= end; idx++)
		if (pool.state[idx] == UB_COMPAT_POOLED)
			pool.state[idx] = UB_COMPAT_TAKEN;
	if (pool.run_task == current)
		pool.run_task = NULL;
	spin_unlock(&pool.lock);
}

/*
 * hugetlb_pool_alloc_size() / hugetlb_pool_free(): OLK takes huge pages
 * out of (and back into) the hugetlb pool of a node.  Not provided: the
 * hugetlb_pmd and hugetlb_pud allocators of the driver do not run here.
 */
struct folio *hugetlb_pool_alloc_size(int nid, unsigned long size)
{
	return ERR_PTR(-EOPNOTSUPP);
}
EXPORT_SYMBOL_GPL(hugetlb_pool_alloc_size);

int hugetlb_pool_free(struct folio *folio)
{
	return -EOPNOTSUPP;
}
EXPORT_SYMBOL_GPL(hugetlb_pool_free);

/*
 * set_linear_mapping_invalid(): OLK unmaps memory lent to other hosts from
 * the kernel's linear map (and maps it back), so no speculative access
 * caches it.  The testbed's fabric is coherent shared RAM, and the pool's
 * memory stays mapped: nothing to do.
 */
int set_linear_mapping_invalid(unsigned long start_pfn, unsigned long end_pfn,
			       bool set_inval)
{
	return 0;
}
EXPORT_SYMBOL_GPL(set_linear_mapping_invalid);
