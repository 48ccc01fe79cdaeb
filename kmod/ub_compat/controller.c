// SPDX-License-Identifier: GPL-2.0
/*
 * ub_compat: this node's UB bus controller in sysfs, where libobmm's vendor
 * adaptor and obmm.identity read it (the UB bus driver's sysfs.c upstream):
 *
 *   /sys/devices/ub_bus_controller0/0/{eid,primary_cna,ummu_map,numa}
 *   /sys/devices/ub_bus_controller0/0/ubc/ (the same)
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/device.h>
#include <linux/err.h>
#include <linux/slab.h>
#include <linux/sysfs.h>

#include "ub_compat.h"
#include "ub_compat_priv.h"

#define UB_COMPAT_UBC_ROOT	"ub_bus_controller0"
#define UB_COMPAT_UBC_DEV	"0"
#define UB_COMPAT_UMMU_MAP	0

static struct device *ubc_root;
static struct device *ubc_dev;

static ssize_t eid_show(struct device *dev, struct device_attribute *attr,
			char *buf)
{
	return sysfs_emit(buf, "0x%x\n", ub_compat_eid());
}

static DEVICE_ATTR_RO(eid);

static ssize_t primary_cna_show(struct device *dev,
				struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "0x%x\n", ub_compat_cna());
}

static DEVICE_ATTR_RO(primary_cna);

static ssize_t ummu_map_show(struct device *dev,
			     struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", UB_COMPAT_UMMU_MAP);
}

static DEVICE_ATTR_RO(ummu_map);

static ssize_t numa_show(struct device *dev, struct device_attribute *attr,
			 char *buf)
{
	return sysfs_emit(buf, "%d\n", ub_compat_controller_nid());
}

static DEVICE_ATTR_RO(numa);

static struct attribute *ubc_attrs[] = {
	&dev_attr_eid.attr,
	&dev_attr_primary_cna.attr,
	&dev_attr_ummu_map.attr,
	&dev_attr_numa.attr,
	NULL,
};

static const struct attribute_group ubc_flat_group = {
	.attrs = ubc_attrs,
};

/* libobmm globs ub_bus_controller<i>/<x>/ubc. */
static const struct attribute_group ubc_group = {
	.name = "ubc",
	.attrs = ubc_attrs,
};

static const struct attribute_group *ubc_groups[] = {
	&ubc_flat_group,
	&ubc_group,
	NULL,
};

static void ubc_release(struct device *dev)
{
	kfree(dev);
}

int ub_compat_controller_init(void)
{
	int ret;

	ubc_root = root_device_register(UB_COMPAT_UBC_ROOT);
	if (IS_ERR(ubc_root)) {
		ret = PTR_ERR(ubc_root);
		ubc_root = NULL;
		return ret;
	}
	ubc_dev = kzalloc(sizeof(*ubc_dev), GFP_KERNEL);
	if (!ubc_dev) {
		ret = -ENOMEM;
		goto err_root;
	}
	device_initialize(ubc_dev);
	ubc_dev->parent = ubc_root;
	ubc_dev->groups = ubc_groups;
	ubc_dev->release = ubc_release;
	ret = dev_set_name(ubc_dev, "%s", UB_COMPAT_UBC_DEV);
	if (!ret)
		ret = device_add(ubc_dev);
	if (ret) {
		put_device(ubc_dev);
		ubc_dev = NULL;
		goto err_root;
	}
	return 0;
err_root:
	root_device_unregister(ubc_root);
	ubc_root = NULL;
	return ret;
}

void ub_compat_controller_exit(void)
{
	if (ubc_dev)
		device_unregister(ubc_dev);
	ubc_dev = NULL;
	if (ubc_root)
		root_device_unregister(ubc_root);
	ubc_root = NULL;
}
