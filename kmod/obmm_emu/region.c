// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: regions, the shared id space, lifecycle refcount, ADDR_QUERY,
 * and the module's pseudo filesystem that holds each region's own inode.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/mount.h>
#include <linux/pseudo_fs.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "ownership.h"
#include "region.h"

/* Protects obmm_region_idr and every region's ref transitions. */
static DEFINE_MUTEX(obmm_region_mutex);
static DEFINE_IDR(obmm_region_idr);

/* The module's pseudo filesystem, home of the regions' own inodes. */
#define OBMM_EMU_FS_NAME	"obmm_emu_region"
#define OBMM_EMU_FS_MAGIC	0x6f626d6d	/* "obmm" */

static struct vfsmount *obmm_fs_mnt;

static int obmm_fs_init_fs_context(struct fs_context *fc)
{
	return init_pseudo(fc, OBMM_EMU_FS_MAGIC) ? 0 : -ENOMEM;
}

/*
 * Never registered, only kern_mount()ed at init and kern_unmount()ed at
 * exit.  No .owner: the mount must not pin the module it belongs to; every
 * inode of it is a region's, and every region is gone before exit.
 */
static struct file_system_type obmm_fs_type = {
	.name = OBMM_EMU_FS_NAME,
	.init_fs_context = obmm_fs_init_fs_context,
	.kill_sb = kill_anon_super,
};

/*
 * A region's own inode (dropped with iput() when the region is freed).
 * Region state must not hang on the inode of a device node: that may live
 * on a filesystem unmounted while the region lives.
 */
static struct inode *obmm_region_inode_new(void)
{
	return alloc_anon_inode(obmm_fs_mnt->mnt_sb);
}

int obmm_region_fs_init(void)
{
	obmm_fs_mnt = kern_mount(&obmm_fs_type);
	if (IS_ERR(obmm_fs_mnt)) {
		int ret = PTR_ERR(obmm_fs_mnt);

		obmm_fs_mnt = NULL;
		return ret;
	}
	return 0;
}

/* After the last region is freed: its inode lives on the pseudo fs. */
void obmm_region_fs_exit(void)
{
	kern_unmount(obmm_fs_mnt);
	obmm_fs_mnt = NULL;
}

static void obmm_region_release(struct device *dev)
{
	struct obmm_region *r = to_obmm_region(dev);

	iput(r->map_inode);
	obmm_ownership_free(r);
	mutex_destroy(&r->mmap_lock);
	kfree(r);
}

struct obmm_region *obmm_region_alloc(enum obmm_region_type type)
{
	struct obmm_region *r;

	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return NULL;
	r->map_inode = obmm_region_inode_new();
	if (IS_ERR(r->map_inode)) {
		kfree(r);
		return NULL;
	}
	r->type = type;
	r->id = OBMM_INVALID_REGIONID;
	r->record_slot = -1;
	r->numa_id = NUMA_NO_NODE;
	refcount_set(&r->ref, 0);
	mutex_init(&r->mmap_lock);
	device_initialize(&r->dev);
	r->dev.release = obmm_region_release;
	return r;
}

/* Drop the last reference of a region; frees it once no file holds it. */
void obmm_region_free(struct obmm_region *r)
{
	put_device(&r->dev);
}

int obmm_region_add_id(struct obmm_region *r, const char *op)
{
	int id;

	mutex_lock(&obmm_region_mutex);
	id = idr_alloc(&obmm_region_idr, r, OBMM_MIN_VALID_REGIONID,
		       OBMM_MAX_VALID_REGIONID + 1, GFP_KERNEL);
	mutex_unlock(&obmm_region_mutex);
	if (id < 0)
		return obmm_refuse(op, id == -ENOMEM ? -ENOMEM : -ENOSPC,
				   "Failed to allocate mem_id, ret=%pe",
				   ERR_PTR(id));
	r->id = id;
	return 0;
}

void obmm_region_remove_id(struct obmm_region *r)
{
	if (r->id == OBMM_INVALID_REGIONID)
		return;
	mutex_lock(&obmm_region_mutex);
	idr_remove(&obmm_region_idr, r->id);
	mutex_unlock(&obmm_region_mutex);
}

void obmm_region_activate(struct obmm_region *r)
{
	mutex_lock(&obmm_region_mutex);
	refcount_set(&r->ref, 1);
	mutex_unlock(&obmm_region_mutex);
}

void obmm_region_reactivate(struct obmm_region *r)
{
	obmm_region_activate(r);
}

/*
 * UNEXPORT/UNIMPORT: take an active region with no open file out of
 * service.  Check order and errno as the real driver: id out of range
 * ENOENT, unknown flags EINVAL, no such region ENOENT, in use EBUSY, other
 * type EINVAL.
 */
int obmm_region_deactivate(const char *op, u64 mem_id, u64 flags,
			   u64 valid_flags, enum obmm_region_type type,
			   struct obmm_region **out)
{
	/* The real lines name the function: obmm_unexport() or obmm_unimport(). */
	const char *fn = type == OBMM_REGION_EXPORT ? "obmm_unexport" :
						      "obmm_unimport";
	struct obmm_region *r;
	int ret = 0;

	if (mem_id < OBMM_MIN_VALID_REGIONID || mem_id > OBMM_MAX_VALID_REGIONID)
		return obmm_refuse(op, -ENOENT,
				   "mem_id=%llu is out of valid mem_id range.", mem_id);
	if (flags & ~valid_flags)
		return obmm_refuse(op, -EINVAL, "%s: invalid flags %#llx.", fn,
				   flags);
	mutex_lock(&obmm_region_mutex);
	r = idr_find(&obmm_region_idr, (unsigned long)mem_id);
	if (!r) {
		ret = -ENOENT;
	} else if (!refcount_dec_if_one(&r->ref)) {
		ret = -EBUSY;
	} else if (r->type != type) {
		refcount_set(&r->ref, 1);
		ret = -EINVAL;
	} else {
		*out = r;
	}
	mutex_unlock(&obmm_region_mutex);
	if (ret == -ENOENT)
		return obmm_refuse(op, ret,
				   "failed to deactivate: region with mem_id=%d not found.",
				   (int)mem_id);
	if (ret == -EBUSY)
		return obmm_refuse(op, ret,
				   "failed to deactivate: region %d is being used or in creation/destruction process.",
				   (int)mem_id);
	if (ret) {
		obmm_klog("%s: mem_id=%llu region type mismatched.", fn, mem_id);
		return obmm_refuse(op, ret, "%s: mem_id=%llu failed, %pe.", fn,
				   mem_id, ERR_PTR(ret));
	}
	return 0;
}

/* shmdev open: a reference for an active region, else -EAGAIN. */
struct obmm_region *obmm_region_get_by_id(int id, int *err)
{
	struct obmm_region *r;

	mutex_lock(&obmm_region_mutex);
	r = idr_find(&obmm_region_idr, id);
	if (!r) {
		*err = -ENXIO;
	} else if (!refcount_inc_not_zero(&r->ref)) {
		*err = -EAGAIN;
		r = NULL;
	}
	mutex_unlock(&obmm_region_mutex);
	return r;
}

void obmm_region_put(struct obmm_region *r)
{
	mutex_lock(&obmm_region_mutex);
	refcount_dec(&r->ref);
	mutex_unlock(&obmm_region_mutex);
}

int obmm_copy_priv(struct obmm_region *r, const void __user *priv, u16 len,
		   const char *op)
{
	if (len > OBMM_MAX_PRIV_LEN)
		return obmm_refuse(op, -EINVAL, "priv_len=%u too large (limit=%u).",
				   len, OBMM_MAX_PRIV_LEN);
	if (len && copy_from_user(r->priv, priv, len))
		return obmm_refuse(op, -EFAULT, "failed to save private data.");
	r->priv_len = len;
	return 0;
}

int obmm_check_vendor(const void __user *vendor, u16 len, const char *op)
{
	void *buf;

	if (len > OBMM_MAX_VENDOR_LEN)
		return obmm_refuse(op, -EINVAL,
				   "invalid vendor_len = 0x%x, should less than 0x%x",
				   len, OBMM_MAX_VENDOR_LEN);
	if (!len)
		return 0;
	buf = memdup_user(vendor, len);
	if (PTR_ERR_OR_ZERO(buf) == -EFAULT)
		return obmm_refuse(op, -EFAULT, "failed to save vendor data.");
	if (IS_ERR(buf))
		return obmm_refuse_emu(op, (int)PTR_ERR(buf),
				       "no memory for %u bytes of vendor data", len);
	/* The UMMU attributes have no meaning without a UMMU. */
	kfree(buf);
	return 0;
}

static bool obmm_region_active(struct obmm_region *r)
{
	return refcount_read(&r->ref) != 0;
}

static bool obmm_region_pa_to_offset(struct obmm_region *r, u64 pa,
				     u64 *offset)
{
	unsigned long i;
	phys_addr_t base;

	if (r->type == OBMM_REGION_IMPORT || !r->from_user) {
		if (pa < r->pa || pa - r->pa >= r->size)
			return false;
		*offset = pa - r->pa;
		return true;
	}
	for (i = 0; i < r->npages; i++) {
		base = page_to_phys(r->pages[i]);
		if (pa >= base && pa - base < PAGE_SIZE) {
			*offset = ((u64)i << PAGE_SHIFT) + (pa - base);
			return true;
		}
	}
	return false;
}

static u64 obmm_region_offset_to_pa(struct obmm_region *r, u64 offset)
{
	if (r->type == OBMM_REGION_IMPORT || !r->from_user)
		return r->pa + offset;
	return page_to_phys(r->pages[offset >> PAGE_SHIFT]) +
	       (offset & ~PAGE_MASK);
}

/* The one refusal line of ADDR_QUERY, after the region lock is dropped. */
static int obmm_addr_query_refuse(const struct obmm_cmd_addr_query *cmd,
				  enum obmm_region_type type, int ret)
{
	if (cmd->key_type == OBMM_QUERY_BY_PA)
		return obmm_refuse_emu(OBMM_OP_ADDR_QUERY, ret,
				       "no active region contains pa=%#llx", cmd->pa);
	if (cmd->key_type != OBMM_QUERY_BY_ID_OFFSET)
		return obmm_refuse(OBMM_OP_ADDR_QUERY, ret,
				   "invalid query key type: %u.", cmd->key_type);
	if (ret == -EINVAL && type == OBMM_REGION_IMPORT)
		return obmm_refuse(OBMM_OP_ADDR_QUERY, ret,
				   "%s: invalid offset 0x%lx",
				   "get_offset_detail_import",
				   (unsigned long)cmd->offset);
	if (ret == -EINVAL)
		return obmm_refuse_emu(OBMM_OP_ADDR_QUERY, ret,
				       "mem_id=%llu: invalid offset %#llx (size exceeded)",
				       cmd->mem_id, cmd->offset);
	if (cmd->mem_id < OBMM_MIN_VALID_REGIONID ||
	    cmd->mem_id > OBMM_MAX_VALID_REGIONID)
		return obmm_refuse(OBMM_OP_ADDR_QUERY, ret,
				   "mem_id=%llu is out of valid mem_id range.",
				   cmd->mem_id);
	return obmm_refuse(OBMM_OP_ADDR_QUERY, ret, "region %llu not found.",
			   cmd->mem_id);
}

long obmm_addr_query_ioctl(void __user *uarg)
{
	struct obmm_cmd_addr_query cmd;
	enum obmm_region_type type = OBMM_REGION_EXPORT;
	struct obmm_region *r;
	int id, ret = -ENOENT;
	u64 offset;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_ADDR_QUERY, -EFAULT,
				   "failed to load addr_query argument");

	mutex_lock(&obmm_region_mutex);
	switch (cmd.key_type) {
	case OBMM_QUERY_BY_PA:
		idr_for_each_entry(&obmm_region_idr, r, id) {
			if (!obmm_region_active(r))
				continue;
			if (obmm_region_pa_to_offset(r, cmd.pa, &offset)) {
				cmd.mem_id = r->id;
				cmd.offset = offset;
				ret = 0;
				break;
			}
		}
		break;
	case OBMM_QUERY_BY_ID_OFFSET:
		if (cmd.mem_id < OBMM_MIN_VALID_REGIONID ||
		    cmd.mem_id > OBMM_MAX_VALID_REGIONID)
			break;
		r = idr_find(&obmm_region_idr, (unsigned long)cmd.mem_id);
		if (!r || !obmm_region_active(r))
			break;
		if (cmd.offset >= r->size) {
			type = r->type;
			ret = -EINVAL;
			break;
		}
		cmd.pa = obmm_region_offset_to_pa(r, cmd.offset);
		ret = 0;
		break;
	default:
		ret = -EINVAL;
		break;
	}
	mutex_unlock(&obmm_region_mutex);

	if (ret)
		return obmm_addr_query_refuse(&cmd, type, ret);
	if (copy_to_user(uarg, &cmd, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_ADDR_QUERY, -EFAULT,
				   "failed to write obmm_query result");
	return 0;
}

void obmm_regions_init(void)
{
	idr_init(&obmm_region_idr);
}

void obmm_regions_exit(void)
{
	/* Every region holds a module reference, so none can be left. */
	WARN_ON(!idr_is_empty(&obmm_region_idr));
	idr_destroy(&obmm_region_idr);
}
