/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ub_compat: what an out-of-tree build of the UB drivers (upstream's
 * drivers/ub/obmm) takes from an openEuler OLK kernel and its arm64 host,
 * provided on a stock kernel of the testbed's guests (Debian 6.1 amd64).
 *
 * This header is force-included (-include) before every file of the
 * upstream build; the headers beside it stand in for OLK headers the
 * stock kernel lacks (linux/numa_remote.h, linux/ummu_core.h,
 * ub/ubus/ubus.h, ...).  Functions are implemented and exported by
 * ub_compat.ko; kmod/ub_compat/README.md tables every shim.
 *
 * Kernel headers are included first, so that the redirections below
 * (macros named as kernel functions) apply only to the upstream sources.
 * Everything here is built into ub_compat.ko too, with W=1.  Which kernel
 * interfaces exist comes from features.mk (UB_COMPAT_HAVE_*).
 */
#ifndef UB_COMPAT_H
#define UB_COMPAT_H

#include <linux/io.h>
#include <linux/mm.h>
#include <linux/notifier.h>
#include <linux/numa.h>
#include <linux/pagewalk.h>
#include <linux/pgtable.h>
#include <linux/semaphore.h>
#include <linux/types.h>
#include <asm/tlbflush.h>

/* ---- kernel version gaps ---- */

#ifndef UB_COMPAT_HAVE_VM_FLAGS_SET
/*
 * vm_flags_set/clear(): 6.3 made vm_flags writable only through them
 * (with the VMA write lock asserted); before, callers wrote the field.
 */
static inline void vm_flags_set(struct vm_area_struct *vma, vm_flags_t flags)
{
	vma->vm_flags |= flags;
}

static inline void vm_flags_clear(struct vm_area_struct *vma,
				  vm_flags_t flags)
{
	vma->vm_flags &= ~flags;
}
#endif

#ifndef UB_COMPAT_HAVE_SEMAPHORE_COUNT
/*
 * DEFINE_SEMAPHORE(name, count): 6.4 added the count; before, every
 * semaphore so defined started at 1.
 */
#undef DEFINE_SEMAPHORE
#define DEFINE_SEMAPHORE(_name, _count)					\
	struct semaphore _name = __SEMAPHORE_INITIALIZER(_name, _count)
#endif

#ifndef UB_COMPAT_HAVE_PIN_REMOTE_NO_VMAS
/*
 * pin_user_pages_remote(): 6.5 dropped the vmas argument, which every
 * caller but one passed as NULL.
 */
#define pin_user_pages_remote(mm, start, nr_pages, gup_flags, pages, locked) \
	pin_user_pages_remote(mm, start, nr_pages, gup_flags, pages, NULL, locked)
#endif

/*
 * walk_page_range() and split_vma() are not exported by stock kernels
 * (OLK builds the driver in tree).  ub_compat.ko provides both: its own
 * page-table walker for the callbacks the driver uses, and the kernel's
 * split_vma() (mm.c says how it is reached and why).
 */
int ub_compat_walk_page_range(struct mm_struct *mm, unsigned long start,
			      unsigned long end, const struct mm_walk_ops *ops,
			      void *private);
#define walk_page_range ub_compat_walk_page_range

int ub_compat_split_vma(struct vma_iterator *vmi, struct vm_area_struct *vma,
			unsigned long addr, int new_below);
#define split_vma ub_compat_split_vma

/*
 * ---- the UB bus's memory decoder (drivers/ub/ubus/memory.c; bus.c) ----
 * Declared here as in ub/ubus/ub-mem-decoder.h, so that a build against
 * upstream's header checks that the two agree.
 */
void ub_mem_drain_start(u32 scna);
int ub_mem_drain_state(u32 scna);
int ub_mem_get_numa_id(u32 scna);
bool ub_memory_validate_pa(u32 scna, u64 pa_start, u64 pa_end, bool cacheable);

/* ---- OLK-only kernel interfaces (implemented in ub_compat.ko) ---- */

/*
 * OLK: sets the kernel linear mapping of [start_pfn, end_pfn) invalid
 * (or valid again), so the CPU never caches memory lent to other hosts.
 */
int set_linear_mapping_invalid(unsigned long start_pfn, unsigned long end_pfn,
			       bool set_inval);

/* OLK PFN_RANGE_ALLOC: a physically contiguous folio of nr_pages on nid. */
struct folio *pfn_range_alloc(unsigned long nr_pages, int nid);
int pfn_range_free(struct folio *folio);

/* OLK: a hugetlb folio of @size taken from (given back to) nid's pool. */
struct folio *hugetlb_pool_alloc_size(int nid, unsigned long size);
int hugetlb_pool_free(struct folio *folio);

/* OLK: the percentage of huge pages that are PMD-mapped (pmd_mapping=). */
extern int contig_mem_pool_percent;

/* OLK: remap_pfn_range() with PMD-size entries where alignment allows. */
int remap_pfn_range_try_pmd(struct vm_area_struct *vma, unsigned long addr,
			    unsigned long pfn, unsigned long size,
			    pgprot_t prot);

/* OLK RECLAIM_NOTIFY: told when reclaim runs short, so pools can shrink. */
enum reclaim_reason {
	RR_KSWAPD,
	RR_DIRECT_RECLAIM,
	RR_HUGEPAGE_RECLAIM,
	RR_TYPES
};

struct reclaim_notify_data {
	bool sync;
	enum reclaim_reason reason;
	unsigned long nr_freed;
	int nr_nid;
	int nid[MAX_NUMNODES];
};

int register_reclaim_notifier(struct notifier_block *nb);
int unregister_reclaim_notifier(struct notifier_block *nb);

/*
 * HiSilicon SoC cache maintenance by physical address (drivers/soc/
 * hisilicon; the driver declares it itself, in obmm_cache.h).
 */
enum hisi_soc_cache_maint_type;
int hisi_soc_cache_maintain(phys_addr_t addr, size_t size,
			    enum hisi_soc_cache_maint_type maint_type);

#ifndef UB_COMPAT_KERNEL_HAS_GHES_REPORT_CHAIN
/* OLK: memory errors GHES reports, passed on to registered drivers. */
int ghes_register_report_chain(struct notifier_block *nb);
void ghes_unregister_report_chain(struct notifier_block *nb);
#endif

/* ---- arm64 pieces, on x86 ---- */

#ifdef CONFIG_X86
/*
 * arm64 PTE bits the driver adjusts (asm/pgtable-prot.h, pgtable-hwdef.h),
 * as their x86 equivalents: no separate read-only, non-global or
 * privileged-execute-never bits.
 */
#define PTE_RDONLY	0
#define PTE_USER	_PAGE_USER
#define PTE_NG		0
#define PTE_PXN		_PAGE_NX
#define PTE_UXN		0

/*
 * arm64 pgprot_tagged(): Normal Tagged memory (MTE), used to make a
 * user mapping cacheable again.  x86: write-back, i.e. the caching bits
 * cleared.  Only applied to huge (PMD) entries, whose PAT bit is bit 12.
 */
#define pgprot_tagged(prot)						\
	__pgprot(pgprot_val(prot) & ~(_PAGE_PWT | _PAGE_PCD | _PAGE_PAT_LARGE))

/*
 * pte_modify() of a huge (hugetlb PMD) entry, as arm64's: the frame and the
 * accessed/dirty/special bits stay, permissions *and memory type* come from
 * @prot.  x86's keeps the caching bits (mprotect must not change them), and
 * its mask names cc_mask, which modules cannot reach; confidential-computing
 * guests, where that mask is not 0, are not supported.
 */
static inline pte_t ub_compat_huge_pte_modify(pte_t pte, pgprot_t prot)
{
	const pteval_t keep = PHYSICAL_PMD_PAGE_MASK | _PAGE_ACCESSED |
			      _PAGE_DIRTY | _PAGE_SPECIAL | _PAGE_SOFT_DIRTY |
			      _PAGE_DEVMAP;

	return __pte((pte_val(pte) & keep) | (pgprot_val(prot) & ~keep));
}

#define pte_modify(pte, prot)	ub_compat_huge_pte_modify(pte, prot)

/* arm64 __set_pte(): set_pte() without its checks; x86 has only set_pte(). */
#define __set_pte(ptep, pte)	set_pte(ptep, pte)

#ifndef pmd_pte
#define pmd_pte(pmd)		__pte(pmd_val(pmd))
#endif

#ifndef UB_COMPAT_HAVE_X86_PMD_MKSPECIAL
/* x86 gained a special bit for huge PFN maps (pmd_mkspecial) in 6.12. */
#define pmd_mkspecial(pmd)	(pmd)
#endif

/*
 * arm64 TLB maintenance by ASID (dsb; tlbi aside1is): the driver flushes
 * a whole process after changing its page tables.  x86 cannot flush one
 * mm from a module (flush_tlb_mm_range() is not exported): the whole TLB
 * of every CPU is flushed instead.
 */
void ub_compat_flush_tlb_mm(struct mm_struct *mm);
/* arm64 dsb: completes the page table writes before the flush. */
#define dsb(option)			mb()
#define ASID(mm)			((unsigned long)(mm))
#define __TLBI_VADDR(addr, asid)	(asid)
#define __tlbi(op, arg)			ub_compat_flush_tlb_mm((struct mm_struct *)(arg))
#define __tlbi_user(op, arg)		do { } while (0)
#endif /* CONFIG_X86 */

/*
 * The kernel headers above gave pr_fmt its default; the files this header
 * is forced into define their own, and must not see it as a redefinition.
 */
#undef pr_fmt

#endif /* UB_COMPAT_H */
