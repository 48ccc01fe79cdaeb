// SPDX-License-Identifier: GPL-2.0
/*
 * The UB bus controllers in sysfs (ub_controller.h): the attributes and
 * formats of drivers/ub/ubus/sysfs.c, the bus's /sys/bus/ub files, and the
 * controllers' devices.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/device.h>
#include <linux/err.h>
#include <linux/kernel.h>
#include <linux/moduleparam.h>
#include <linux/printk.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/sysfs.h>
#include <linux/version.h>

#include "ub_controller.h"

#define TB_UBC_PREFIX		"ub_bus_controller"
#define TB_UBC_UMMU_MAP		0
/* The guid's type field: UB_TYPE_CONTROLLER (include/ub/ubus/ubus.h). */
#define TB_UBC_ENTITY_TYPE	0x1
/*
 * The guid's other fields (struct ub_guid): the vendor is Huawei's UB
 * vendor id (openEuler's QEMU UB model, hw/ub/hisi/ubc.h VENDER_ID_HUAWEI);
 * no public source gives a controller's device id or class code: 0.  The
 * sequence number is the controller's EID (unique in the fabric).
 */
#define TB_UBC_VENDOR		0xcc08
#define TB_UBC_DEVICE		0x0
#define TB_UBC_CLASS_CODE	0x0
#define TB_UBC_GUID_VERSION	0x0

/* The UB bus's feature bits (include/ub/ubus/ubus.h of OLK). */
#define TB_UB_URMA_FIRST_BIT	16

struct tb_ubc {
	struct device *root;	/* ub_bus_controller<i> */
	struct device dev;	/* its entity */
	unsigned int k;
};

/*
 * The module parameters naming the controllers, declared here once: both
 * modules that link this file take them under the same names.
 */
static unsigned int ubc_index;
module_param(ubc_index, uint, 0444);
MODULE_PARM_DESC(ubc_index,
		 "Index i of the first controller's /sys/devices/ub_bus_controller<i>/ (0..7, default 0)");

static char *ubc_dev[TB_UBC_MAX] = { "00001" };
static unsigned int ubc_count = 1;
module_param_array(ubc_dev, charp, &ubc_count, 0444);
MODULE_PARM_DESC(ubc_dev,
		 "Device directory name of each controller under ub_bus_controller<ubc_index + k>/ (default \"00001\": one controller)");

static const struct tb_ubc_source *tb_src;
static struct tb_ubc *tb_ubcs[TB_UBC_MAX];
static bool tb_ub_bus_registered;

static struct tb_ubc *to_tb_ubc(struct device *dev)
{
	return container_of(dev, struct tb_ubc, dev);
}

/* The entity number: the device name read as hex, as ubus names it. */
static unsigned int tb_ubc_uent_num(const struct tb_ubc *c)
{
	unsigned int num;

	return kstrtouint(dev_name(&c->dev), 16, &num) ? c->k + 1 : num;
}

static ssize_t eid_show(struct device *dev, struct device_attribute *attr,
			char *buf)
{
	return sysfs_emit(buf, "%u\n", tb_src->eid(to_tb_ubc(dev)->k));
}

static DEVICE_ATTR_RO(eid);

static ssize_t primary_cna_show(struct device *dev,
				struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%#06x\n", tb_src->cna(to_tb_ubc(dev)->k));
}

static DEVICE_ATTR_RO(primary_cna);

static ssize_t ummu_map_show(struct device *dev,
			     struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%#04x\n", TB_UBC_UMMU_MAP);
}

static DEVICE_ATTR_RO(ummu_map);

static ssize_t numa_show(struct device *dev, struct device_attribute *attr,
			 char *buf)
{
	return sysfs_emit(buf, "%#04x\n", tb_src->pxm());
}

static DEVICE_ATTR_RO(numa);

static ssize_t ubc_show(struct device *dev, struct device_attribute *attr,
			char *buf)
{
	return sysfs_emit(buf, "%#05x\n", tb_ubc_uent_num(to_tb_ubc(dev)));
}

static DEVICE_ATTR_RO(ubc);

static ssize_t entity_idx_show(struct device *dev,
			       struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%u\n", 0);
}

static DEVICE_ATTR_RO(entity_idx);

static ssize_t type_show(struct device *dev, struct device_attribute *attr,
			 char *buf)
{
	return sysfs_emit(buf, "%#x\n", TB_UBC_ENTITY_TYPE);
}

static DEVICE_ATTR_RO(type);

static ssize_t upi_show(struct device *dev, struct device_attribute *attr,
			char *buf)
{
	return sysfs_emit(buf, "%#04x\n", 0);
}

static DEVICE_ATTR_RO(upi);

/* vendor and device "%#06x" (the guid's fields), class_code "%#06x". */
static ssize_t vendor_show(struct device *dev, struct device_attribute *attr,
			   char *buf)
{
	return sysfs_emit(buf, "%#06x\n", TB_UBC_VENDOR);
}

static DEVICE_ATTR_RO(vendor);

static ssize_t device_show(struct device *dev, struct device_attribute *attr,
			   char *buf)
{
	return sysfs_emit(buf, "%#06x\n", TB_UBC_DEVICE);
}

static DEVICE_ATTR_RO(device);

static ssize_t class_code_show(struct device *dev,
			       struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%#06x\n", TB_UBC_CLASS_CODE);
}

static DEVICE_ATTR_RO(class_code);

/* ub_show_guid(): vendor-device-version-type-reserved-seq_num. */
static ssize_t guid_show(struct device *dev, struct device_attribute *attr,
			 char *buf)
{
	return sysfs_emit(buf, "%04x-%04x-%01x-%01x-%06x-%016llx\n",
			  TB_UBC_VENDOR, TB_UBC_DEVICE, TB_UBC_GUID_VERSION,
			  TB_UBC_ENTITY_TYPE, 0,
			  (unsigned long long)tb_src->eid(to_tb_ubc(dev)->k));
}

static DEVICE_ATTR_RO(guid);

static struct attribute *tb_ubc_attrs[] = {
	&dev_attr_eid.attr,
	&dev_attr_primary_cna.attr,
	&dev_attr_ummu_map.attr,
	&dev_attr_numa.attr,
	&dev_attr_ubc.attr,
	&dev_attr_entity_idx.attr,
	&dev_attr_type.attr,
	&dev_attr_upi.attr,
	&dev_attr_vendor.attr,
	&dev_attr_device.attr,
	&dev_attr_class_code.attr,
	&dev_attr_guid.attr,
	NULL,
};

ATTRIBUTE_GROUPS(tb_ubc);

/* ---- /sys/bus/ub ---- */

static const char * const tb_ub_feature_names[] = {
	"UB Memory Borrowing(Non Cacheable)",
	"UB Memory Borrowing(Cacheable)",
	"UB Memory Sharing(Non Cacheable)",
	"UB Memory Sharing(Cacheable)",
	"URMA RTP-ROI",
	"URMA RTP-ROT",
	"URMA RTP-ROL",
	"URMA CTP-ROI",
	"URMA CTP-ROT",
	"URMA CTP-ROL",
	"URMA CTP-UNO",
	"URMA UTP-UNO",
};

/* The feature bit of tb_ub_feature_names[i]. */
static u64 tb_ub_feature_bit(unsigned int i)
{
	return i < 4 ? BIT_ULL(i) : BIT_ULL(TB_UB_URMA_FIRST_BIT + i - 4);
}

/* Bus attributes are shown for a const bus type from 6.4 on. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
#define TB_BUS_CONST	const
#else
#define TB_BUS_CONST
#endif

static ssize_t ub_feature_show(TB_BUS_CONST struct bus_type *bus, char *buf)
{
	u64 f = tb_src->feature();
	ssize_t n;
	unsigned int i;

	n = sysfs_emit(buf, "%#.16llx\n", f);
	for (i = 0; i < ARRAY_SIZE(tb_ub_feature_names); i++)
		n += sysfs_emit_at(buf, n, "%s%c\n", tb_ub_feature_names[i],
				   f & tb_ub_feature_bit(i) ? '+' : '-');
	return n;
}

static BUS_ATTR_RO(ub_feature);

static ssize_t cluster_show(TB_BUS_CONST struct bus_type *bus, char *buf)
{
	return sysfs_emit(buf, "%d\n", 0);
}

static BUS_ATTR_RO(cluster);

/* No bus instance is emulated: the header of an empty list. */
static ssize_t instance_show(TB_BUS_CONST struct bus_type *bus, char *buf)
{
	return sysfs_emit(buf, "count %#x, from %#x, show %#x\n", 0, 0, 0);
}

static BUS_ATTR_RO(instance);

static struct attribute *tb_ub_bus_attrs[] = {
	&bus_attr_instance.attr,
	&bus_attr_cluster.attr,
	&bus_attr_ub_feature.attr,
	NULL,
};

ATTRIBUTE_GROUPS(tb_ub_bus);

static struct bus_type tb_ub_bus = {
	.name = "ub",
	.bus_groups = tb_ub_bus_groups,
};

/* ---- the controllers ---- */

static void tb_ubc_release(struct device *dev)
{
	kfree(to_tb_ubc(dev));
}

static bool tb_ubc_devname_valid(const char *name)
{
	size_t len = strnlen(name, TB_UBC_DEV_MAX + 1);

	return len && len <= TB_UBC_DEV_MAX && !strchr(name, '/') &&
	       strcmp(name, ".") && strcmp(name, "..");
}

static void tb_ubc_del(unsigned int k)
{
	struct tb_ubc *c = tb_ubcs[k];
	struct device *root;

	if (!c)
		return;
	tb_ubcs[k] = NULL;
	root = c->root;
	device_unregister(&c->dev);
	root_device_unregister(root);
}

static int tb_ubc_add(unsigned int index, unsigned int k, const char *name)
{
	char root[sizeof(TB_UBC_PREFIX) + 3];
	struct tb_ubc *c;
	int ret;

	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c)
		return -ENOMEM;
	snprintf(root, sizeof(root), TB_UBC_PREFIX "%u", index + k);
	c->root = root_device_register(root);
	if (IS_ERR(c->root)) {
		ret = PTR_ERR(c->root);
		kfree(c);
		return ret;
	}
	c->k = k;
	device_initialize(&c->dev);
	c->dev.parent = c->root;
	c->dev.bus = &tb_ub_bus;
	c->dev.groups = tb_ubc_groups;
	c->dev.release = tb_ubc_release;
	ret = dev_set_name(&c->dev, "%s", name);
	if (!ret)
		ret = device_add(&c->dev);
	if (ret) {
		root_device_unregister(c->root);
		put_device(&c->dev);
		return ret;
	}
	tb_ubcs[k] = c;
	return 0;
}

unsigned int tb_ubc_count(void)
{
	return ubc_count;
}

/*
 * The bus and controllers k = 0 .. ubc_count - 1, named ubc_dev[k] under
 * ub_bus_controller<ubc_index + k>; -EINVAL (and why, in the log) for
 * parameters out of range.
 */
int tb_ubc_init(const struct tb_ubc_source *src)
{
	unsigned int k;
	int ret;

	if (ubc_index + ubc_count > TB_UBC_MAX) {
		pr_err("ubc_index %u out of range (0..%u for %u controller(s))\n",
		       ubc_index, TB_UBC_MAX - ubc_count, ubc_count);
		return -EINVAL;
	}
	for (k = 0; k < ubc_count; k++) {
		if (!tb_ubc_devname_valid(ubc_dev[k])) {
			pr_err("ubc_dev \"%s\" is not a directory name (1..%d characters, no '/')\n",
			       ubc_dev[k], TB_UBC_DEV_MAX);
			return -EINVAL;
		}
	}
	tb_src = src;
	ret = bus_register(&tb_ub_bus);
	if (ret)
		return ret;
	tb_ub_bus_registered = true;
	for (k = 0; k < ubc_count; k++) {
		ret = tb_ubc_add(ubc_index, k, ubc_dev[k]);
		if (ret) {
			tb_ubc_exit();
			return ret;
		}
	}
	return 0;
}

void tb_ubc_exit(void)
{
	unsigned int k;

	for (k = 0; k < TB_UBC_MAX; k++)
		tb_ubc_del(k);
	if (tb_ub_bus_registered)
		bus_unregister(&tb_ub_bus);
	tb_ub_bus_registered = false;
}
