// SPDX-License-Identifier: GPL-2.0
/*
 * ub_compat: the UMMU's token devices.  On a UB host the driver gets a
 * device with a token id from the UMMU core, maps an export's pages
 * through that device's DMA ops, and hands the resulting IOVA to
 * importers as the export's UBA; the UMMU checks an importer's token and
 * translates UBA to the exporter's pages.
 *
 * Here a token device is a plain struct device whose DMA ops give the
 * testbed's UBA (kmod/common/testbed_fabric.h): the exporter's node and
 * physical address, which an importer reaches through its window onto that
 * node.  So the UBA space is the exporter's physical memory, not an IOVA
 * space: memory that is not physically contiguous in the order of the
 * scatterlist has no UBA a window reaches, and is marked TB_UBA_SCATTERED
 * (the testbed's decoder refuses it).  Tokens are allocated, never checked.
 *
 * What this node's token devices map is remembered until unmapped: the
 * decoder check (bus.c) reaches this node's own window only there, as a
 * UMMU lets nothing else of the exporter's memory be reached.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/device.h>
#include <linux/dma-map-ops.h>
#include <linux/dma-mapping.h>
#include <linux/idr.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/spinlock.h>

#include <linux/ummu_core.h>

#include "ub_compat.h"
#include "ub_compat_priv.h"

/* UB token ids are 20 bits wide; 0 is never handed out. */
#define UB_COMPAT_TID_MIN	1
#define UB_COMPAT_TID_MAX	(BIT(20) - 1)

struct ub_compat_tdev {
	struct device dev;
	u32 tid;
};

static DEFINE_IDA(ub_compat_tids);

/* One physically contiguous range a token device maps (an export). */
struct ub_compat_mapped {
	struct list_head link;
	phys_addr_t pa;
	u64 len;
};

static LIST_HEAD(ub_compat_mapped_list);
static DEFINE_SPINLOCK(ub_compat_mapped_lock);

static bool ub_compat_mapped_add(phys_addr_t pa, u64 len)
{
	struct ub_compat_mapped *m = kmalloc(sizeof(*m), GFP_ATOMIC);

	if (!m)
		return false;
	m->pa = pa;
	m->len = len;
	spin_lock(&ub_compat_mapped_lock);
	list_add(&m->link, &ub_compat_mapped_list);
	spin_unlock(&ub_compat_mapped_lock);
	return true;
}

static void ub_compat_mapped_del(phys_addr_t pa, u64 len)
{
	struct ub_compat_mapped *m, *found = NULL;

	spin_lock(&ub_compat_mapped_lock);
	list_for_each_entry(m, &ub_compat_mapped_list, link) {
		if (m->pa == pa && m->len == len) {
			found = m;
			list_del(&m->link);
			break;
		}
	}
	spin_unlock(&ub_compat_mapped_lock);
	kfree(found);
}

/* Whether one range a token device maps covers [pa, pa + len). */
static bool ub_compat_ummu_maps(phys_addr_t pa, u64 len)
{
	struct ub_compat_mapped *m;
	bool covered = false;

	spin_lock(&ub_compat_mapped_lock);
	list_for_each_entry(m, &ub_compat_mapped_list, link) {
		if (pa >= m->pa && pa - m->pa < m->len &&
		    len <= m->len - (pa - m->pa)) {
			covered = true;
			break;
		}
	}
	spin_unlock(&ub_compat_mapped_lock);
	return covered;
}

/*
 * ub_memory_validate_pa(): whether [pa_start, pa_end] is UB memory the
 * decoder of controller @scna maps, for a cacheable or a non-cacheable
 * access (the vendor's mem_validate_pa; here beside the UMMU whose mappings it reads).  Here: the range lies in one
 * window; windows are RAM files, valid for both kinds of access.  In this
 * node's own window only what its UMMU maps (an export) is reached, as on
 * a host, not the rest of its RAM (its kernel's).
 */
bool ub_memory_validate_pa(u32 scna, u64 pa_start, u64 pa_end, bool cacheable)
{
	u64 len, off;
	int node;

	if (scna != ub_compat_cna()) {
		pr_err("No ubc has cna of %u\n", scna);
		return false;
	}
	if (pa_end < pa_start)
		return false;
	len = pa_end - pa_start + 1;
	node = tb_fabric_window_node(ub_compat_fabric(), pa_start, len, &off);
	if (node < 0)
		return false;
	if (node == ub_compat_node_id && !ub_compat_ummu_maps(off, len)) {
		pr_err("[%#llx, %#llx] of this node's window is not exported\n",
		       pa_start, pa_end);
		return false;
	}
	return true;
}
EXPORT_SYMBOL_GPL(ub_memory_validate_pa);

static u64 ub_compat_uba(phys_addr_t pa, bool scattered)
{
	return tb_uba_make(ub_compat_node_id, pa) |
	       (scattered ? TB_UBA_SCATTERED : 0);
}

static int ub_compat_ummu_map_sg(struct device *dev, struct scatterlist *sgl,
				 int nents, enum dma_data_direction dir,
				 unsigned long attrs)
{
	struct scatterlist *sg;
	phys_addr_t first = sg_phys(sgl);
	bool scattered = false;
	u64 offset = 0, uba;
	int i;

	for_each_sg(sgl, sg, nents, i) {
		if (sg_phys(sg) != first + offset)
			scattered = true;
		ub_compat_pool_mapped(sg_phys(sg), sg->length);
		offset += sg->length;
	}
	/* A scattered UBA reaches nothing (the decoder refuses it). */
	if (!scattered && !ub_compat_mapped_add(first, offset))
		return 0;
	uba = ub_compat_uba(first, scattered);
	offset = 0;
	for_each_sg(sgl, sg, nents, i) {
		sg->dma_address = uba + offset;
		sg_dma_len(sg) = sg->length;
		offset += sg->length;
	}
	return nents;
}

static void ub_compat_ummu_unmap_sg(struct device *dev,
				    struct scatterlist *sgl, int nents,
				    enum dma_data_direction dir,
				    unsigned long attrs)
{
	struct scatterlist *sg;
	u64 len = 0;
	int i;

	for_each_sg(sgl, sg, nents, i)
		len += sg->length;
	ub_compat_mapped_del(sg_phys(sgl), len);
}

static dma_addr_t ub_compat_ummu_map_page(struct device *dev,
					  struct page *page,
					  unsigned long offset, size_t size,
					  enum dma_data_direction dir,
					  unsigned long attrs)
{
	if (!ub_compat_mapped_add(page_to_phys(page) + offset, size))
		return DMA_MAPPING_ERROR;
	return ub_compat_uba(page_to_phys(page) + offset, false);
}

static void ub_compat_ummu_unmap_page(struct device *dev, dma_addr_t addr,
				      size_t size,
				      enum dma_data_direction dir,
				      unsigned long attrs)
{
	ub_compat_mapped_del(addr & TB_UBA_PA_MASK, size);
}

static const struct dma_map_ops ub_compat_ummu_ops = {
	.map_sg = ub_compat_ummu_map_sg,
	.unmap_sg = ub_compat_ummu_unmap_sg,
	.map_page = ub_compat_ummu_map_page,
	.unmap_page = ub_compat_ummu_unmap_page,
};

static void ub_compat_tdev_release(struct device *dev)
{
	struct ub_compat_tdev *tdev = container_of(dev, struct ub_compat_tdev,
						   dev);

	ida_free(&ub_compat_tids, tdev->tid);
	kfree(tdev);
}

/*
 * ummu_core_alloc_tdev(): a token device for @attr, its token id in *ptid
 * (the one asked for when *ptid is not UMMU_INVALID_TID); NULL on failure.
 * @attr's vendor data configures the real UMMU; here it is not used.
 */
struct device *ummu_core_alloc_tdev(struct tdev_attr *attr, u32 *ptid)
{
	struct ub_compat_tdev *tdev;
	int tid;

	if (!ptid || !attr) {
		pr_err("invalid param\n");
		return NULL;
	}
	if (*ptid != UMMU_INVALID_TID)
		tid = ida_alloc_range(&ub_compat_tids, *ptid, *ptid, GFP_KERNEL);
	else
		tid = ida_alloc_range(&ub_compat_tids, UB_COMPAT_TID_MIN,
				      UB_COMPAT_TID_MAX, GFP_KERNEL);
	if (tid < 0)
		return NULL;
	tdev = kzalloc(sizeof(*tdev), GFP_KERNEL);
	if (!tdev) {
		ida_free(&ub_compat_tids, tid);
		return NULL;
	}
	tdev->tid = tid;
	device_initialize(&tdev->dev);
	tdev->dev.release = ub_compat_tdev_release;
	tdev->dev.coherent_dma_mask = DMA_BIT_MASK(64);
	tdev->dev.dma_mask = &tdev->dev.coherent_dma_mask;
	set_dma_ops(&tdev->dev, &ub_compat_ummu_ops);
	if (dev_set_name(&tdev->dev, "ummu_tdev%d", tid)) {
		put_device(&tdev->dev);
		return NULL;
	}
	*ptid = tid;
	return &tdev->dev;
}
EXPORT_SYMBOL_GPL(ummu_core_alloc_tdev);

/* ummu_core_free_tdev(): drop a token device; its token id is free again. */
int ummu_core_free_tdev(struct device *dev)
{
	put_device(dev);
	return 0;
}
EXPORT_SYMBOL_GPL(ummu_core_free_tdev);

void ub_compat_ummu_exit(void)
{
	struct ub_compat_mapped *m, *tmp;

	list_for_each_entry_safe(m, tmp, &ub_compat_mapped_list, link)
		kfree(m);
	INIT_LIST_HEAD(&ub_compat_mapped_list);
	ida_destroy(&ub_compat_tids);
}
