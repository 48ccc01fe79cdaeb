// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: /sys/kernel/obmm_emu/, what only the emulator has: this
 * node, its pool, the control region, the fabric's windows, the revoked
 * imports.  It reads the layers below it and is brought up by core.c.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kernel.h>
#include <linux/kobject.h>
#include <linux/sysfs.h>

#include "emu_sysfs.h"
#include "fabric.h"
#include "import.h"
#include "pool.h"

/* ---- /sys/kernel/obmm_emu/ ---- */

/* A world-readable attribute printing one emulator value. */
#define OBMM_EMU_ATTR(_name, _fmt, _value)				\
static ssize_t _name##_show(struct kobject *kobj,			\
			    struct kobj_attribute *attr, char *buf)	\
{									\
	return sysfs_emit(buf, _fmt "\n", _value);			\
}									\
static struct kobj_attribute obmm_emu_##_name##_attr = __ATTR_RO(_name)

OBMM_EMU_ATTR(node_id, "%d", obmm_emu_node_id);

OBMM_EMU_ATTR(cna, "0x%x", obmm_fabric_cna());

static ssize_t emu_eid_show(struct kobject *kobj, struct kobj_attribute *attr,
			    char *buf)
{
	return sysfs_emit(buf, "0x%x\n", obmm_fabric_eid());
}

static struct kobj_attribute obmm_emu_eid_attr =
	__ATTR(eid, 0444, emu_eid_show, NULL);

OBMM_EMU_ATTR(enabled, "%d", obmm_fabric_enabled());

/* A root-only attribute: a physical address (like /proc/iomem). */
#define OBMM_EMU_ADDR_ATTR(_name, _fmt, _value)				\
static ssize_t _name##_show(struct kobject *kobj,			\
			    struct kobj_attribute *attr, char *buf)	\
{									\
	return sysfs_emit(buf, _fmt "\n", _value);			\
}									\
static struct kobj_attribute obmm_emu_##_name##_attr =			\
	__ATTR_RO_MODE(_name, 0400)

OBMM_EMU_ADDR_ATTR(pool_base, "0x%llx", (u64)obmm_pool_base());

OBMM_EMU_ATTR(pool_size, "0x%llx", obmm_pool_size());

static ssize_t control_base_show(struct kobject *kobj,
				 struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "0x%llx\n", (u64)obmm_fabric_ctl_base());
}

static struct kobj_attribute obmm_emu_ctl_base_attr =
	__ATTR_RO_MODE(control_base, 0400);

static ssize_t control_size_show(struct kobject *kobj,
				 struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "0x%llx\n", obmm_fabric_ctl_size());
}

static struct kobj_attribute obmm_emu_ctl_size_attr =
	__ATTR_RO(control_size);

static ssize_t revoked_show(struct kobject *kobj, struct kobj_attribute *attr,
			    char *buf)
{
	return obmm_imports_show_revoked(buf);
}

static struct kobj_attribute obmm_emu_revoked_attr = __ATTR_RO(revoked);

OBMM_EMU_ATTR(quarantined, "0x%llx", obmm_pool_quarantined());

static struct attribute *obmm_emu_attrs[] = {
	&obmm_emu_node_id_attr.attr,
	&obmm_emu_cna_attr.attr,
	&obmm_emu_eid_attr.attr,
	&obmm_emu_enabled_attr.attr,
	&obmm_emu_pool_base_attr.attr,
	&obmm_emu_pool_size_attr.attr,
	&obmm_emu_ctl_base_attr.attr,
	&obmm_emu_ctl_size_attr.attr,
	&obmm_emu_revoked_attr.attr,
	&obmm_emu_quarantined_attr.attr,
	NULL,
};

static const struct attribute_group obmm_emu_group = {
	.attrs = obmm_emu_attrs,
};

static struct kobject *obmm_emu_kobj;

static void obmm_sysfs_emu_exit(void)
{
	tb_fabric_sysfs_remove(obmm_fabric_tb());
	if (obmm_emu_kobj)
		sysfs_remove_group(obmm_emu_kobj, &obmm_emu_group);
	kobject_put(obmm_emu_kobj);
	obmm_emu_kobj = NULL;
}

static int obmm_sysfs_emu_init(void)
{
	int ret;

	obmm_emu_kobj = kobject_create_and_add(OBMM_EMU_NAME, kernel_kobj);
	if (!obmm_emu_kobj)
		return -ENOMEM;
	ret = sysfs_create_group(obmm_emu_kobj, &obmm_emu_group);
	if (ret) {
		kobject_put(obmm_emu_kobj);
		obmm_emu_kobj = NULL;
		return ret;
	}
	/* windows/<node>/{node,base,size} */
	ret = tb_fabric_sysfs_add(obmm_fabric_tb(), obmm_emu_kobj);
	if (ret)
		goto err;
	return 0;
err:
	obmm_sysfs_emu_exit();
	return ret;
}

int obmm_sysfs_init(void)
{
	return obmm_sysfs_emu_init();
}

void obmm_sysfs_exit(void)
{
	obmm_sysfs_emu_exit();
}
