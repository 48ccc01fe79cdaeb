// SPDX-License-Identifier: GPL-2.0
/*
 * ub_compat: OLK's numa_remote (drivers/base/numa_remote.c) on a stock
 * kernel: borrowed memory hot-added to CPU-less "remote" NUMA nodes.
 *
 * Remote nodes: OLK reserves them with numa_remote=; here they are the
 * possible nodes that are offline when the module loads (the guests boot
 * with such nodes in their SRAT, obmm.testbed.vm.acpi).
 *
 * add_memory_remote() is add_memory_driver_managed() of the range as
 * "System RAM (Remote)", onlined by the kernel as it is added (the guests
 * boot with memhp_default_state=online_movable), and remove_memory_remote()
 * is offline_and_remove_memory(), as in OLK.
 *
 * MEMORY_KEEP_ISOLATED (OLK's "preonline" mode, for preimport ranges) adds
 * the memory but keeps its pages out of the page allocator, the way
 * virtio-mem keeps unplugged parts of its blocks: an online-page callback
 * marks them PageOffline, and a memory notifier lets offlining skip them.
 * A later add_memory_remote() without flags gives the pages of its range to
 * the page allocator (OLK does that in a work item; here it is done before
 * returning).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/memory.h>
#include <linux/memory_hotplug.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/nodemask.h>
#include <linux/page-flags.h>
#include <linux/page_ref.h>
#include <linux/xarray.h>

#include <linux/numa_remote.h>

#include "ub_compat.h"
#include "ub_compat_priv.h"

/* The name numa_remote gives the hot-added range in /proc/iomem. */
#define UB_COMPAT_REMOTE_RES_NAME	"System RAM (Remote)"

/* generic_online_page()'s largest order */
#ifdef MAX_PAGE_ORDER
#define UB_COMPAT_ONLINE_ORDER	MAX_PAGE_ORDER
#else
#define UB_COMPAT_ONLINE_ORDER	(MAX_ORDER - 1)
#endif

static nodemask_t remote_nodes;
/* Serialises node choice, hot-add and removal (OLK: numa_remote_lock). */
static DEFINE_MUTEX(remote_lock);
/* Memory blocks added MEMORY_KEEP_ISOLATED whose pages stay offline. */
static DEFINE_XARRAY(isolated_blocks);
static bool callback_set;
static bool notifier_registered;

static unsigned long block_id(unsigned long pfn)
{
	return PFN_PHYS(pfn) / memory_block_size_bytes();
}

static bool block_isolated(unsigned long pfn)
{
	return xa_load(&isolated_blocks, block_id(pfn));
}

bool numa_is_remote_node(int nid)
{
	return nid >= 0 && nid < MAX_NUMNODES && node_isset(nid, remote_nodes);
}
EXPORT_SYMBOL_GPL(numa_is_remote_node);

/* Pages of isolated blocks stay out of the page allocator as they online. */
static void ub_compat_online_page(struct page *page, unsigned int order)
{
	unsigned long i;

	if (!block_isolated(page_to_pfn(page))) {
		generic_online_page(page, order);
		return;
	}
	for (i = 0; i < (1UL << order); i++) {
		__SetPageOffline(page + i);
		ClearPageReserved(page + i);
	}
}

/*
 * Offlining an isolated block: its offline pages hold one reference each
 * and were never counted as managed; drop the references (so offlining
 * treats them as free) and count them (offlining uncounts every page).
 */
static int ub_compat_memory_notify(struct notifier_block *nb,
				   unsigned long action, void *arg)
{
	struct memory_notify *mhp = arg;
	unsigned long i;

	if (!block_isolated(mhp->start_pfn))
		return NOTIFY_DONE;
	switch (action) {
	case MEM_GOING_OFFLINE:
		adjust_managed_page_count(pfn_to_page(mhp->start_pfn),
					  mhp->nr_pages);
		for (i = 0; i < mhp->nr_pages; i++)
			page_ref_dec(pfn_to_page(mhp->start_pfn + i));
		break;
	case MEM_CANCEL_OFFLINE:
		adjust_managed_page_count(pfn_to_page(mhp->start_pfn),
					  -(long)mhp->nr_pages);
		for (i = 0; i < mhp->nr_pages; i++)
			page_ref_inc(pfn_to_page(mhp->start_pfn + i));
		break;
	default:
		break;
	}
	return NOTIFY_OK;
}

static struct notifier_block ub_compat_memory_nb = {
	.notifier_call = ub_compat_memory_notify,
};

/* check_hotplug_memory_range(): whole memory blocks, not empty. */
static bool range_blocks(u64 start, u64 size)
{
	u64 block = memory_block_size_bytes();

	return size && IS_ALIGNED(start, block) && IS_ALIGNED(size, block) &&
	       start + size > start;
}

static int mark_isolated(u64 start, u64 size)
{
	unsigned long b, first = PHYS_PFN(start), last;
	int ret;

	last = block_id(PHYS_PFN(start + size - 1));
	for (b = block_id(first); b <= last; b++) {
		ret = xa_err(xa_store(&isolated_blocks, b, xa_mk_value(1),
				      GFP_KERNEL));
		if (ret) {
			while (b-- > block_id(first))
				xa_erase(&isolated_blocks, b);
			return ret;
		}
	}
	return 0;
}

static void unmark_isolated(u64 start, u64 size)
{
	unsigned long b, last = block_id(PHYS_PFN(start + size - 1));

	for (b = block_id(PHYS_PFN(start)); b <= last; b++)
		xa_erase(&isolated_blocks, b);
}

/* Every block of the range isolated (1), none (0), or a mix (-1). */
static int range_isolated(u64 start, u64 size)
{
	u64 block = memory_block_size_bytes(), off;
	unsigned int isolated = 0, n = 0;

	for (off = 0; off < size; off += block, n++)
		isolated += block_isolated(PHYS_PFN(start + off));
	return isolated == n ? 1 : isolated ? -1 : 0;
}

/* check_memory_block_nid(): every block of the range online on @nid. */
static bool range_online_on(u64 start, u64 size, int nid)
{
	u64 block = memory_block_size_bytes(), off;
	struct page *page;

	for (off = 0; off < size; off += block) {
		page = pfn_to_online_page(PHYS_PFN(start + off));
		if (!page || page_to_nid(page) != nid)
			return false;
	}
	return true;
}

/* find_unused_remote_node(): the first remote node without memory. */
static int unused_remote_node(void)
{
	int nid;

	for_each_node_mask(nid, remote_nodes)
		if (!node_online(nid))
			return nid;
	return NUMA_NO_NODE;
}

/* Give the pages of isolated blocks to the page allocator. */
static void online_isolated(u64 start, u64 size)
{
	unsigned long pfn, end = PHYS_PFN(start + size);
	unsigned long chunk = 1UL << UB_COMPAT_ONLINE_ORDER;

	unmark_isolated(start, size);
	for (pfn = PHYS_PFN(start); pfn < end; pfn++)
		__ClearPageOffline(pfn_to_page(pfn));
	for (pfn = PHYS_PFN(start); pfn < end; pfn += chunk)
		generic_online_page(pfn_to_page(pfn), UB_COMPAT_ONLINE_ORDER);
}

/* The hot-add of a whole range, onlined (or kept isolated) as it is added. */
static int hot_add(int nid, u64 start, u64 size, bool isolated)
{
	int ret;

	if (isolated) {
		ret = mark_isolated(start, size);
		if (ret)
			return ret;
	}
	ret = add_memory_driver_managed(nid, start, size,
					UB_COMPAT_REMOTE_RES_NAME,
					MHP_MERGE_RESOURCE);
	if (ret)
		goto err_unmark;
	if (!range_online_on(start, size, nid)) {
		pr_warn("hot-added %#llx + %#llx stayed offline: boot with memhp_default_state=online_movable\n",
			start, size);
		WARN_ON(offline_and_remove_memory(start, size));
		ret = -EIO;
		goto err_unmark;
	}
	return 0;

err_unmark:
	if (isolated)
		unmark_isolated(start, size);
	return ret;
}

/*
 * add_memory_remote(): add [start, start + size) as memory of remote node
 * @nid (NUMA_NO_NODE: an unused one); the node, or NUMA_NO_NODE on any
 * failure.  MEMORY_DIRECT_ONLINE: usable at once; MEMORY_KEEP_ISOLATED:
 * added but kept out of the page allocator; no flag: make a range added
 * isolated usable.
 */
int add_memory_remote(int nid, u64 start, u64 size, int flags)
{
	int real_nid = NUMA_NO_NODE;

	if (nid < NUMA_NO_NODE || nid >= MAX_NUMNODES)
		return NUMA_NO_NODE;
	if (nid != NUMA_NO_NODE && !numa_is_remote_node(nid))
		return NUMA_NO_NODE;
	if (flags & ~(MEMORY_KEEP_ISOLATED | MEMORY_DIRECT_ONLINE))
		return NUMA_NO_NODE;
	if (flags == (MEMORY_KEEP_ISOLATED | MEMORY_DIRECT_ONLINE))
		return NUMA_NO_NODE;
	/* OLK without numa_remote=preonline: only direct onlining. */
	if (!callback_set && !(flags & MEMORY_DIRECT_ONLINE))
		return NUMA_NO_NODE;
	if (!range_blocks(start, size))
		return NUMA_NO_NODE;

	mutex_lock(&remote_lock);
	if (!flags) {
		if (nid != NUMA_NO_NODE && range_isolated(start, size) == 1 &&
		    range_online_on(start, size, nid)) {
			online_isolated(start, size);
			real_nid = nid;
		} else {
			pr_warn("online memory [%llx, %llx) failed: not added isolated to node %d\n",
				start, start + size, nid);
		}
		goto unlock;
	}
	real_nid = nid == NUMA_NO_NODE ? unused_remote_node() : nid;
	if (real_nid == NUMA_NO_NODE)
		goto unlock;
	if (hot_add(real_nid, start, size, flags & MEMORY_KEEP_ISOLATED))
		real_nid = NUMA_NO_NODE;
unlock:
	mutex_unlock(&remote_lock);
	return real_nid;
}
EXPORT_SYMBOL_GPL(add_memory_remote);

/*
 * remove_memory_remote(): offline (pages in use are migrated) and remove
 * memory of remote node @nid; 0 or the errno of the removal.  A range
 * whose blocks are partly isolated and partly in use is refused.
 */
int remove_memory_remote(int nid, u64 start, u64 size)
{
	int ret = -EINVAL, isolated;

	if (nid <= NUMA_NO_NODE || nid >= MAX_NUMNODES)
		return -EINVAL;
	if (!numa_is_remote_node(nid) || !node_online(nid))
		return -EINVAL;
	if (!range_blocks(start, size))
		return -EINVAL;

	mutex_lock(&remote_lock);
	if (!range_online_on(start, size, nid))
		goto out;
	isolated = range_isolated(start, size);
	if (isolated < 0)
		goto out;
	ret = offline_and_remove_memory(start, size);
	if (!ret && isolated)
		unmark_isolated(start, size);
out:
	mutex_unlock(&remote_lock);
	return ret;
}
EXPORT_SYMBOL_GPL(remove_memory_remote);

/*
 * numa_remote_set_distance(): set the distances between remote node
 * @target and the local nodes @node_ids.  The checks are OLK's; the
 * distances are not applied: x86 Linux fixes them at boot
 * (numa_set_distance() is __init), so the SLIT's stay.
 */
int numa_remote_set_distance(int target, int *node_ids, int *node_distances,
			     int count)
{
	int i;

	if (target <= NUMA_NO_NODE || target >= MAX_NUMNODES)
		return -EINVAL;
	if (!numa_is_remote_node(target))
		return -EINVAL;
	for (i = 0; i < count; i++)
		if (numa_is_remote_node(node_ids[i]))
			return -EINVAL;
	return 0;
}
EXPORT_SYMBOL_GPL(numa_remote_set_distance);

int ub_compat_numa_remote_init(void)
{
	int nid, ret;

	nodes_clear(remote_nodes);
	for_each_node_state(nid, N_POSSIBLE)
		if (!node_online(nid))
			node_set(nid, remote_nodes);
	pr_info("%d remote NUMA node(s)\n", nodes_weight(remote_nodes));

	ret = register_memory_notifier(&ub_compat_memory_nb);
	if (ret)
		return ret;
	notifier_registered = true;
	/* Only one such callback may be set (virtio-mem's, if loaded). */
	ret = set_online_page_callback(ub_compat_online_page);
	if (ret) {
		pr_warn("online page callback taken: preimport (MEMORY_KEEP_ISOLATED) unavailable\n");
		return 0;
	}
	callback_set = true;
	return 0;
}

void ub_compat_numa_remote_exit(void)
{
	if (callback_set)
		restore_online_page_callback(ub_compat_online_page);
	callback_set = false;
	if (notifier_registered)
		unregister_memory_notifier(&ub_compat_memory_nb);
	notifier_registered = false;
	xa_destroy(&isolated_blocks);
}
