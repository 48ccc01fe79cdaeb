// SPDX-License-Identifier: GPL-2.0
/*
 * The testbed fabric's windows and control region: found on the PCI bus,
 * looked up by address, and published as <parent>/windows/<node>/{node,
 * base,size} (what pylib/obmm/decoder.py and the guest tests read).  Built
 * into each module that needs it (obmm_emu, ub_compat), which are never
 * loaded together.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kernel.h>
#include <linux/pci.h>
#include <linux/sysfs.h>

#include "testbed_fabric.h"

#define TB_FABRIC_IVSHMEM_VENDOR	0x1af4
#define TB_FABRIC_IVSHMEM_DEVICE	0x1110
#define TB_FABRIC_BAR			2
#define TB_FABRIC_CTL_SLOT		0x0f
#define TB_FABRIC_WIN_SLOT0		0x10
/* "0".."7" plus NUL */
#define TB_FABRIC_WIN_NAME_LEN		4

static void tb_fabric_add(struct tb_fabric *fab, struct pci_dev *pdev)
{
	unsigned int slot = PCI_SLOT(pdev->devfn);
	phys_addr_t base = pci_resource_start(pdev, TB_FABRIC_BAR);
	u64 size = pci_resource_len(pdev, TB_FABRIC_BAR);
	int node;

	if (pci_domain_nr(pdev->bus) || pdev->bus->number ||
	    PCI_FUNC(pdev->devfn) || !size)
		return;
	/* A BAR the PCI core could not place is no window. */
	if (!base || pci_resource_flags(pdev, TB_FABRIC_BAR) & IORESOURCE_UNSET) {
		pci_warn(pdev, "BAR%d unassigned: ignored\n", TB_FABRIC_BAR);
		return;
	}
	if (slot == TB_FABRIC_CTL_SLOT && !fab->ctl_pdev) {
		if (pci_enable_device_mem(pdev))
			return;
		fab->ctl_pdev = pci_dev_get(pdev);
		fab->ctl_base = base;
		fab->ctl_size = size;
		return;
	}
	if (slot < TB_FABRIC_WIN_SLOT0 ||
	    slot >= TB_FABRIC_WIN_SLOT0 + TB_FABRIC_MAX_NODES)
		return;
	node = slot - TB_FABRIC_WIN_SLOT0;
	if (fab->win_pdev[node] || pci_enable_device_mem(pdev))
		return;
	fab->win_pdev[node] = pci_dev_get(pdev);
	fab->win[node].present = true;
	fab->win[node].base = base;
	fab->win[node].size = size;
	fab->win[node].res = &pdev->resource[TB_FABRIC_BAR];
}

/* Find every window and the control region (absent ones stay absent). */
void tb_fabric_probe(struct tb_fabric *fab)
{
	struct pci_dev *pdev = NULL;

	while ((pdev = pci_get_device(TB_FABRIC_IVSHMEM_VENDOR,
				      TB_FABRIC_IVSHMEM_DEVICE, pdev)))
		tb_fabric_add(fab, pdev);
}

void tb_fabric_release(struct tb_fabric *fab)
{
	int j;

	for (j = 0; j < TB_FABRIC_MAX_NODES; j++) {
		if (!fab->win_pdev[j])
			continue;
		pci_disable_device(fab->win_pdev[j]);
		pci_dev_put(fab->win_pdev[j]);
		fab->win_pdev[j] = NULL;
		fab->win[j].present = false;
		fab->win[j].res = NULL;
	}
	if (fab->ctl_pdev) {
		pci_disable_device(fab->ctl_pdev);
		pci_dev_put(fab->ctl_pdev);
		fab->ctl_pdev = NULL;
	}
}

/*
 * The node whose window holds all of [start, start + len), and (when
 * offset is not NULL) the physical address of start in that node's
 * memory (its offset in the window past TB_FABRIC_RAM_BASE); -1 when
 * no single window holds it.  A range is UB memory when it lies in one
 * decoder window.
 */
int tb_fabric_window_node(const struct tb_fabric *fab, phys_addr_t start,
			  u64 len, u64 *offset)
{
	const struct tb_fabric_window *w;
	int j;

	for (j = 0; j < TB_FABRIC_MAX_NODES; j++) {
		w = &fab->win[j];
		if (w->present && start >= w->base &&
		    start - w->base < w->size &&
		    len <= w->size - (start - w->base)) {
			if (offset)
				*offset = start - w->base + TB_FABRIC_RAM_BASE;
			return j;
		}
	}
	return -1;
}

/* The fabric whose windows/ directory is published (one per module). */
static const struct tb_fabric *tb_sysfs_fab;

static const struct tb_fabric_window *tb_kobj_window(struct kobject *kobj,
						     int *node)
{
	if (kstrtoint(kobject_name(kobj), 0, node) || *node < 0 ||
	    *node >= TB_FABRIC_MAX_NODES || !tb_sysfs_fab)
		return NULL;
	return &tb_sysfs_fab->win[*node];
}

static ssize_t base_show(struct kobject *kobj, struct kobj_attribute *attr,
			 char *buf)
{
	const struct tb_fabric_window *w;
	int node;

	w = tb_kobj_window(kobj, &node);
	return w ? sysfs_emit(buf, "0x%llx\n", (u64)w->base) : -ENODEV;
}

/* Physical addresses are root-only, like /proc/iomem. */
static struct kobj_attribute tb_win_base_attr = __ATTR_RO_MODE(base, 0400);

static ssize_t size_show(struct kobject *kobj, struct kobj_attribute *attr,
			 char *buf)
{
	const struct tb_fabric_window *w;
	int node;

	w = tb_kobj_window(kobj, &node);
	return w ? sysfs_emit(buf, "0x%llx\n", w->size) : -ENODEV;
}

static struct kobj_attribute tb_win_size_attr = __ATTR_RO(size);

static ssize_t node_show(struct kobject *kobj, struct kobj_attribute *attr,
			 char *buf)
{
	int node;

	if (!tb_kobj_window(kobj, &node))
		return -ENODEV;
	return sysfs_emit(buf, "%d\n", node);
}

static struct kobj_attribute tb_win_node_attr = __ATTR_RO(node);

/* The node's physical address at offset 0 of the window (its RAM base). */
static ssize_t remote_base_show(struct kobject *kobj,
				struct kobj_attribute *attr, char *buf)
{
	int node;

	if (!tb_kobj_window(kobj, &node))
		return -ENODEV;
	return sysfs_emit(buf, "0x%llx\n", (u64)TB_FABRIC_RAM_BASE);
}

static struct kobj_attribute tb_win_remote_base_attr =
	__ATTR_RO_MODE(remote_base, 0400);

static struct attribute *tb_win_attrs[] = {
	&tb_win_base_attr.attr,
	&tb_win_size_attr.attr,
	&tb_win_node_attr.attr,
	&tb_win_remote_base_attr.attr,
	NULL,
};

static const struct attribute_group tb_win_group = {
	.attrs = tb_win_attrs,
};

void tb_fabric_sysfs_remove(struct tb_fabric *fab)
{
	int j;

	for (j = 0; j < TB_FABRIC_MAX_NODES; j++) {
		if (!fab->win_kobj[j])
			continue;
		sysfs_remove_group(fab->win_kobj[j], &tb_win_group);
		kobject_put(fab->win_kobj[j]);
		fab->win_kobj[j] = NULL;
	}
	kobject_put(fab->windows_kobj);
	fab->windows_kobj = NULL;
	tb_sysfs_fab = NULL;
}

/* <parent>/windows/<node>/{node,base,size} for every present window. */
int tb_fabric_sysfs_add(struct tb_fabric *fab, struct kobject *parent)
{
	char name[TB_FABRIC_WIN_NAME_LEN];
	int j, ret;

	tb_sysfs_fab = fab;
	fab->windows_kobj = kobject_create_and_add("windows", parent);
	if (!fab->windows_kobj) {
		tb_sysfs_fab = NULL;
		return -ENOMEM;
	}
	for (j = 0; j < TB_FABRIC_MAX_NODES; j++) {
		if (!fab->win[j].present)
			continue;
		snprintf(name, sizeof(name), "%d", j);
		fab->win_kobj[j] = kobject_create_and_add(name,
							  fab->windows_kobj);
		if (!fab->win_kobj[j]) {
			ret = -ENOMEM;
			goto err;
		}
		ret = sysfs_create_group(fab->win_kobj[j], &tb_win_group);
		if (ret) {
			kobject_put(fab->win_kobj[j]);
			fab->win_kobj[j] = NULL;
			goto err;
		}
	}
	return 0;
err:
	tb_fabric_sysfs_remove(fab);
	return ret;
}
