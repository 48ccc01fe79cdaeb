// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: the sysfs attributes of a region, which shmdev.c gives each
 * region's device:
 *
 *   /sys/devices/obmm/obmm_shmdev<id>/          per region (real names)
 *
 * /sys/kernel/obmm_emu/ is emu_sysfs.c's; the pool's counters are in
 * pool.c, the UB controller's in ubc.c.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/device.h>
#include <linux/kernel.h>
#include <linux/kobject.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/sysfs.h>

#include "sysfs.h"

/* ---- per region: /sys/devices/obmm/obmm_shmdev<id>/ ---- */

/* A root-only (0400) attribute printing one value of the region `r`. */
#define OBMM_REGION_ATTR(_name, _fmt, _value)				\
static ssize_t _name##_show(struct device *dev,				\
			    struct device_attribute *attr, char *buf)	\
{									\
	const struct obmm_region *r = to_obmm_region(dev);		\
									\
	return sysfs_emit(buf, _fmt "\n", _value);			\
}									\
static DEVICE_ATTR_ADMIN_RO(_name)

static ssize_t obmm_eid_show(const u8 *eid, char *buf)
{
	u64 lo, hi;

	memcpy(&lo, eid, sizeof(lo));
	memcpy(&hi, eid + sizeof(lo), sizeof(hi));
	return sysfs_emit(buf, "%#llx:%#llx\n", le64_to_cpu((__force __le64)hi),
			  le64_to_cpu((__force __le64)lo));
}

OBMM_REGION_ATTR(size, "0x%llx", r->size);

static ssize_t type_show(struct device *dev, struct device_attribute *attr,
			 char *buf)
{
	return sysfs_emit(buf, "%s\n",
			  to_obmm_region(dev)->type == OBMM_REGION_EXPORT ?
			  "export" : "import");
}

static DEVICE_ATTR_ADMIN_RO(type);

OBMM_REGION_ATTR(priv_len, "%u", r->priv_len);

OBMM_REGION_ATTR(allow_mmap, "%d", r->allow_mmap);

static ssize_t priv_read(struct file *filp, struct kobject *kobj,
			 struct bin_attribute *attr, char *buf, loff_t off,
			 size_t count)
{
	struct obmm_region *r = to_obmm_region(kobj_to_dev(kobj));

	if (off >= OBMM_MAX_PRIV_LEN)
		return 0;
	count = min_t(size_t, count, OBMM_MAX_PRIV_LEN - off);
	/* Bytes past priv_len were zeroed at allocation. */
	memcpy(buf, r->priv + off, count);
	return count;
}

static struct bin_attribute bin_attr_priv =
	__BIN_ATTR(priv, 0400, priv_read, NULL, OBMM_MAX_PRIV_LEN);

static struct attribute *obmm_region_attrs[] = {
	&dev_attr_size.attr,
	&dev_attr_type.attr,
	&dev_attr_priv_len.attr,
	&dev_attr_allow_mmap.attr,
	NULL,
};

static struct bin_attribute *obmm_region_bin_attrs[] = {
	&bin_attr_priv,
	NULL,
};

static const struct attribute_group obmm_region_group = {
	.attrs = obmm_region_attrs,
	.bin_attrs = obmm_region_bin_attrs,
};

static ssize_t node_mem_size_show(struct device *dev,
				  struct device_attribute *attr, char *buf)
{
	struct obmm_region *r = to_obmm_region(dev);
	unsigned int i;
	ssize_t len = 0;

	for (i = 0; i < r->node_count; i++)
		len += sysfs_emit_at(buf, len, "%s%#llx", i ? "," : "",
				     r->node_mem_size[i]);
	len += sysfs_emit_at(buf, len, "\n");
	return len;
}

static DEVICE_ATTR_ADMIN_RO(node_mem_size);

OBMM_REGION_ATTR(uba, "0x%llx", r->uba);

OBMM_REGION_ATTR(tokenid, "0x%x", r->tokenid);

OBMM_REGION_ATTR(memory_from_user, "%d", r->from_user);

static ssize_t deid_show(struct device *dev, struct device_attribute *attr,
			 char *buf)
{
	return obmm_eid_show(to_obmm_region(dev)->deid, buf);
}

static DEVICE_ATTR_ADMIN_RO(deid);

static struct attribute *obmm_export_info_attrs[] = {
	&dev_attr_node_mem_size.attr,
	&dev_attr_uba.attr,
	&dev_attr_tokenid.attr,
	&dev_attr_memory_from_user.attr,
	&dev_attr_deid.attr,
	NULL,
};

static const struct attribute_group obmm_export_info_group = {
	.name = "export_info",
	.attrs = obmm_export_info_attrs,
};

OBMM_REGION_ATTR(pa, "0x%llx", (u64)r->pa);

OBMM_REGION_ATTR(dcna, "0x%x", r->dcna);

OBMM_REGION_ATTR(scna, "0x%x", r->scna);

static ssize_t seid_show(struct device *dev, struct device_attribute *attr,
			 char *buf)
{
	return obmm_eid_show(to_obmm_region(dev)->seid, buf);
}

static DEVICE_ATTR_ADMIN_RO(seid);

OBMM_REGION_ATTR(numa_id, "%d", r->numa_id);

OBMM_REGION_ATTR(preimport, "%d", r->preimport);

static struct attribute *obmm_import_info_attrs[] = {
	&dev_attr_pa.attr,
	&dev_attr_dcna.attr,
	&dev_attr_scna.attr,
	&dev_attr_seid.attr,
	&dev_attr_deid.attr,
	&dev_attr_numa_id.attr,
	&dev_attr_preimport.attr,
	NULL,
};

static umode_t obmm_import_info_visible(struct kobject *kobj,
					struct attribute *attr, int n)
{
	struct obmm_region *r = to_obmm_region(kobj_to_dev(kobj));

	if ((attr == &dev_attr_numa_id.attr ||
	     attr == &dev_attr_preimport.attr) && !r->numa_remote)
		return 0;
	return attr->mode;
}

static const struct attribute_group obmm_import_info_group = {
	.name = "import_info",
	.attrs = obmm_import_info_attrs,
	.is_visible = obmm_import_info_visible,
};

const struct attribute_group *obmm_export_groups[] = {
	&obmm_region_group,
	&obmm_export_info_group,
	NULL,
};

const struct attribute_group *obmm_import_groups[] = {
	&obmm_region_group,
	&obmm_import_info_group,
	NULL,
};
