// SPDX-License-Identifier: GPL-2.0
/*
 * ub_compat: memory-management pieces the driver uses that a stock kernel
 * does not export, or that OLK or arm64 provide differently.
 *
 * walk_page_range() is not exported: ub_compat_walk_page_range() is a page
 * table walker of our own for what the driver asks of it (pmd_entry,
 * pte_entry, hugetlb_entry, pte_hole and test_walk on VMAs under the mmap
 * lock), with the kernel walker's rules for those callbacks.
 *
 * split_vma() is not exported either, and cannot be rewritten outside the
 * kernel (it needs the VMA tree's internals).  The driver needs it for an
 * ownership update of part of a mapping.  The kernel's own function is
 * found once at load through a kprobe on its symbol (the only way a module
 * can look up an unexported function since kallsyms_lookup_name() stopped
 * being exported) and called directly; nothing is patched or hooked.  When
 * it cannot be found, a partial update fails with EOPNOTSUPP.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/hugetlb.h>
#include <linux/kprobes.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/notifier.h>
#include <linux/pagewalk.h>
#include <linux/smp.h>

#include <uapi/misc/hisi_soc_cache/hisi_soc_cache.h>

#include "ub_compat.h"
#include "ub_compat_priv.h"

/* ---- walk_page_range() ---- */

#ifndef UB_COMPAT_HAVE_PTE_MAP_OUT_OF_LINE
/* The PTE level: every entry of one page table, under its lock. */
static int walk_pte_range(pmd_t *pmd, unsigned long addr, unsigned long end,
			  struct mm_walk *walk)
{
	spinlock_t *ptl;	/* the page table's lock, held for the callbacks */
	pte_t *start, *pte;
	int err = 0;

	start = pte_offset_map_lock(walk->mm, pmd, addr, &ptl);
	for (pte = start; addr < end; pte++, addr += PAGE_SIZE) {
		err = walk->ops->pte_entry(pte, addr, addr + PAGE_SIZE, walk);
		if (err)
			break;
	}
	pte_unmap_unlock(start, ptl);
	return err;
}
#else
/*
 * The PTE level: pte_offset_map_lock() is out of line and not exported
 * since 6.5; apply_to_existing_page_range() calls back for every present
 * entry of the table under its lock (the driver skips empty ones anyway).
 */
static int walk_one_pte(pte_t *pte, unsigned long addr, void *data)
{
	struct mm_walk *walk = data;

	return walk->ops->pte_entry(pte, addr, addr + PAGE_SIZE, walk);
}

static int walk_pte_range(pmd_t *pmd, unsigned long addr, unsigned long end,
			  struct mm_walk *walk)
{
	return apply_to_existing_page_range(walk->mm, addr, end - addr,
					    walk_one_pte, walk);
}
#endif

static int walk_pmd_range(pud_t *pud, unsigned long addr, unsigned long end,
			  struct mm_walk *walk)
{
	const struct mm_walk_ops *ops = walk->ops;
	unsigned long next;
	pmd_t *pmd;
	int err = 0;

	pmd = pmd_offset(pud, addr);
	do {
again:
		next = pmd_addr_end(addr, end);
		if (pmd_none(*pmd)) {
			if (ops->pte_hole)
				err = ops->pte_hole(addr, next, 3, walk);
			if (err)
				break;
			continue;
		}
		walk->action = ACTION_SUBTREE;
		if (ops->pmd_entry)
			err = ops->pmd_entry(pmd, addr, next, walk);
		if (err)
			break;
		if (walk->action == ACTION_AGAIN)
			goto again;
		/* A huge entry is not split: only a pmd_entry sees it. */
		if (walk->action == ACTION_CONTINUE || !ops->pte_entry ||
		    pmd_leaf(*pmd) || !pmd_present(*pmd))
			continue;
		err = walk_pte_range(pmd, addr, next, walk);
		if (err)
			break;
	} while (pmd++, addr = next, addr != end);
	return err;
}

static int walk_pud_range(p4d_t *p4d, unsigned long addr, unsigned long end,
			  struct mm_walk *walk)
{
	const struct mm_walk_ops *ops = walk->ops;
	unsigned long next;
	pud_t *pud;
	int err = 0;

	pud = pud_offset(p4d, addr);
	do {
		next = pud_addr_end(addr, end);
		if (pud_none(*pud) || pud_leaf(*pud) || !pud_present(*pud)) {
			if (pud_none(*pud) && ops->pte_hole)
				err = ops->pte_hole(addr, next, 2, walk);
			if (err)
				break;
			continue;
		}
		err = walk_pmd_range(pud, addr, next, walk);
		if (err)
			break;
	} while (pud++, addr = next, addr != end);
	return err;
}

static int walk_pgd_range(unsigned long addr, unsigned long end,
			  struct mm_walk *walk)
{
	const struct mm_walk_ops *ops = walk->ops;
	unsigned long next, p4d_next;
	pgd_t *pgd;
	p4d_t *p4d;
	int err = 0;

	pgd = pgd_offset(walk->mm, addr);
	do {
		next = pgd_addr_end(addr, end);
		if (pgd_none(*pgd) || unlikely(pgd_bad(*pgd))) {
			if (ops->pte_hole)
				err = ops->pte_hole(addr, next, 0, walk);
			if (err)
				break;
			continue;
		}
		p4d = p4d_offset(pgd, addr);
		do {
			p4d_next = p4d_addr_end(addr, next);
			if (p4d_none(*p4d) || unlikely(p4d_bad(*p4d))) {
				if (ops->pte_hole)
					err = ops->pte_hole(addr, p4d_next, 1,
							    walk);
			} else {
				err = walk_pud_range(p4d, addr, p4d_next, walk);
			}
			if (err)
				break;
		} while (p4d++, addr = p4d_next, addr != next);
		if (err)
			break;
	} while (pgd++, addr = next, addr != end);
	return err;
}

/* huge_pte_offset() (not exported): the entry mapping a huge page at @addr. */
static pte_t *huge_entry(struct mm_struct *mm, unsigned long addr,
			 unsigned long sz)
{
	pgd_t *pgd = pgd_offset(mm, addr);
	p4d_t *p4d;
	pud_t *pud;

	if (!pgd_present(*pgd))
		return NULL;
	p4d = p4d_offset(pgd, addr);
	if (!p4d_present(*p4d))
		return NULL;
	pud = pud_offset(p4d, addr);
	if (sz == PUD_SIZE)
		return (pte_t *)pud;
	if (!pud_present(*pud))
		return NULL;
	return (pte_t *)pmd_offset(pud, addr);
}

static int walk_hugetlb_range(unsigned long addr, unsigned long end,
			      struct mm_walk *walk)
{
	struct hstate *h = hstate_vma(walk->vma);
	unsigned long hmask = huge_page_mask(h);
	unsigned long sz = huge_page_size(h);
	const struct mm_walk_ops *ops = walk->ops;
	unsigned long next;
	pte_t *pte;
	int err = 0;

	for (; addr < end; addr = next) {
		next = min(end, (addr & hmask) + sz);
		pte = huge_entry(walk->mm, addr & hmask, sz);
		if (pte)
			err = ops->hugetlb_entry(pte, hmask, addr, next, walk);
		else if (ops->pte_hole)
			err = ops->pte_hole(addr, next, -1, walk);
		if (err)
			break;
	}
	return err;
}

/* As the kernel walker: a PFN map is skipped unless test_walk says not. */
static int walk_test(unsigned long start, unsigned long end,
		     struct mm_walk *walk)
{
	const struct mm_walk_ops *ops = walk->ops;
	int err;

	if (ops->test_walk)
		return ops->test_walk(start, end, walk);
	if (walk->vma->vm_flags & VM_PFNMAP) {
		err = 1;
		if (ops->pte_hole)
			err = ops->pte_hole(start, end, -1, walk);
		return err ? err : 1;
	}
	return 0;
}

static int walk_vma_range(unsigned long start, unsigned long end,
			  struct mm_walk *walk)
{
	const struct mm_walk_ops *ops = walk->ops;
	int err;

	if (ops->pre_vma) {
		err = ops->pre_vma(start, end, walk);
		if (err)
			return err;
	}
	if (is_vm_hugetlb_page(walk->vma))
		err = ops->hugetlb_entry ? walk_hugetlb_range(start, end, walk) : 0;
	else
		err = walk_pgd_range(start, end, walk);
	if (ops->post_vma)
		ops->post_vma(walk);
	return err;
}

/*
 * walk_page_range(): call @ops for the page tables of [start, end) of
 * @mm, VMA by VMA, mmap lock held.  Callbacks at the pgd, p4d and pud
 * levels are not supported (-EINVAL): the driver uses none.
 */
int ub_compat_walk_page_range(struct mm_struct *mm, unsigned long start,
			      unsigned long end, const struct mm_walk_ops *ops,
			      void *private)
{
	struct mm_walk walk = { .ops = ops, .mm = mm, .private = private };
	struct vm_area_struct *vma;
	unsigned long next;
	int err = 0;

	if (start >= end || !mm || ops->pgd_entry || ops->p4d_entry ||
	    ops->pud_entry)
		return -EINVAL;
	/*
	 * Not mmap_assert_locked(): on a CONFIG_DEBUG_VM kernel (the debug guests)
	 * it calls dump_mm(), which 6.1 does not export to modules.
	 */
	lockdep_assert_held(&mm->mmap_lock);
	WARN_ON_ONCE(!rwsem_is_locked(&mm->mmap_lock));
	vma = find_vma(mm, start);
	do {
		if (!vma) {
			walk.vma = NULL;
			next = end;
			if (ops->pte_hole)
				err = ops->pte_hole(start, next, -1, &walk);
		} else if (start < vma->vm_start) {
			walk.vma = NULL;
			next = min(end, vma->vm_start);
			if (ops->pte_hole)
				err = ops->pte_hole(start, next, -1, &walk);
		} else {
			walk.vma = vma;
			next = min(end, vma->vm_end);
			vma = find_vma(mm, vma->vm_end);
			err = walk_test(start, next, &walk);
			if (err > 0) {
				err = 0;
				continue;
			}
			if (err < 0)
				break;
			err = walk_vma_range(start, next, &walk);
		}
		if (err)
			break;
	} while (start = next, start < end);
	return err;
}
EXPORT_SYMBOL_GPL(ub_compat_walk_page_range);

/* ---- split_vma() ---- */

#ifdef UB_COMPAT_HAVE_SPLIT_VMA_VMI
typedef int (*split_vma_fn)(struct vma_iterator *vmi,
			    struct vm_area_struct *vma, unsigned long addr,
			    int new_below);
#else
typedef int (*split_vma_fn)(struct mm_struct *mm, struct vm_area_struct *vma,
			    unsigned long addr, int new_below);
#endif

static split_vma_fn kernel_split_vma;

/* The address of kernel function @name, from a kprobe placed on it. */
static void *lookup_function(const char *name)
{
	struct kprobe kp = { .symbol_name = name };
	unsigned long addr;

	if (!IS_ENABLED(CONFIG_KPROBES) || register_kprobe(&kp))
		return NULL;
	addr = (unsigned long)kp.addr;
	unregister_kprobe(&kp);
#ifdef CONFIG_X86_KERNEL_IBT
	/* kprobes sit past the ENDBR an indirect call must land on. */
	if (is_endbr(*(u32 *)(addr - ENDBR_INSN_SIZE)))
		addr -= ENDBR_INSN_SIZE;
#endif
	return (void *)addr;
}

/*
 * split_vma(): cut @vma at @addr (mmap write lock held); with @new_below
 * the new VMA is the part below @addr, else the part above, and @vma the
 * rest.  The iterator is left after @vma, where the caller's loop goes on.
 */
int ub_compat_split_vma(struct vma_iterator *vmi, struct vm_area_struct *vma,
			unsigned long addr, int new_below)
{
	int ret;

	if (!kernel_split_vma) {
		pr_warn_once("split_vma() not found: ownership updates of part of a mapping fail\n");
		return -EOPNOTSUPP;
	}
#ifdef UB_COMPAT_HAVE_SPLIT_VMA_VMI
	ret = kernel_split_vma(vmi, vma, addr, new_below);
#else
	ret = kernel_split_vma(vma->vm_mm, vma, addr, new_below);
	/* The kernel changed the VMA tree under the iterator: start it again. */
	mas_set(&vmi->mas, vma->vm_end);
#endif
	return ret;
}
EXPORT_SYMBOL_GPL(ub_compat_split_vma);

/* ---- the rest ---- */

/*
 * remap_pfn_range_try_pmd(): OLK maps with PMD-size entries where the
 * range allows.  A stock kernel has no such remap (x86 installs huge PFN
 * entries only at fault time): 4 KiB entries, the same memory.
 */
int remap_pfn_range_try_pmd(struct vm_area_struct *vma, unsigned long addr,
			    unsigned long pfn, unsigned long size,
			    pgprot_t prot)
{
	return remap_pfn_range(vma, addr, pfn, size, prot);
}
EXPORT_SYMBOL_GPL(remap_pfn_range_try_pmd);

#ifdef CONFIG_X86
static void flush_tlb_local(void *unused)
{
	__flush_tlb_all();
}

/* The arm64 TLBI by ASID of the driver: here every CPU's whole TLB. */
void ub_compat_flush_tlb_mm(struct mm_struct *mm)
{
	on_each_cpu(flush_tlb_local, NULL, 1);
}
EXPORT_SYMBOL_GPL(ub_compat_flush_tlb_mm);
#endif

/*
 * hisi_soc_cache_maintain(): clean and/or invalidate a physical range in
 * the SoC's caches, so a host sees what another wrote through the fabric.
 * The testbed's windows are RAM shared by QEMU processes, coherent for
 * every access: nothing to maintain.
 */
int hisi_soc_cache_maintain(phys_addr_t addr, size_t size,
			    enum hisi_soc_cache_maint_type maint_type)
{
	if (maint_type >= HISI_CACHE_MAINT_MAX || !size)
		return -EINVAL;
	return 0;
}
EXPORT_SYMBOL_GPL(hisi_soc_cache_maintain);

/*
 * register_reclaim_notifier(): OLK calls these when reclaim runs short, so
 * that pools give memory back.  The chain is kept but a stock kernel never
 * calls it: the driver's pool does not shrink under memory pressure.
 */
static BLOCKING_NOTIFIER_HEAD(reclaim_chain);

int register_reclaim_notifier(struct notifier_block *nb)
{
	return blocking_notifier_chain_register(&reclaim_chain, nb);
}
EXPORT_SYMBOL_GPL(register_reclaim_notifier);

int unregister_reclaim_notifier(struct notifier_block *nb)
{
	return blocking_notifier_chain_unregister(&reclaim_chain, nb);
}
EXPORT_SYMBOL_GPL(unregister_reclaim_notifier);

#ifndef UB_COMPAT_KERNEL_HAS_GHES_REPORT_CHAIN
/*
 * ghes_register_report_chain(): OLK passes memory errors GHES reports to
 * drivers, so a pool can set a poisoned granule aside.  Kernels before
 * mainline's own chain have none (and the guests no GHES): kept, never
 * called.
 */
static ATOMIC_NOTIFIER_HEAD(ghes_report_chain);

int ghes_register_report_chain(struct notifier_block *nb)
{
	return atomic_notifier_chain_register(&ghes_report_chain, nb);
}
EXPORT_SYMBOL_GPL(ghes_register_report_chain);

void ghes_unregister_report_chain(struct notifier_block *nb)
{
	atomic_notifier_chain_unregister(&ghes_report_chain, nb);
}
EXPORT_SYMBOL_GPL(ghes_unregister_report_chain);
#endif

void ub_compat_mm_init(void)
{
	kernel_split_vma = lookup_function("split_vma");
	if (!kernel_split_vma)
		pr_warn("split_vma() not found: ownership updates of part of a mapping will fail\n");
}
