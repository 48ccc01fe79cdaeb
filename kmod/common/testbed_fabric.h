/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The testbed's emulated UB fabric as a guest sees it, shared by the
 * emulated driver (obmm_emu) and the compat layer the real driver runs on
 * (ub_compat): one copy of the layout (docs/testbed.md, "The emulated
 * fabric"), of the UBA encoding and of the window discovery.
 *
 * Every node of an N-node cluster sees, as ivshmem-plain PCI devices on
 * bus 0, one window per node at slot TB_FABRIC_WIN_SLOT0 + j (BAR2 = node
 * j's whole RAM file, its own included for loopback) and the shared
 * control region at slot TB_FABRIC_CTL_SLOT.  A window is the UB memory
 * decoder, prefilled: byte P of node j is at window[j].base + P.
 */
#ifndef TESTBED_FABRIC_H
#define TESTBED_FABRIC_H

#include <linux/bits.h>
#include <linux/kobject.h>
#include <linux/nodemask.h>
#include <linux/types.h>

#define TB_FABRIC_MAX_NODES		8

/*
 * Where a node's RAM, and so offset 0 of its RAM file (and of every
 * window onto it), sits in its physical address space: 0 on QEMU's q35,
 * the RAM base of QEMU's arm64 `virt` machine (hw/arm/virt.c, VIRT_MEM)
 * on arm64 (pylib/obmm/testbed/arch.py, ram_base).  Window offset
 * o of node j holds node j's physical address TB_FABRIC_RAM_BASE + o.
 */
#ifdef CONFIG_ARM64
#define TB_FABRIC_RAM_BASE		((phys_addr_t)0x40000000)
#else
#define TB_FABRIC_RAM_BASE		((phys_addr_t)0)
#endif

/*
 * A spare (remote) NUMA node, with neither memory nor CPUs: what
 * openEuler's numa_remote= keeps offline until OBMM hot-adds borrowed
 * memory, and an x86 node booted with the testbed's SRAT is.  arm64's
 * kernel onlines every node of the device tree at boot, memory-less
 * (pylib/obmm/testbed/vm/numa.py), so online alone does not tell.
 */
static inline bool tb_node_unpopulated(int nid)
{
	return !node_online(nid) ||
	       (!node_state(nid, N_MEMORY) && !node_state(nid, N_CPU));
}

/*
 * UBA of an export: bit 48 set (so a UBA is never 0), exporter node id in
 * bits 40..47, exporter physical address in bits 0..39.  An importer on
 * node B reaches it at window[node].base + pa - TB_FABRIC_RAM_BASE
 * (pylib/obmm/decoder.py; windows/<node>/remote_base in sysfs).
 * TB_UBA_SCATTERED marks memory that no window reaches in one piece: the
 * decoder refuses such a UBA instead of resolving it to the wrong bytes.
 */
#define TB_UBA_VALID			BIT_ULL(48)
#define TB_UBA_SCATTERED		BIT_ULL(49)
#define TB_UBA_NODE_SHIFT		40
#define TB_UBA_NODE_MASK		GENMASK_ULL(47, 40)
#define TB_UBA_PA_MASK			GENMASK_ULL(39, 0)

static inline u64 tb_uba_make(int node, phys_addr_t pa)
{
	return TB_UBA_VALID | ((u64)node << TB_UBA_NODE_SHIFT) |
	       ((u64)pa & TB_UBA_PA_MASK);
}

struct pci_dev;
struct resource;

struct tb_fabric_window {
	bool present;
	phys_addr_t base;
	u64 size;
	struct resource *res;	/* the BAR in iomem */
};

/* What one guest sees of the fabric, found by tb_fabric_probe(). */
struct tb_fabric {
	struct pci_dev *win_pdev[TB_FABRIC_MAX_NODES];
	struct tb_fabric_window win[TB_FABRIC_MAX_NODES];
	struct pci_dev *ctl_pdev;
	phys_addr_t ctl_base;
	u64 ctl_size;
	/* the windows/ sysfs directory, when tb_fabric_sysfs_add() made it */
	struct kobject *windows_kobj;
	struct kobject *win_kobj[TB_FABRIC_MAX_NODES];
};

void tb_fabric_probe(struct tb_fabric *fab);
void tb_fabric_release(struct tb_fabric *fab);
int tb_fabric_window_node(const struct tb_fabric *fab, phys_addr_t start,
			  u64 len, u64 *offset);
int tb_fabric_sysfs_add(struct tb_fabric *fab, struct kobject *parent);
void tb_fabric_sysfs_remove(struct tb_fabric *fab);

#endif /* TESTBED_FABRIC_H */
