// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: OBMM_CMD_IMPORT, OBMM_CMD_UNIMPORT and the preimport ioctls.
 *
 * NUMA_REMOTE ("borrow") imports need the OLK numa_remote memory hot-add,
 * which stock kernels lack: every argument check is made as the real
 * driver makes it, then the hot-add step fails with -EOPNOTSUPP.  So no
 * preimport range is ever registered.
 *
 * After the real driver's checks, an ALLOW_MMAP import must pass the
 * emulated UMMU check of access.c (-EACCES); the revocation scan then
 * walks the import ranges (obmm_imports_revoke_scan()).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/list.h>
#include <linux/memory.h>
#include <linux/mutex.h>
#include <linux/proc_fs.h>
#include <linux/sched.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/stringify.h>
#include <linux/sysfs.h>
#include <linux/uaccess.h>

#include "obmm_emu.h"

/* Direct import PA ranges (the real driver's maple tree). */
struct obmm_import_range {
	struct list_head link;
	phys_addr_t start;
	phys_addr_t end;	/* inclusive */
	struct obmm_region *region;
};

static DEFINE_MUTEX(obmm_import_mutex);
static LIST_HEAD(obmm_import_ranges);

#define OBMM_PROC_DIR		"obmm"
#define OBMM_PROC_PREIMPORT	"preimport_info"
#define OBMM_PROC_MODE		0400

static struct proc_dir_entry *obmm_proc_dir;

/* /proc/obmm/preimport_info: the header; no range is ever registered. */
static int obmm_preimport_info_show(struct seq_file *m, void *v)
{
	seq_puts(m, "pa_start - pa_end : dcna scna deid seid nid\n");
	return 0;
}

int obmm_imports_init(void)
{
	obmm_proc_dir = proc_mkdir(OBMM_PROC_DIR, NULL);
	if (!obmm_proc_dir)
		return -ENOMEM;
	if (!proc_create_single(OBMM_PROC_PREIMPORT, OBMM_PROC_MODE,
				obmm_proc_dir, obmm_preimport_info_show)) {
		proc_remove(obmm_proc_dir);
		obmm_proc_dir = NULL;
		return -ENOMEM;
	}
	return 0;
}

void obmm_imports_exit(void)
{
	proc_remove(obmm_proc_dir);
	obmm_proc_dir = NULL;
}

static u64 obmm_memory_block_size(void)
{
#ifdef CONFIG_MEMORY_HOTPLUG
	return memory_block_size_bytes();
#else
	return OBMM_EMU_DEFAULT_MEMBLOCK;
#endif
}

static bool obmm_range_overlaps(phys_addr_t start, phys_addr_t end)
{
	struct obmm_import_range *ir;

	list_for_each_entry(ir, &obmm_import_ranges, link)
		if (start <= ir->end && ir->start <= end)
			return true;
	return false;
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
 * The revocation scan: revoke every import whose export is gone.  A
 * revoked import that is still mapped is zapped again on every scan, so a
 * mapping that raced with the revocation (set up by an mmap that passed
 * its check before the region was marked) cannot survive it.  Returns
 * the mask of exporter nodes some record of which could not be read (the
 * scan cannot vouch for their withdrawals this time).
 */
unsigned long obmm_imports_revoke_scan(void)
{
	struct obmm_import_range *ir;
	unsigned long unsure_mask = 0;
	struct obmm_region *r;
	const char *why;
	unsigned int mapped;
	bool revoked, unsure;

	mutex_lock(&obmm_import_mutex);
	list_for_each_entry(ir, &obmm_import_ranges, link) {
		r = ir->region;
		if (!r->tracked)
			continue;
		/* Each record read may spin on a peer's stuck seq. */
		cond_resched();
		mutex_lock(&r->mmap_lock);
		revoked = r->revoked;
		mapped = r->mmap_count;
		mutex_unlock(&r->mmap_lock);
		if (revoked) {
			if (mapped)
				obmm_shmdev_revoke(r);
			continue;
		}
		unsure = false;
		why = obmm_access_dep_lost(&r->dep, &unsure);
		if (unsure)
			unsure_mask |= BIT(r->dep.node);
		if (!why)
			continue;
		obmm_shmdev_revoke(r);
		pr_info("import mem_id %d revoked: %s (node %d record %d)\n",
			r->id, why, r->dep.node, r->dep.slot);
	}
	mutex_unlock(&obmm_import_mutex);
	return unsure_mask;
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
		if (!ir->region->tracked || !obmm_shmdev_revoked(ir->region))
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
				   "Invalid import flags %#llx (unknown flags: %#llx)",
				   flags, flags & ~OBMM_IMPORT_FLAG_MASK);
	if (mmap == numa)
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				   "Exactly one of {ALLOW_MMAP, NUMA_REMOTE} must be specified as import flag (flags %#llx)",
				   flags);
	if ((flags & OBMM_IMPORT_FLAG_PREIMPORT) && !numa)
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				   "Preimport must be used with NUMA_REMOTE (flags %#llx)",
				   flags);
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
				   "PA segments not aligned to OBMM basic granu: base=%#llx, size=%#llx, granularity=%#x",
				   cmd->addr, cmd->length, OBMM_BASIC_GRANU);
	if (!cmd->addr)
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL, "PA=0 unexpected");
	if (check_add_overflow(cmd->addr, cmd->length, &end))
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				   "PA range overflow: base=%#llx, size=%#llx",
				   cmd->addr, cmd->length);
	if ((cmd->flags & OBMM_IMPORT_FLAG_NUMA_REMOTE) &&
	    !(cmd->flags & OBMM_IMPORT_FLAG_PREIMPORT) &&
	    obmm_base_dist_invalid(cmd->base_dist))
		return obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				   "invalid numa base distance %u: reserved values used",
				   cmd->base_dist);
	return 0;
}

#define OBMM_DIRECT_IMPORT_NAME	"DIRECT_IMPORT_UBMEM"

/*
 * Steps 9 and 11 of IMPORT: the ubmem and memdev iomem resources.  The
 * ubmem resource is requested as a child of the window's BAR, never
 * inserted above it: insert_resource() of a range equal to the BAR would
 * make it the BAR's parent, and releasing it would unlink the BAR too.
 */
static int obmm_import_claim_iomem(struct obmm_region *r,
				   struct resource *window, phys_addr_t start,
				   u64 len)
{
	r->ubmem_res.name = OBMM_DIRECT_IMPORT_NAME;
	r->ubmem_res.start = start;
	r->ubmem_res.end = start + len - 1;
	r->ubmem_res.flags = IORESOURCE_MEM;
	if (request_resource(window, &r->ubmem_res))
		return obmm_refuse(OBMM_OP_IMPORT, -EBUSY,
				   "failed to setup ubmem resource: ret=%pe (iomem [%pa, +%#llx) is taken)",
				   ERR_PTR(-EBUSY), &start, len);
	snprintf(r->memid_name, sizeof(r->memid_name), "MEMID_%d", r->id);
	r->memid_res.name = r->memid_name;
	r->memid_res.start = start;
	r->memid_res.end = start + len - 1;
	r->memid_res.flags = IORESOURCE_MEM;
	if (request_resource(&r->ubmem_res, &r->memid_res)) {
		release_resource(&r->ubmem_res);
		return obmm_refuse(OBMM_OP_IMPORT, -EBUSY,
				   "memid=%d: failed to setup memdev resource: %pe",
				   r->id, ERR_PTR(-EBUSY));
	}
	return 0;
}

static void obmm_import_release_iomem(struct obmm_region *r)
{
	if (r->memid_res.parent)
		release_resource(&r->memid_res);
	if (r->ubmem_res.parent)
		release_resource(&r->ubmem_res);
}

/* The hot-add part of an import: unsupported without OLK numa_remote. */
static int obmm_import_numa(struct obmm_region *r,
			    const struct obmm_cmd_import *cmd)
{
	/* Preimport: no range is ever registered (see top of file). */
	if (cmd->flags & OBMM_IMPORT_FLAG_PREIMPORT)
		return obmm_refuse(OBMM_OP_IMPORT, -EFAULT,
				   "PA %#llx is not registered as preimport",
				   cmd->addr);
	return obmm_refuse(OBMM_OP_IMPORT, -EOPNOTSUPP,
			   "emulator: NUMA_REMOTE memory hot-add is not supported (pa=%#llx, size=%#llx)",
			   cmd->addr, cmd->length);
}

long obmm_import_ioctl(void __user *uarg)
{
	struct obmm_cmd_import cmd;
	struct obmm_region *r;
	bool ranged = false;
	int node, ret;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_IMPORT, -EFAULT,
				   "failed to load import argument");
	ret = obmm_import_check_flags(cmd.flags);
	if (ret)
		return ret;

	r = obmm_region_alloc(OBMM_REGION_IMPORT);
	if (!r)
		return obmm_refuse(OBMM_OP_IMPORT, -ENOMEM, "no memory for a region");
	ret = obmm_copy_priv(r, cmd.priv, cmd.priv_len, OBMM_OP_IMPORT);
	if (ret)
		goto err_free;
	ret = obmm_import_check_range(&cmd);
	if (ret)
		goto err_free;
	ret = obmm_region_add_id(r, OBMM_OP_IMPORT);
	if (ret)
		goto err_free;
	if (cmd.scna != obmm_fabric_cna()) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -ENODEV,
				  "%#x is not a known scna (this node's primary_cna is %#x)",
				  cmd.scna, obmm_fabric_cna());
		goto err_id;
	}
	if (!(cmd.flags & OBMM_IMPORT_FLAG_PREIMPORT)) {
		ret = obmm_range_insert(r, cmd.addr, cmd.length);
		if (ret == -EEXIST)
			obmm_refuse(OBMM_OP_IMPORT, ret,
				    "PA range [%#llx, %#llx] overlaps another import or preimport range",
				    cmd.addr, cmd.addr + cmd.length - 1);
		else if (ret)
			obmm_refuse(OBMM_OP_IMPORT, ret, "no memory for the PA range");
		if (ret)
			goto err_id;
		ranged = true;
	}
	/* ub_memory_validate_pa(); scna was checked above. */
	node = obmm_fabric_window_node(cmd.addr, cmd.length, NULL);
	if (node < 0) {
		ret = obmm_refuse(OBMM_OP_IMPORT, -EINVAL,
				  "PA range invalid. Non-UBMEM memory cannot be mmaped as import memory (pa=%#llx, size=%#llx is not inside one fabric window)",
				  cmd.addr, cmd.length);
		goto err_range;
	}
	r->mem_cap = OBMM_CAP_CACHEABLE | OBMM_CAP_NONCACHEABLE;
	if (!(cmd.flags & OBMM_IMPORT_FLAG_PREIMPORT)) {
		ret = obmm_import_claim_iomem(r, obmm_fabric_window(node)->res,
					      cmd.addr, cmd.length);
		if (ret)
			goto err_range;
	}
	if (cmd.flags & OBMM_IMPORT_FLAG_NUMA_REMOTE) {
		ret = obmm_import_numa(r, &cmd);
		goto err_iomem;
	}
	/* Emulated UMMU: a live export with this tokenid must cover it. */
	ret = obmm_access_check_import(cmd.addr, cmd.length, cmd.tokenid,
				       &r->dep);
	if (ret)
		goto err_iomem;
	ret = obmm_range_track(r);
	if (ret) {
		obmm_refuse(OBMM_OP_IMPORT, ret,
			    "emulated UMMU: the export covering pa=%#llx was withdrawn during the import",
			    cmd.addr);
		goto err_iomem;
	}

	r->pa = cmd.addr;
	r->size = cmd.length;
	r->allow_mmap = true;
	r->scna = cmd.scna;
	r->dcna = cmd.dcna;
	r->numa_id = NUMA_NO_NODE;
	memcpy(r->seid, cmd.seid, sizeof(r->seid));
	memcpy(r->deid, cmd.deid, sizeof(r->deid));
	ret = obmm_shmdev_publish(r);
	if (ret) {
		obmm_refuse(OBMM_OP_IMPORT, ret,
			    "Failed to create import device. ret=%pe", ERR_PTR(ret));
		goto err_iomem;
	}
	obmm_region_activate(r);

	cmd.mem_id = r->id;
	cmd.numa_id = r->numa_id;
	if (copy_to_user(uarg, &cmd, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_IMPORT, -EFAULT,
				   "failed to write import result (mem_id=%d stays imported)",
				   r->id);
	return 0;

err_iomem:
	obmm_import_release_iomem(r);
err_range:
	if (ranged)
		obmm_range_remove(r);
err_id:
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
	obmm_shmdev_unpublish(r);
	obmm_import_release_iomem(r);
	obmm_range_remove(r);
	obmm_region_remove_id(r);
	obmm_region_free(r);
	return 0;
}

long obmm_declare_preimport_ioctl(void __user *uarg)
{
	struct obmm_cmd_preimport cmd;
	u64 block = obmm_memory_block_size();
	phys_addr_t start, end;
	int ret;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EFAULT,
				   "failed to load preimport argument");
	if (cmd.length % block)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "preimport length %#llx not aligned to %#llx",
				   cmd.length, block);
	if (cmd.pa % block)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "preimport base PA %#llx not aligned to %#llx",
				   cmd.pa, block);
	if (check_add_overflow(cmd.pa, cmd.length, &end))
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "preimport PA range overflowed (pa=%#llx, length=%#llx)",
				   cmd.pa, cmd.length);
	if (!cmd.length)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "invalid preimport length 0");
	if (cmd.flags & ~OBMM_PREIMPORT_FLAG_MASK)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "undefined preimport flags specified in %#llx",
				   cmd.flags);
	if (cmd.scna != obmm_fabric_cna())
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -ENODEV,
				   "%#x is not a known scna (this node's primary_cna is %#x)",
				   cmd.scna, obmm_fabric_cna());
	if (obmm_base_dist_invalid(cmd.base_dist))
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "invalid numa base distance %u: reserved values used",
				   cmd.base_dist);
	if (!cmd.pa)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL, "PA=0 unexpected");
	start = cmd.pa;
	end = start + cmd.length - 1;
	mutex_lock(&obmm_import_mutex);
	ret = obmm_range_overlaps(start, end) ? -EEXIST : 0;
	mutex_unlock(&obmm_import_mutex);
	if (ret)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, ret,
				   "PA range [%pa, %pa] overlaps another import or preimport range",
				   &start, &end);
	if (obmm_fabric_window_node(cmd.pa, cmd.length, NULL) < 0)
		return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EINVAL,
				   "PA range invalid. Cacheable memory cannot be managed with preimport (pa=%#llx, length=%#llx is not inside one fabric window)",
				   cmd.pa, cmd.length);
	/* add_memory_remote(): no numa_remote in this kernel. */
	return obmm_refuse(OBMM_OP_DECLARE_PREIMPORT, -EOPNOTSUPP,
			   "emulator: remote NUMA memory hot-add is not supported (pa=%#llx, length=%#llx)",
			   cmd.pa, cmd.length);
}

long obmm_undeclare_preimport_ioctl(void __user *uarg)
{
	struct obmm_cmd_preimport cmd;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_UNDECLARE_PREIMPORT, -EFAULT,
				   "failed to load preimport argument");
	if (cmd.flags & ~OBMM_UNPREIMPORT_FLAG_MASK)
		return obmm_refuse(OBMM_OP_UNDECLARE_PREIMPORT, -EINVAL,
				   "undefined unpreimport flags specified in %#llx",
				   cmd.flags);
	/* No preimport range can be registered (see top of file). */
	return obmm_refuse(OBMM_OP_UNDECLARE_PREIMPORT, -EFAULT,
			   "PA %#llx is not registered as preimport", cmd.pa);
}
