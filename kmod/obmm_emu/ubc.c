// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: the emulated UB bus controllers, with the attributes the real
 * UB bus prints for them (drivers/ub/ubus/sysfs.c) and that libobmm's
 * vendor adaptor reads:
 *
 *   /sys/devices/ub_bus_controller<ubc_index + k>/<ubc_dev[k]>/
 *       eid %u, primary_cna %#06x, ummu_map %#04x, numa %#04x (proximity
 *       domain), ubc %#05x (the controller's entity number), upi, guid,
 *       entity_idx, class_code, type, vendor, device
 *   /sys/bus/ub/{ub_feature,cluster,instance}
 *
 * One controller per ubc_dev name, k = 0, 1, ...; the testbed loads two,
 * as UB hosts have (ub_bus_controller0/00001, ub_bus_controller1/00002),
 * and a program that hard-codes its host's path runs unchanged once the
 * module is loaded with that name.  Controller 0 has the node's CNA and
 * EID (the control region's); controller k the next ones out of the
 * fabric's use (obmm_ubc_cna()).  An IMPORT's scna may be any of them.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/device.h>
#include <linux/err.h>
#include <linux/kernel.h>
#include <linux/moduleparam.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/sysfs.h>

#include "fabric.h"
#include "pool.h"
#include "ubc.h"

#define OBMM_UBC_PREFIX		"ub_bus_controller"
/* libobmm's vendor adaptor looks at ub_bus_controller0..7. */
#define OBMM_UBC_MAX		8
/* A sysfs directory name of a controller's device: short, no '/'. */
#define OBMM_UBC_DEV_MAX	32
#define OBMM_UBC_UMMU_MAP	0
/*
 * CNAs and EIDs of controllers past the first: node CNAs and EIDs are
 * node_id + 1 (1..8, fabric.c); controller k of a node adds k times this.
 */
#define OBMM_UBC_ID_STRIDE	0x100
/* Entity type of a bus controller (the real guid's type field). */
#define OBMM_UBC_ENTITY_TYPE	0x1
/*
 * The guid's other fields (drivers/ub/ubus's struct ub_guid): the vendor
 * is Huawei's UB vendor id (openEuler's QEMU UB model, hw/ub/hisi/ubc.h
 * VENDER_ID_HUAWEI); no public source gives a controller's device id or
 * class code: 0.  The sequence number is the controller's EID (unique in
 * the fabric).
 */
#define OBMM_UBC_VENDOR		0xcc08
#define OBMM_UBC_DEVICE		0x0
#define OBMM_UBC_CLASS_CODE	0x0
#define OBMM_UBC_GUID_VERSION	0x0

/* The UB bus's feature bits (include/ub/ubus/ubus.h of OLK). */
#define OBMM_UB_MEM_BORROW_NC	BIT_ULL(0)
#define OBMM_UB_MEM_BORROW_CC	BIT_ULL(1)
#define OBMM_UB_MEM_SHARE_NC	BIT_ULL(2)
#define OBMM_UB_MEM_SHARE_CC	BIT_ULL(3)
#define OBMM_UB_URMA_FIRST_BIT	16

static unsigned int obmm_ubc_index;
module_param_named(ubc_index, obmm_ubc_index, uint, 0444);
MODULE_PARM_DESC(ubc_index,
		 "Index i of the first controller's /sys/devices/ub_bus_controller<i>/ (0..7, default 0)");

static char *obmm_ubc_devnames[OBMM_UBC_MAX] = { "00001" };
static unsigned int obmm_ubc_count = 1;
module_param_array_named(ubc_dev, obmm_ubc_devnames, charp, &obmm_ubc_count,
			 0444);
MODULE_PARM_DESC(ubc_dev,
		 "Device directory name of each controller under ub_bus_controller<ubc_index + k>/ (default \"00001\": one controller)");

struct obmm_ubc {
	struct device *root;	/* ub_bus_controller<i> */
	struct device dev;	/* its entity */
	unsigned int k;
};

static struct obmm_ubc *obmm_ubcs[OBMM_UBC_MAX];
static bool obmm_ub_bus_registered;

static struct obmm_ubc *to_obmm_ubc(struct device *dev)
{
	return container_of(dev, struct obmm_ubc, dev);
}

static u32 obmm_ubc_cna(unsigned int k)
{
	return obmm_fabric_cna() + k * OBMM_UBC_ID_STRIDE;
}

static u32 obmm_ubc_eid(unsigned int k)
{
	return obmm_fabric_eid() + k * OBMM_UBC_ID_STRIDE;
}

/* Whether @cna is one of this node's controllers' (ub_mem_get_numa_id()). */
bool obmm_ubc_known_cna(u32 cna)
{
	unsigned int k;

	for (k = 0; k < obmm_ubc_count; k++)
		if (cna == obmm_ubc_cna(k))
			return true;
	return false;
}

/* The entity number: the device name read as hex, as ubus names it. */
static unsigned int obmm_ubc_uent_num(const struct obmm_ubc *c)
{
	unsigned int num;

	return kstrtouint(dev_name(&c->dev), 16, &num) ? c->k + 1 : num;
}

/*
 * The controller's proximity domain: the pool's node, whose SRAT domain
 * has the same number in the testbed's guests (node_to_pxm() is not for
 * modules).
 */
static int obmm_ubc_pxm(void)
{
	return obmm_pool_nid();
}

static ssize_t eid_show(struct device *dev, struct device_attribute *attr,
			char *buf)
{
	return sysfs_emit(buf, "%u\n", obmm_ubc_eid(to_obmm_ubc(dev)->k));
}

static DEVICE_ATTR_RO(eid);

static ssize_t primary_cna_show(struct device *dev,
				struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%#06x\n", obmm_ubc_cna(to_obmm_ubc(dev)->k));
}

static DEVICE_ATTR_RO(primary_cna);

static ssize_t ummu_map_show(struct device *dev,
			     struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%#04x\n", OBMM_UBC_UMMU_MAP);
}

static DEVICE_ATTR_RO(ummu_map);

static ssize_t numa_show(struct device *dev, struct device_attribute *attr,
			 char *buf)
{
	return sysfs_emit(buf, "%#04x\n", obmm_ubc_pxm());
}

static DEVICE_ATTR_RO(numa);

static ssize_t ubc_show(struct device *dev, struct device_attribute *attr,
			char *buf)
{
	return sysfs_emit(buf, "%#05x\n", obmm_ubc_uent_num(to_obmm_ubc(dev)));
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
	return sysfs_emit(buf, "%#x\n", OBMM_UBC_ENTITY_TYPE);
}

static DEVICE_ATTR_RO(type);

static ssize_t upi_show(struct device *dev, struct device_attribute *attr,
			char *buf)
{
	return sysfs_emit(buf, "%#04x\n", 0);
}

static DEVICE_ATTR_RO(upi);

/* ubus's sysfs.c: vendor and device "%#06x" (guid fields), class_code "%#06x". */
static ssize_t vendor_show(struct device *dev, struct device_attribute *attr,
			   char *buf)
{
	return sysfs_emit(buf, "%#06x\n", OBMM_UBC_VENDOR);
}

static DEVICE_ATTR_RO(vendor);

static ssize_t device_show(struct device *dev, struct device_attribute *attr,
			   char *buf)
{
	return sysfs_emit(buf, "%#06x\n", OBMM_UBC_DEVICE);
}

static DEVICE_ATTR_RO(device);

static ssize_t class_code_show(struct device *dev,
			       struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%#06x\n", OBMM_UBC_CLASS_CODE);
}

static DEVICE_ATTR_RO(class_code);

/* ub_show_guid(): vendor-device-version-type-reserved-seq_num. */
static ssize_t guid_show(struct device *dev, struct device_attribute *attr,
			 char *buf)
{
	return sysfs_emit(buf, "%04x-%04x-%01x-%01x-%06x-%016llx\n",
			  OBMM_UBC_VENDOR, OBMM_UBC_DEVICE,
			  OBMM_UBC_GUID_VERSION, OBMM_UBC_ENTITY_TYPE, 0,
			  (unsigned long long)obmm_ubc_eid(to_obmm_ubc(dev)->k));
}

static DEVICE_ATTR_RO(guid);

static struct attribute *obmm_ubc_attrs[] = {
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

ATTRIBUTE_GROUPS(obmm_ubc);

/* ---- /sys/bus/ub ---- */

static u64 obmm_ub_feature(void)
{
	if (!obmm_fabric_enabled())
		return 0;
	return OBMM_UB_MEM_BORROW_NC | OBMM_UB_MEM_BORROW_CC |
	       OBMM_UB_MEM_SHARE_NC | OBMM_UB_MEM_SHARE_CC;
}

static const char * const obmm_ub_feature_names[] = {
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

/* The feature bit of obmm_ub_feature_names[i]. */
static u64 obmm_ub_feature_bit(unsigned int i)
{
	return i < 4 ? BIT_ULL(i) : BIT_ULL(OBMM_UB_URMA_FIRST_BIT + i - 4);
}

/* Bus attributes are shown for a const bus type from 6.4 on. */
#ifdef OBMM_HAVE_CONST_BUS_ATTR
#define OBMM_BUS_CONST	const
#else
#define OBMM_BUS_CONST
#endif

static ssize_t ub_feature_show(OBMM_BUS_CONST struct bus_type *bus, char *buf)
{
	u64 f = obmm_ub_feature();
	ssize_t n;
	unsigned int i;

	n = sysfs_emit(buf, "%#.16llx\n", f);
	for (i = 0; i < ARRAY_SIZE(obmm_ub_feature_names); i++)
		n += sysfs_emit_at(buf, n, "%s%c\n", obmm_ub_feature_names[i],
				   f & obmm_ub_feature_bit(i) ? '+' : '-');
	return n;
}

static BUS_ATTR_RO(ub_feature);

static ssize_t cluster_show(OBMM_BUS_CONST struct bus_type *bus, char *buf)
{
	return sysfs_emit(buf, "%d\n", 0);
}

static BUS_ATTR_RO(cluster);

/* No bus instance is emulated: the header of an empty list. */
static ssize_t instance_show(OBMM_BUS_CONST struct bus_type *bus, char *buf)
{
	return sysfs_emit(buf, "count %#x, from %#x, show %#x\n", 0, 0, 0);
}

static BUS_ATTR_RO(instance);

static struct attribute *obmm_ub_bus_attrs[] = {
	&bus_attr_instance.attr,
	&bus_attr_cluster.attr,
	&bus_attr_ub_feature.attr,
	NULL,
};

ATTRIBUTE_GROUPS(obmm_ub_bus);

static struct bus_type obmm_ub_bus = {
	.name = "ub",
	.bus_groups = obmm_ub_bus_groups,
};

/* The bus's feature bits, as ub_feature_get() gives them. */
u64 obmm_ubc_feature(void)
{
	return obmm_ub_feature();
}

/* ---- the controllers ---- */

static void obmm_ubc_release(struct device *dev)
{
	kfree(to_obmm_ubc(dev));
}

static bool obmm_ubc_devname_valid(const char *name)
{
	size_t len = strnlen(name, OBMM_UBC_DEV_MAX + 1);

	return len && len <= OBMM_UBC_DEV_MAX && !strchr(name, '/') &&
	       strcmp(name, ".") && strcmp(name, "..");
}

static void obmm_ubc_del(unsigned int k)
{
	struct obmm_ubc *c = obmm_ubcs[k];
	struct device *root;

	if (!c)
		return;
	obmm_ubcs[k] = NULL;
	root = c->root;
	device_unregister(&c->dev);
	root_device_unregister(root);
}

static int obmm_ubc_add(unsigned int k)
{
	char root[sizeof(OBMM_UBC_PREFIX) + 3];
	struct obmm_ubc *c;
	int ret;

	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c)
		return -ENOMEM;
	snprintf(root, sizeof(root), OBMM_UBC_PREFIX "%u", obmm_ubc_index + k);
	c->root = root_device_register(root);
	if (IS_ERR(c->root)) {
		ret = PTR_ERR(c->root);
		kfree(c);
		return ret;
	}
	c->k = k;
	device_initialize(&c->dev);
	c->dev.parent = c->root;
	c->dev.bus = &obmm_ub_bus;
	c->dev.groups = obmm_ubc_groups;
	c->dev.release = obmm_ubc_release;
	ret = dev_set_name(&c->dev, "%s", obmm_ubc_devnames[k]);
	if (!ret)
		ret = device_add(&c->dev);
	if (ret) {
		root_device_unregister(c->root);
		put_device(&c->dev);
		return ret;
	}
	obmm_ubcs[k] = c;
	return 0;
}

int obmm_ubc_init(void)
{
	unsigned int k;
	int ret;

	if (obmm_ubc_index + obmm_ubc_count > OBMM_UBC_MAX) {
		pr_err("ubc_index %u out of range (0..%u for %u controller(s))\n",
		       obmm_ubc_index, OBMM_UBC_MAX - obmm_ubc_count,
		       obmm_ubc_count);
		return -EINVAL;
	}
	for (k = 0; k < obmm_ubc_count; k++) {
		if (!obmm_ubc_devname_valid(obmm_ubc_devnames[k])) {
			pr_err("ubc_dev \"%s\" is not a directory name (1..%d characters, no '/')\n",
			       obmm_ubc_devnames[k], OBMM_UBC_DEV_MAX);
			return -EINVAL;
		}
	}
	ret = bus_register(&obmm_ub_bus);
	if (ret)
		return ret;
	obmm_ub_bus_registered = true;
	for (k = 0; k < obmm_ubc_count; k++) {
		ret = obmm_ubc_add(k);
		if (ret) {
			obmm_ubc_exit();
			return ret;
		}
	}
	return 0;
}

void obmm_ubc_exit(void)
{
	unsigned int k;

	for (k = 0; k < OBMM_UBC_MAX; k++)
		obmm_ubc_del(k);
	if (obmm_ub_bus_registered)
		bus_unregister(&obmm_ub_bus);
	obmm_ub_bus_registered = false;
}
