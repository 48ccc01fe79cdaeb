// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: the emulated UB bus controller, as libobmm's vendor adaptor
 * reads it:
 *
 *   /sys/devices/ub_bus_controller<ubc_index>/<ubc_dev>/{eid,primary_cna,ummu_map,numa}
 *   /sys/devices/ub_bus_controller<ubc_index>/<ubc_dev>/ubc/ (the same)
 *
 * ubc_index and ubc_dev default to 0 and "0"; real hosts name them
 * otherwise (e.g. ub_bus_controller1/00002), and a program that hard-codes
 * its host's path runs unchanged once the module is loaded with that name.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/device.h>
#include <linux/err.h>
#include <linux/moduleparam.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/sysfs.h>

#include "obmm_emu.h"

#define OBMM_EMU_UBC_PREFIX	"ub_bus_controller"
/* libobmm's vendor adaptor looks at ub_bus_controller0..7. */
#define OBMM_EMU_UBC_MAX_INDEX	7
/* A sysfs directory name of the controller's device: short, no '/'. */
#define OBMM_EMU_UBC_DEV_MAX	32
#define OBMM_EMU_UMMU_MAP	0

static unsigned int obmm_ubc_index;
module_param_named(ubc_index, obmm_ubc_index, uint, 0444);
MODULE_PARM_DESC(ubc_index,
		 "Index i of /sys/devices/ub_bus_controller<i>/ (0..7, default 0)");

static char *obmm_ubc_devname = "0";
module_param_named(ubc_dev, obmm_ubc_devname, charp, 0444);
MODULE_PARM_DESC(ubc_dev,
		 "Name of the controller's device directory under ub_bus_controller<i>/ (default \"0\")");

static struct device *obmm_ubc_root;
static struct device *obmm_ubc_dev;

static ssize_t eid_show(struct device *dev, struct device_attribute *attr,
			char *buf)
{
	return sysfs_emit(buf, "0x%x\n", obmm_fabric_eid());
}

static DEVICE_ATTR_RO(eid);

static ssize_t primary_cna_show(struct device *dev,
				struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "0x%x\n", obmm_fabric_cna());
}

static DEVICE_ATTR_RO(primary_cna);

static ssize_t ummu_map_show(struct device *dev,
			     struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", OBMM_EMU_UMMU_MAP);
}

static DEVICE_ATTR_RO(ummu_map);

static ssize_t numa_show(struct device *dev, struct device_attribute *attr,
			 char *buf)
{
	return sysfs_emit(buf, "%d\n", obmm_pool_nid());
}

static DEVICE_ATTR_RO(numa);

static struct attribute *obmm_ubc_attrs[] = {
	&dev_attr_eid.attr,
	&dev_attr_primary_cna.attr,
	&dev_attr_ummu_map.attr,
	&dev_attr_numa.attr,
	NULL,
};

/*
 * libobmm globs ub_bus_controller<i>/<x>/ubc and reads the attributes
 * of <x>; they are also provided inside ubc/.
 */
static const struct attribute_group obmm_ubc_flat_group = {
	.attrs = obmm_ubc_attrs,
};

static const struct attribute_group obmm_ubc_group = {
	.name = "ubc",
	.attrs = obmm_ubc_attrs,
};

static const struct attribute_group *obmm_ubc_groups[] = {
	&obmm_ubc_flat_group,
	&obmm_ubc_group,
	NULL,
};

static void obmm_ubc_release(struct device *dev)
{
	kfree(dev);
}

static bool obmm_ubc_devname_valid(const char *name)
{
	size_t len = strnlen(name, OBMM_EMU_UBC_DEV_MAX + 1);

	return len && len <= OBMM_EMU_UBC_DEV_MAX && !strchr(name, '/') &&
	       strcmp(name, ".") && strcmp(name, "..");
}

int obmm_ubc_init(void)
{
	char root[sizeof(OBMM_EMU_UBC_PREFIX) + 3];
	int ret;

	if (obmm_ubc_index > OBMM_EMU_UBC_MAX_INDEX) {
		pr_err("ubc_index %u out of range (0..%d)\n", obmm_ubc_index,
		       OBMM_EMU_UBC_MAX_INDEX);
		return -EINVAL;
	}
	if (!obmm_ubc_devname_valid(obmm_ubc_devname)) {
		pr_err("ubc_dev \"%s\" is not a directory name (1..%d characters, no '/')\n",
		       obmm_ubc_devname, OBMM_EMU_UBC_DEV_MAX);
		return -EINVAL;
	}
	snprintf(root, sizeof(root), OBMM_EMU_UBC_PREFIX "%u", obmm_ubc_index);
	obmm_ubc_root = root_device_register(root);
	if (IS_ERR(obmm_ubc_root)) {
		ret = PTR_ERR(obmm_ubc_root);
		obmm_ubc_root = NULL;
		return ret;
	}
	obmm_ubc_dev = kzalloc(sizeof(*obmm_ubc_dev), GFP_KERNEL);
	if (!obmm_ubc_dev) {
		ret = -ENOMEM;
		goto err_root;
	}
	device_initialize(obmm_ubc_dev);
	obmm_ubc_dev->parent = obmm_ubc_root;
	obmm_ubc_dev->groups = obmm_ubc_groups;
	obmm_ubc_dev->release = obmm_ubc_release;
	ret = dev_set_name(obmm_ubc_dev, "%s", obmm_ubc_devname);
	if (!ret)
		ret = device_add(obmm_ubc_dev);
	if (ret) {
		put_device(obmm_ubc_dev);
		obmm_ubc_dev = NULL;
		goto err_root;
	}
	return 0;
err_root:
	root_device_unregister(obmm_ubc_root);
	obmm_ubc_root = NULL;
	return ret;
}

void obmm_ubc_exit(void)
{
	if (obmm_ubc_dev)
		device_unregister(obmm_ubc_dev);
	obmm_ubc_dev = NULL;
	if (obmm_ubc_root)
		root_device_unregister(obmm_ubc_root);
	obmm_ubc_root = NULL;
}
