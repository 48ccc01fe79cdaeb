// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: borrowing (NUMA_REMOTE imports) - the memory hot-plug the
 * real driver gets from openEuler's numa_remote (add_memory_remote(),
 * remove_memory_remote(), drivers/base/numa_remote.c), done with the
 * stock kernel's driver-managed memory hot-plug.
 *
 * Remote nodes: the possible NUMA nodes that have neither CPUs nor memory
 * when the module loads (the guests boot with such nodes in their SRAT,
 * obmm.testbed.vm.acpi; real kernels reserve them with numa_remote=).  An
 * import without a node takes the first remote node that holds no memory
 * and that no preimport declaration reserved (find_unused_remote_node()).
 *
 * The range is added as "System RAM (Remote)" under the import's ubmem
 * resource and onlined by the kernel's auto-online policy as it is added
 * (the guests boot with memhp_default_state=online_movable: ZONE_MOVABLE,
 * so no kernel allocation can pin it); a range the kernel leaves offline
 * is removed again and the import refused.  Removal is
 * offline_and_remove_memory(), what remove_memory_remote() calls: pages
 * in use are migrated to other nodes, and its errno is the caller's.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/ioport.h>
#include <linux/memory.h>
#include <linux/memory_hotplug.h>
#include <linux/mm.h>
#include <linux/mmzone.h>
#include <linux/mutex.h>
#include <linux/nodemask.h>

#include "borrow.h"
#include "testbed_fabric.h"

/* The name numa_remote gives the hot-added range in /proc/iomem. */
#define OBMM_BORROW_RES_NAME	"System RAM (Remote)"

static nodemask_t obmm_remote_nodes;
/* Preimport declarations per node: their node is not "unused". */
static unsigned int obmm_node_claims[MAX_NUMNODES];
/* Serialises node choice, hot-add and removal, and region->plugged. */
static DEFINE_MUTEX(obmm_borrow_mutex);

u64 obmm_memory_block_bytes(void)
{
#ifdef CONFIG_MEMORY_HOTPLUG
	return memory_block_size_bytes();
#else
	return OBMM_EMU_DEFAULT_MEMBLOCK;
#endif
}

void obmm_borrow_init(void)
{
	int nid;

	nodes_clear(obmm_remote_nodes);
	for_each_node_state(nid, N_POSSIBLE)
		if (tb_node_unpopulated(nid))
			node_set(nid, obmm_remote_nodes);
	pr_info("%d remote NUMA node(s) for borrowing\n",
		nodes_weight(obmm_remote_nodes));
}

/*
 * Every wait for the lock is killable, never interruptible: the real
 * driver's hot-plug calls block in lock_device_hotplug() (no EINTR for a
 * handled signal), and a fatal signal must still end the wait (no hung
 * task behind a long removal).  -EINTR when killed.
 */
int obmm_borrow_lock_killable(void)
{
	return mutex_lock_killable(&obmm_borrow_mutex);
}

/*
 * For the unplug thread: an UNIMPORT may hold the lock for as long as its
 * removal waits for a pinned page (until a signal); the thread backs off
 * and tries again instead of sleeping behind it.
 */
bool obmm_borrow_trylock(void)
{
	return mutex_trylock(&obmm_borrow_mutex);
}

void obmm_borrow_unlock(void)
{
	mutex_unlock(&obmm_borrow_mutex);
}

bool obmm_borrow_node_remote(int nid)
{
	return nid >= 0 && nid < MAX_NUMNODES &&
	       node_isset(nid, obmm_remote_nodes);
}

/* find_unused_remote_node(); borrow mutex held. */
static int obmm_borrow_unused_node(void)
{
	int nid;

	for_each_node_mask(nid, obmm_remote_nodes)
		if (tb_node_unpopulated(nid) && !obmm_node_claims[nid])
			return nid;
	return NUMA_NO_NODE;
}

/*
 * A preimport declaration reserves its node (@nid, or an unused one for
 * NUMA_NO_NODE).  Returns the node, NUMA_NO_NODE when there is none
 * (add_memory_remote() would fail), or -EINTR when killed waiting for the
 * lock.
 */
int obmm_borrow_claim_node(int nid)
{
	if (obmm_borrow_lock_killable())
		return -EINTR;
	if (nid == NUMA_NO_NODE)
		nid = obmm_borrow_unused_node();
	else if (!obmm_borrow_node_remote(nid))
		nid = NUMA_NO_NODE;
	if (nid != NUMA_NO_NODE)
		obmm_node_claims[nid]++;
	mutex_unlock(&obmm_borrow_mutex);
	return nid;
}

/* Borrow mutex held (UNDECLARE takes it before it takes the declaration away). */
void obmm_borrow_release_node_locked(int nid)
{
	lockdep_assert_held(&obmm_borrow_mutex);
	if (!WARN_ON(!obmm_borrow_node_remote(nid) || !obmm_node_claims[nid]))
		obmm_node_claims[nid]--;
}

static bool obmm_borrow_range_online(phys_addr_t pa, u64 size)
{
	u64 block = obmm_memory_block_bytes();
	u64 off;

	for (off = 0; off < size; off += block)
		if (!pfn_to_online_page(PHYS_PFN(pa + off)))
			return false;
	return true;
}

/*
 * The "System RAM (Remote)" resource of a plugged import: a child of its
 * ubmem resource (a preimport range's holds one per import into it).  The
 * children of a ubmem resource change only under the borrow mutex (hot-add
 * and removal, and the MEMID resources under them): the walk takes no
 * resource lock (none is exported), so it must hold that mutex.
 */
struct resource *obmm_borrow_ram_res(struct obmm_region *r)
{
	struct resource *child;

	lockdep_assert_held(&obmm_borrow_mutex);
	/* The same rule where lockdep is off (production kernels). */
	WARN_ON_ONCE(!mutex_is_locked(&obmm_borrow_mutex));
	if (!r->plugged)
		return NULL;
	for (child = r->ubmem->child; child; child = child->sibling)
		if (child->start == r->pa && resource_size(child) == r->size)
			return child;
	return NULL;
}

#if defined(CONFIG_MEMORY_HOTPLUG) && defined(CONFIG_MEMORY_HOTREMOVE)
static int obmm_offline_and_remove(int nid, phys_addr_t pa, u64 size)
{
#ifdef OBMM_HAVE_OFFLINE_REMOVE_NO_NID
	return offline_and_remove_memory(pa, size);
#else
	return offline_and_remove_memory(nid, pa, size);
#endif
}

static int obmm_hot_add(int nid, phys_addr_t pa, u64 size)
{
	return add_memory_driver_managed(nid, pa, size, OBMM_BORROW_RES_NAME,
					 MHP_NONE);
}
#else
/* Without memory hot-plug and hot-remove nothing can be borrowed. */
static int obmm_offline_and_remove(int nid, phys_addr_t pa, u64 size)
{
	return -EOPNOTSUPP;
}

static int obmm_hot_add(int nid, phys_addr_t pa, u64 size)
{
	return -EOPNOTSUPP;
}
#endif

/*
 * add_memory_remote(@nid, pa, size, MEMORY_DIRECT_ONLINE), borrow mutex
 * held: the node (>= 0), or a negative errno (the caller answers -EPERM,
 * as the real driver does for any failure of add_memory_remote()).
 */
int obmm_borrow_add_locked(struct obmm_region *r, int nid)
{
	int ret;

	lockdep_assert_held(&obmm_borrow_mutex);
	if (nid == NUMA_NO_NODE)
		nid = obmm_borrow_unused_node();
	if (!obmm_borrow_node_remote(nid))
		return -ENODEV;
	ret = obmm_hot_add(nid, r->pa, r->size);
	if (ret)
		return ret;
	if (!obmm_borrow_range_online(r->pa, r->size)) {
		pr_warn("hot-added %pa + 0x%llx stayed offline: boot with memhp_default_state=online_movable\n",
			&r->pa, r->size);
		WARN_ON(obmm_offline_and_remove(nid, r->pa, r->size));
		return -EIO;
	}
	r->numa_id = nid;
	WRITE_ONCE(r->plugged, true);
	return nid;
}

/*
 * remove_memory_remote(): offline (migrating the pages in use) and remove
 * the range; borrow mutex held.  The "MEMID_<id>" resource nests under
 * the range's resource and is moved out of its way: back under it when
 * the removal fails, under the ubmem resource when it succeeds and
 * @keep_memid is set (the region lives on, revoked).
 */
int obmm_borrow_remove_locked(struct obmm_region *r, bool keep_memid)
{
	struct resource *ram = obmm_borrow_ram_res(r);
	bool had_memid = r->memid_res.parent;
	int ret;

	lockdep_assert_held(&obmm_borrow_mutex);
	if (!r->plugged)
		return 0;
	if (had_memid)
		release_resource(&r->memid_res);
	ret = obmm_offline_and_remove(r->numa_id, r->pa, r->size);
	if (ret) {
		if (had_memid && ram && request_resource(ram, &r->memid_res))
			pr_warn("mem_id %d: MEMID resource lost\n", r->id);
		return ret;
	}
	WRITE_ONCE(r->plugged, false);
	if (had_memid && keep_memid &&
	    request_resource(r->ubmem, &r->memid_res))
		pr_warn("mem_id %d: MEMID resource lost\n", r->id);
	return 0;
}
