// SPDX-License-Identifier: GPL-2.0
/*
 * ub_compat: this node's identity (module parameters node_id, cna, eid,
 * pool_base, pool_size), its fabric, and /sys/kernel/ub_compat/ (those
 * values and the fabric's windows/, the names obmm_emu uses for the same
 * things, so the testbed's decoder and the guest tests read either).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kobject.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/nodemask.h>
#include <linux/sysfs.h>

#include "ub_compat.h"
#include "ub_compat_priv.h"

int ub_compat_node_id;
module_param_named(node_id, ub_compat_node_id, int, 0444);
MODULE_PARM_DESC(node_id, "Fabric node id of this guest (0..7, default 0)");

static unsigned int cna;
module_param(cna, uint, 0444);
MODULE_PARM_DESC(cna, "Primary CNA of this node's UB controller (default node_id + 1)");

static unsigned int eid;
module_param(eid, uint, 0444);
MODULE_PARM_DESC(eid, "EID (first 32 bits) of this node's UB controller (default node_id + 1)");

static unsigned long pool_base;
module_param(pool_base, ulong, 0444);
MODULE_PARM_DESC(pool_base, "Physical base of the memory pfn_range_alloc() hands out (the RAM above mem=)");

static unsigned long pool_size;
module_param(pool_size, ulong, 0444);
MODULE_PARM_DESC(pool_size, "Size of that memory in bytes (0: no pool)");

static struct tb_fabric fabric;
static struct kobject *ub_compat_kobj;

u32 ub_compat_cna(void)
{
	return cna;
}

u32 ub_compat_eid(void)
{
	return eid;
}

struct tb_fabric *ub_compat_fabric(void)
{
	return &fabric;
}

/* The UB memory feature: this node reaches its own memory through the fabric. */
bool ub_compat_fabric_present(void)
{
	return fabric.win[ub_compat_node_id].present;
}

int ub_compat_controller_nid(void)
{
	return first_online_node;
}

unsigned long ub_compat_pool_base(void)
{
	return pool_base;
}

unsigned long ub_compat_pool_size(void)
{
	return pool_size;
}

/* Check node_id, default cna and eid from it, find the fabric's windows. */
int ub_compat_node_init(void)
{
	if (ub_compat_node_id < 0 || ub_compat_node_id >= TB_FABRIC_MAX_NODES) {
		pr_err("node_id %d out of range (0..%d)\n", ub_compat_node_id,
		       TB_FABRIC_MAX_NODES - 1);
		return -EINVAL;
	}
	if (!cna)
		cna = ub_compat_node_id + 1;
	if (!eid)
		eid = ub_compat_node_id + 1;

	tb_fabric_probe(&fabric);
	if (!ub_compat_fabric_present())
		pr_warn("no window onto this node's own memory: UB memory features absent\n");
	return 0;
}

void ub_compat_node_exit(void)
{
	tb_fabric_release(&fabric);
}

#define UB_COMPAT_ATTR(_name, _mode, _fmt, _value)			\
static ssize_t _name##_show(struct kobject *kobj,			\
			    struct kobj_attribute *attr, char *buf)	\
{									\
	return sysfs_emit(buf, _fmt "\n", _value);			\
}									\
static struct kobj_attribute ub_compat_##_name##_attr =			\
	__ATTR_RO_MODE(_name, _mode)

UB_COMPAT_ATTR(node_id, 0444, "%d", ub_compat_node_id);
UB_COMPAT_ATTR(cna, 0444, "0x%x", cna);
UB_COMPAT_ATTR(eid, 0444, "0x%x", eid);
/* Physical addresses are root-only, like /proc/iomem. */
UB_COMPAT_ATTR(pool_base, 0400, "0x%lx", pool_base);
UB_COMPAT_ATTR(pool_size, 0444, "0x%lx", pool_size);

static struct attribute *ub_compat_attrs[] = {
	&ub_compat_node_id_attr.attr,
	&ub_compat_cna_attr.attr,
	&ub_compat_eid_attr.attr,
	&ub_compat_pool_base_attr.attr,
	&ub_compat_pool_size_attr.attr,
	NULL,
};

static const struct attribute_group ub_compat_group = {
	.attrs = ub_compat_attrs,
};

void ub_compat_sysfs_exit(void)
{
	tb_fabric_sysfs_remove(&fabric);
	if (ub_compat_kobj)
		sysfs_remove_group(ub_compat_kobj, &ub_compat_group);
	kobject_put(ub_compat_kobj);
	ub_compat_kobj = NULL;
}

int ub_compat_sysfs_init(void)
{
	int ret;

	ub_compat_kobj = kobject_create_and_add(KBUILD_MODNAME, kernel_kobj);
	if (!ub_compat_kobj)
		return -ENOMEM;
	ret = sysfs_create_group(ub_compat_kobj, &ub_compat_group);
	if (ret) {
		kobject_put(ub_compat_kobj);
		ub_compat_kobj = NULL;
		return ret;
	}
	ret = tb_fabric_sysfs_add(&fabric, ub_compat_kobj);
	if (ret)
		ub_compat_sysfs_exit();
	return ret;
}
