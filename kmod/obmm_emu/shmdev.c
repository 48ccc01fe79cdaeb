// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: /dev/obmm_shmdev<id>: open, mmap, VMA rules and
 * OBMM_SHMDEV_UPDATE_RANGE.
 *
 * Each mapping keeps the access of each of its granule entries
 * (ownership.c): UPDATE_RANGE changes them, gives the VMA the union of
 * its entries' access and makes the page-table entries of the range over
 * with each entry's own; an access an entry does not allow faults
 * (SIGSEGV), as the real driver's split VMAs make it fault.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/huge_mm.h>	/* after mm.h, which it needs */
#include <linux/module.h>
#include <linux/pfn_t.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "cache.h"
#include "fabric.h"
#include "ownership.h"
#include "region.h"
#include "shmdev.h"
#include "sysfs.h"

#define OBMM_SHMDEV_VMA_NAME	"OBMM_SHM"

/*
 * PMD-granule mappings are installed on first touch, 2 MiB at a time, by
 * obmm_vm_fault() (the real driver maps them at mmap with the OLK-only
 * remap_pfn_range_try_pmd()).  Without THP the kernel has no huge pfn
 * entries and no 2 MiB-aligned placement: they are mapped 4 KiB at a time
 * on touch, as the page granule.
 *
 * A huge (2 MiB) entry is used only where the kernel marks huge pfn entries
 * special (pmd_special(), CONFIG_ARCH_SUPPORTS_PMD_PFNMAP, 6.12 on x86_64
 * and arm64).  Before that, get_user_pages_fast() takes any huge PMD for a
 * THP and grabs its struct page: there is none for a window BAR or for pool
 * memory above mem=, and a futex, vmsplice, O_DIRECT or EXPORT_PID on such
 * an address oopsed (the flaw that made drm/ttm drop its huge pfn
 * mappings).  There each 2 MiB gets its 512 PTEs at once instead, special
 * like every pfn PTE, which GUP-fast leaves to the slow path (VM_PFNMAP:
 * EFAULT).
 */
#ifdef CONFIG_TRANSPARENT_HUGEPAGE
#define OBMM_PMD_LAZY		1
#else
#define OBMM_PMD_LAZY		0
#endif
#if defined(CONFIG_TRANSPARENT_HUGEPAGE) && defined(CONFIG_ARCH_SUPPORTS_PMD_PFNMAP)
#define OBMM_PMD_HUGE		1
#else
#define OBMM_PMD_HUGE		0
#endif

#ifdef OBMM_EMU_TEST
/*
 * Test only: a successful mmap waits this long before it returns, before
 * the core links the VMA where a revocation's zap finds it, so that a test
 * can revoke the import in that window.
 */
static unsigned int test_mmap_delay_ms;
module_param(test_mmap_delay_ms, uint, 0600);
MODULE_PARM_DESC(test_mmap_delay_ms,
		 "test only: a successful mmap waits this long before it returns (ms, at most 5000)");

static void obmm_shm_test_mmap_delay(void)
{
	unsigned int ms = min_t(unsigned int, READ_ONCE(test_mmap_delay_ms),
				OBMM_TEST_DELAY_MAX_MS);

	if (ms)
		msleep_interruptible(ms);
}

/*
 * Test only: the next this many mmaps fail with -ENOMEM where the memtype
 * reservation may (after the entries' counts were made), as one does under
 * fault injection.
 */
static unsigned int test_map_fail;
module_param(test_map_fail, uint, 0600);
MODULE_PARM_DESC(test_map_fail,
		 "test only: the next N mmaps fail with -ENOMEM after their counts were made");

static int obmm_shm_test_map_fail(void)
{
	unsigned int n = READ_ONCE(test_map_fail);

	if (!n || cmpxchg(&test_map_fail, n, n - 1) != n)
		return 0;
	return -ENOMEM;
}
#else
static void obmm_shm_test_mmap_delay(void)
{
}

static int obmm_shm_test_map_fail(void)
{
	return 0;
}
#endif

static dev_t obmm_shmdev_devt;
static struct device *obmm_root;

struct device *obmm_shmdev_root(void)
{
	return obmm_root;
}

static bool obmm_file_cacheable(struct file *file)
{
	return !(file->f_flags & O_SYNC);
}

static int obmm_shm_open(struct inode *inode, struct file *file)
{
	struct obmm_region *r;
	unsigned int need;
	int err = 0;

	r = obmm_region_get_by_id(iminor(inode), &err);
	if (!r)
		return err;
	need = obmm_file_cacheable(file) ? OBMM_CAP_CACHEABLE :
		OBMM_CAP_NONCACHEABLE;
	if (!(r->mem_cap & need)) {
		if (need == OBMM_CAP_CACHEABLE)
			err = obmm_refuse(OBMM_OP_OPEN, -EPERM,
					  "Noncacheable region %d cannot be mmaped with cachable mode.",
					  r->id);
		else
			err = obmm_refuse(OBMM_OP_OPEN, -EPERM,
					  "Cacheable region %d cannot be mmaped with noncachable mode.",
					  r->id);
		obmm_region_put(r);
		return err;
	}
	/*
	 * Every file of the region maps through the region's own inode, not
	 * that of the node it was opened by, so that revocation finds every
	 * mapping with unmap_mapping_range().
	 */
	file->f_mapping = r->map_inode->i_mapping;
	file->private_data = r;
	return 0;
}

/*
 * Revoke an import (access.c decided its export is gone): new mmaps fail
 * with -ENXIO and every present user PTE is zapped, so the next access
 * faults into obmm_vm_fault(): SIGBUS.  Called again while the region
 * stays mapped, to catch a mapping whose mmap raced with the revocation.
 */
void obmm_shmdev_revoke(struct obmm_region *r)
{
	mutex_lock(&r->mmap_lock);
	r->revoked = true;
	/* strict: the cached lines go with the memory, not written back */
	obmm_cache_release(r, false);
	mutex_unlock(&r->mmap_lock);
	unmap_mapping_range(r->map_inode->i_mapping, 0, 0, 1);
}

/* Whether the import was revoked (read under its lock). */
bool obmm_shmdev_revoked(struct obmm_region *r)
{
	bool revoked;

	mutex_lock(&r->mmap_lock);
	revoked = r->revoked;
	mutex_unlock(&r->mmap_lock);
	return revoked;
}

static int obmm_shm_release(struct inode *inode, struct file *file)
{
	obmm_region_put(file->private_data);
	return 0;
}

static unsigned long obmm_granu_size(enum obmm_mmap_granu granu)
{
	return granu == OBMM_MMAP_GRANU_PMD ? PMD_SIZE : PAGE_SIZE;
}

static unsigned int obmm_granu_shift(enum obmm_mmap_granu granu)
{
	return granu == OBMM_MMAP_GRANU_PMD ? PMD_SHIFT : PAGE_SHIFT;
}

static struct obmm_region *obmm_vma_region(const struct vm_area_struct *vma)
{
	return obmm_vmap_region(vma->vm_private_data);
}

/* Offset in the region of a user address of the VMA. */
static u64 obmm_vma_offset(const struct vm_area_struct *vma,
			   unsigned long addr)
{
	return ((u64)vma->vm_pgoff << PAGE_SHIFT) + (addr - vma->vm_start);
}

/* The region granule entry holding user address @addr of the VMA. */
static unsigned long obmm_vma_entry(const struct vm_area_struct *vma,
				    unsigned long addr)
{
	return obmm_vma_offset(vma, addr) >>
	       obmm_granu_shift(obmm_vma_region(vma)->mmap_granu);
}

/* The mem_state of the entry holding @addr; mmap_lock held. */
static u8 obmm_vma_state(const struct vm_area_struct *vma, unsigned long addr)
{
	return obmm_vmap_state(vma->vm_private_data,
			       obmm_vma_entry(vma, addr));
}

/*
 * Whether @vma is a piece __split_vma() is cutting out of a VMA of the same
 * mapping: opened before the VMA it comes from shrinks, so that one still
 * maps the piece's range.  A copy mremap() makes is opened before it is
 * linked, at an address range nothing of the mapping covers.  mmap write
 * lock held.
 */
static bool obmm_vma_is_split_piece(struct vm_area_struct *vma)
{
	struct vm_area_struct *from = find_vma(vma->vm_mm, vma->vm_start);

	return from && from != vma &&
	       from->vm_private_data == vma->vm_private_data &&
	       from->vm_start <= vma->vm_start && vma->vm_end <= from->vm_end;
}

static void obmm_vm_open(struct vm_area_struct *vma)
{
	struct obmm_region *r = obmm_vma_region(vma);

	mutex_lock(&r->mmap_lock);
	r->mmap_count++;
	if (!obmm_vma_is_split_piece(vma))
		obmm_vmap_cover(vma->vm_private_data,
				obmm_vma_entry(vma, vma->vm_start),
				obmm_vma_entry(vma, vma->vm_end - 1) + 1);
	mutex_unlock(&r->mmap_lock);
	obmm_vmap_get(vma->vm_private_data);
}

/*
 * x86 PAT: vmf_insert_pfn_pmd() and vmf_insert_pfn() take the caching mode
 * of the pfn from the memtype reservation that covers it (none: uncached),
 * and only remap_pfn_range() reserves one for a VMA.  Entries are installed
 * on touch (a mapping made at mmap, before the core links the VMA where a
 * revocation's zap finds it, could outlive the zap), so while a region is
 * mapped it holds a kernel mapping of itself with the VMA's protection: the
 * same reservation remap_pfn_range() would make (WB or WC, as PAT and the
 * MTRRs allow), which the entries installed on touch then get.
 * mmap_lock held.
 */
static int obmm_memtype_get(struct obmm_region *r, pgprot_t prot)
{
#if defined(CONFIG_X86_PAT) && defined(CONFIG_HAVE_IOREMAP_PROT)
	if (r->pmd_memtype)
		return 0;
	r->pmd_memtype = ioremap_prot(r->pa, r->size, pgprot_val(prot));
	if (!r->pmd_memtype)
		return -EINVAL;
#endif
	return 0;
}

static void obmm_memtype_put(struct obmm_region *r)
{
	if (r->pmd_memtype)
		iounmap(r->pmd_memtype);
	r->pmd_memtype = NULL;
}

static void obmm_vm_close(struct vm_area_struct *vma)
{
	struct obmm_region *r = obmm_vma_region(vma);
	u8 ops;

	mutex_lock(&r->mmap_lock);
	/*
	 * A VMA emptied by a split that failed after .open (vm_start ==
	 * vm_end, vm_pgoff 0: mm/mmap.c:__split_vma) maps nothing; its
	 * entries stay the original VMA's.  Of a copy mremap() unmaps again,
	 * the entries the original maps stay its (ownership.c: cover).  The
	 * last writer or reader of an entry gone, its cache maintenance
	 * (obmm_shm_dev.c:obmm_vma_close).
	 */
	if (vma->vm_start < vma->vm_end) {
		ops = obmm_vmap_release(vma->vm_private_data,
					obmm_vma_entry(vma, vma->vm_start),
					obmm_vma_entry(vma, vma->vm_end - 1) + 1);
		obmm_cache_maintain(r, obmm_vma_offset(vma, vma->vm_start),
				    vma->vm_end - vma->vm_start, ops);
	}
	if (!--r->mmap_count) {
		if (r->type == OBMM_REGION_EXPORT)
			obmm_ctl_export_set_mapped(r, false);
		obmm_cache_release(r, !r->revoked);
		r->mmap_mode = OBMM_MMAP_MODE_NONE;
		obmm_memtype_put(r);
	}
	mutex_unlock(&r->mmap_lock);
	obmm_vmap_put(vma->vm_private_data);
}

/* A PMD-granule region whose 2 MiB pieces are installed on first touch. */
static bool obmm_vma_lazy(const struct obmm_region *r)
{
	return OBMM_PMD_LAZY && r->mmap_granu == OBMM_MMAP_GRANU_PMD;
}

/*
 * The protection of @flags with the caching mode of mem_state @state
 * (the real mem_state_to_pgprot()): write-combine for NORMAL_NC, uncached
 * for DEVICE.
 */
static pgprot_t obmm_prot(vm_flags_t flags, u8 state)
{
	pgprot_t prot = vm_get_page_prot(flags);

	switch (state & OBMM_SHM_MEM_CACHE_MASK) {
	case OBMM_SHM_MEM_NORMAL_NC:
		return pgprot_writecombine(prot);
	case OBMM_SHM_MEM_DEVICE:
		return pgprot_noncached(prot);
	default:
		return prot;
	}
}

/*
 * The protection of an entry's page-table entries in @vma: its access and
 * cache.  Never writable in a VMA without VM_SHARED (a MAP_SHARED mapping
 * of a read-only fd): a write there would be copy-on-write.
 */
static pgprot_t obmm_state_prot(const struct vm_area_struct *vma, u8 state)
{
	vm_flags_t flags = obmm_state_vm_flags(state) & (VM_READ | VM_WRITE);

	if (!(vma->vm_flags & VM_SHARED))
		flags &= ~VM_WRITE;
	return obmm_prot(VM_SHARED | flags, state);
}

#if OBMM_PMD_LAZY
/* Every 4 KiB PTE of the 2 MiB at haddr (a kernel without special huge pfn PMDs). */
static vm_fault_t obmm_pmd_fault_ptes(struct vm_area_struct *vma,
				      struct obmm_region *r, unsigned long haddr,
				      pgprot_t prot)
{
	vm_fault_t ret = VM_FAULT_NOPAGE;
	unsigned long addr;

	for (addr = haddr; addr < haddr + PMD_SIZE; addr += PAGE_SIZE) {
		ret = vmf_insert_pfn_prot(vma, addr,
					  PHYS_PFN(r->pa + obmm_vma_offset(vma, addr)),
					  prot);
		if (ret != VM_FAULT_NOPAGE)
			break;
	}
	return ret;
}

/*
 * The 2 MiB around vmf->address: one huge entry (with the VMA's protection,
 * which UPDATE_RANGE sets), or its 512 PTEs with @prot, the granule entry's.
 */
static vm_fault_t obmm_pmd_fault(struct vm_fault *vmf, struct obmm_region *r,
				 pgprot_t prot)
{
	struct vm_area_struct *vma = vmf->vma;
	unsigned long haddr = vmf->address & PMD_MASK;
	u64 off = obmm_vma_offset(vma, haddr);

	/* mmap and split keep PMD-granule VMAs aligned; defensive. */
	if (haddr < vma->vm_start || haddr + PMD_SIZE > vma->vm_end ||
	    off + PMD_SIZE > r->size)
		return VM_FAULT_SIGBUS;
	if (!OBMM_PMD_HUGE)
		return obmm_pmd_fault_ptes(vma, r, haddr, prot);
	if (pmd_none(*vmf->pmd))
		return vmf_insert_pfn_pmd(vmf, phys_to_pfn_t(r->pa + off, PFN_DEV),
					  vmf->flags & FAULT_FLAG_WRITE);
	/* A page table is already there: map the one page. */
	return vmf_insert_pfn(vma, vmf->address,
			      PHYS_PFN(r->pa + obmm_vma_offset(vma, vmf->address)));
}
#endif

/* The page at @addr with entry state @state's protection; mmap_lock held. */
static vm_fault_t obmm_insert_page(struct vm_area_struct *vma,
				   struct obmm_region *r, unsigned long addr,
				   u8 state)
{
	return vmf_insert_pfn_prot(vma, addr,
				   PHYS_PFN(r->pa + obmm_vma_offset(vma, addr)),
				   obmm_state_prot(vma, state));
}

static vm_fault_t obmm_vm_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct obmm_region *r = obmm_vma_region(vma);
	unsigned long addr = vmf->address & PAGE_MASK;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	u8 state;

	/*
	 * Revoked (checked under mmap_lock, which revocation takes before it
	 * zaps: no entry can be installed after the zap): SIGBUS.  An access
	 * the entry does not allow (UPDATE_RANGE): SIGSEGV.  Else the entry
	 * is mapped: page granule, the page (nothing is mapped at mmap); PMD
	 * granule, the 2 MiB around it.
	 */
	mutex_lock(&r->mmap_lock);
	if (r->revoked)
		goto out;
	state = obmm_vma_state(vma, addr);
	if (!obmm_state_reader(state) ||
	    ((vmf->flags & FAULT_FLAG_WRITE) && !obmm_state_writer(state))) {
		ret = VM_FAULT_SIGSEGV;
		goto out;
	}
	/* strict: this node's cached copy, page by page in either granule */
	if (obmm_cache_on(r)) {
		ret = obmm_cache_fault(r, vma, addr, obmm_vma_offset(vma, addr),
				       obmm_state_prot(vma, state));
		goto out;
	}
#if OBMM_PMD_LAZY
	if (obmm_vma_lazy(r)) {
		ret = obmm_pmd_fault(vmf, r, obmm_state_prot(vma, state));
		goto out;
	}
#endif
	ret = obmm_insert_page(vma, r, addr, state);
out:
	mutex_unlock(&r->mmap_lock);
	return ret;
}

/*
 * A write to a page an UPDATE_RANGE left read-only (its VMA may write
 * elsewhere): SIGSEGV; to a read-write one: made writable by the core.
 */
static vm_fault_t obmm_vm_pfn_mkwrite(struct vm_fault *vmf)
{
	struct obmm_region *r = obmm_vma_region(vmf->vma);
	vm_fault_t ret = VM_FAULT_SIGBUS;

	mutex_lock(&r->mmap_lock);
	if (!r->revoked)
		ret = obmm_state_writer(obmm_vma_state(vmf->vma, vmf->address)) ?
		      0 : VM_FAULT_SIGSEGV;
	mutex_unlock(&r->mmap_lock);
	return ret;
}

static int obmm_vm_may_split(struct vm_area_struct *vma, unsigned long addr)
{
	struct obmm_region *r = obmm_vma_region(vma);

	return IS_ALIGNED(addr, obmm_granu_size(r->mmap_granu)) ? 0 : -EINVAL;
}

#ifdef OBMM_HAVE_MREMAP_FLAGS
static int obmm_vm_mremap(struct vm_area_struct *vma, unsigned long flags)
#else
static int obmm_vm_mremap(struct vm_area_struct *vma)
#endif
{
	/* @vma is the copy mremap() made; it is unmapped again at once. */
	return -EOPNOTSUPP;
}

#ifdef OBMM_HAVE_MAY_SPLIT
static int obmm_vm_mprotect(struct vm_area_struct *vma, unsigned long start,
			    unsigned long end, unsigned long newflags)
{
	return -EOPNOTSUPP;
}
#endif

static unsigned long obmm_vm_pagesize(struct vm_area_struct *vma)
{
	struct obmm_region *r = obmm_vma_region(vma);

	return obmm_granu_size(r->mmap_granu);
}

static const char *obmm_vm_name(struct vm_area_struct *vma)
{
	return OBMM_SHMDEV_VMA_NAME;
}

#ifdef CONFIG_HAVE_IOREMAP_PROT
/*
 * ptrace / GDB access (access_process_vm() falls back to this for pfnmap
 * VMAs).  Page-granule mappings use generic_access_phys(), which maps the
 * page with the memtype of its PTE, once the page is installed as a touch
 * would install it.  It walks to a PTE and cannot take a
 * huge entry nor a 2 MiB piece not touched yet, so for PMD mappings the
 * physical address comes from the region instead, mapped with the VMA's
 * protection.  (The region-based
 * path for page mappings too got EIO for an untouched cacheable 4 KiB
 * mapping: fuzzer --seed 5 --ops 1000 --only 348,361,399,413.)
 */
/*
 * The kernel mapping's protection for a copy from or to @vma's memory: its
 * memory type, kernel permissions.  arm64's ioremap_prot() before 6.15
 * keeps a user pgprot's PTE_USER, and with PAN the kernel's own copy then
 * takes a permission fault (seen: an Oops in memcpy_fromio() on a
 * /proc/pid/mem read of a page mapping; mainline's fix: "arm64: io:
 * Extract user memory type in ioremap_prot()").
 */
static unsigned long obmm_vm_access_prot(struct vm_area_struct *vma)
{
#ifdef CONFIG_ARM64
	return pgprot_val(__pgprot_modify(PAGE_KERNEL, PTE_ATTRINDX_MASK,
					  pgprot_val(vma->vm_page_prot) &
					  PTE_ATTRINDX_MASK));
#else
	return pgprot_val(vma->vm_page_prot);
#endif
}

/*
 * Whether generic_access_phys() may copy through a page mapping: arm64's
 * maps with the user pgprot too, and takes the Oops above.
 */
static bool obmm_arch_generic_access_ok(void)
{
	return !IS_ENABLED(CONFIG_ARM64);
}

static int obmm_vm_access(struct vm_area_struct *vma, unsigned long addr,
			  void *buf, int len, int write)
{
	struct obmm_region *r = obmm_vma_region(vma);
	int offset = offset_in_page(addr);
	u64 off = obmm_vma_offset(vma, addr);
	void __iomem *maddr;
	int ret = -EINVAL;

	/*
	 * Where generic_access_phys() may not be used, every mapping goes the
	 * way of the lazy ones.  strict: a cacheable mapping reads and writes
	 * this node's cached copy (cache.c).
	 */
	if (!obmm_vma_lazy(r) && obmm_arch_generic_access_ok() &&
	    !obmm_cache_on(r)) {
		/* The page as a touch would install it (none yet if untouched). */
		mutex_lock(&r->mmap_lock);
		if (!r->revoked && obmm_state_reader(obmm_vma_state(vma, addr)))
			obmm_insert_page(vma, r, addr & PAGE_MASK,
					 obmm_vma_state(vma, addr));
		mutex_unlock(&r->mmap_lock);
		return generic_access_phys(vma, addr, buf, len, write);
	}

	/*
	 * What GUP with FOLL_FORCE (ptrace, /proc/pid/mem) allows elsewhere, and
	 * generic_access_phys() for page mappings: a read of any mapping (a
	 * PROT_WRITE-only one too), a write where the mapping is writable.
	 */
	if ((write && !(vma->vm_flags & VM_WRITE)) || off >= r->size)
		return -EINVAL;
	len = min_t(int, len, PAGE_SIZE - offset);
	mutex_lock(&r->mmap_lock);
	if (r->revoked || !obmm_state_reader(obmm_vma_state(vma, addr)) ||
	    (write && !obmm_state_writer(obmm_vma_state(vma, addr))))
		goto out;
	if (obmm_cache_on(r)) {
		ret = obmm_cache_access(r, off, buf, len, write);
		goto out;
	}
	maddr = ioremap_prot(r->pa + off - offset, PAGE_SIZE,
			     obmm_vm_access_prot(vma));
	if (!maddr) {
		ret = -ENOMEM;
		goto out;
	}
	if (write)
		memcpy_toio(maddr + offset, buf, len);
	else
		memcpy_fromio(buf, maddr + offset, len);
	iounmap(maddr);
	ret = len;
out:
	mutex_unlock(&r->mmap_lock);
	return ret;
}
#endif

static const struct vm_operations_struct obmm_vm_ops = {
	.open = obmm_vm_open,
	.close = obmm_vm_close,
	.fault = obmm_vm_fault,
	.pfn_mkwrite = obmm_vm_pfn_mkwrite,
#ifdef OBMM_HAVE_MAY_SPLIT
	.may_split = obmm_vm_may_split,
	.mprotect = obmm_vm_mprotect,
#else
	.split = obmm_vm_may_split,
#endif
	.mremap = obmm_vm_mremap,
	.pagesize = obmm_vm_pagesize,
	.name = obmm_vm_name,
#ifdef CONFIG_HAVE_IOREMAP_PROT
	.access = obmm_vm_access,
#endif
};

/*
 * A cache maintenance instruction of the current task at user address
 * @addr (arm64 EL0 DC, usermaint.c): on a strict cacheable mapping of a
 * region, the model's maintenance of that line; elsewhere nothing (the
 * kernel has already executed the instruction for the task).
 */
void obmm_shmdev_user_maint(unsigned long addr, bool inval)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	struct obmm_region *r;

	if (!mm)
		return;
	mmap_read_lock(mm);
	vma = find_vma(mm, addr);
	if (vma && vma->vm_start <= addr && vma->vm_ops == &obmm_vm_ops) {
		r = obmm_vma_region(vma);
		mutex_lock(&r->mmap_lock);
		if (obmm_cache_on(r))
			obmm_cache_line_maintain(r, obmm_vma_offset(vma, addr),
						 inval);
		mutex_unlock(&r->mmap_lock);
	}
	mmap_read_unlock(mm);
}

static void obmm_vma_set_flags(struct vm_area_struct *vma, vm_flags_t flags)
{
#ifdef OBMM_HAVE_VM_FLAGS_SET
	vm_flags_set(vma, flags);
#else
	vma->vm_flags |= flags;
#endif
}

static void obmm_vma_clear_flags(struct vm_area_struct *vma, vm_flags_t flags)
{
#ifdef OBMM_HAVE_VM_FLAGS_SET
	vm_flags_clear(vma, flags);
#else
	vma->vm_flags &= ~flags;
#endif
}

static int obmm_mmap_check_access(struct file *file, unsigned long vm_flags)
{
	if ((vm_flags & VM_READ) && !(file->f_mode & FMODE_READ))
		return -EPERM;
	if ((vm_flags & VM_WRITE) && !(file->f_mode & FMODE_WRITE))
		return -EPERM;
	if ((vm_flags & VM_EXEC) && !(file->f_mode & FMODE_READ))
		return -EPERM;
	return 0;
}

/*
 * Set up the mapping; every entry is installed on touch (obmm_vm_fault()):
 * the real driver remaps the page granule at mmap, but entries made before
 * the core links the VMA could outlive a revocation's zap.
 */
static int obmm_shm_map(struct obmm_region *r, struct vm_area_struct *vma)
{
	/* The flags remap_pfn_range() sets, as if it ran. */
	obmm_vma_set_flags(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP);
	return obmm_shm_test_map_fail() ?: obmm_memtype_get(r, vma->vm_page_prot);
}

static int obmm_shm_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct obmm_region *r = file->private_data;
	unsigned long len = vma->vm_end - vma->vm_start;
	u64 offset = (u64)vma->vm_pgoff << PAGE_SHIFT;
	enum obmm_mmap_granu granu = OBMM_MMAP_GRANU_PAGE;
	enum obmm_mmap_mode mode;
	struct obmm_vmap *vm;
	pgprot_t prot;
	u8 state;
	int ret;

	if (!(vma->vm_flags & VM_MAYSHARE))
		return obmm_refuse(OBMM_OP_MMAP, -EINVAL,
				   "mmap region %d: MAP_PRIVATE is not supported, use MAP_SHARED",
				   r->id);
	if (!r->allow_mmap)
		return obmm_refuse(OBMM_OP_MMAP, -EPERM,
				   "mmap region %d: not allow to be mmaped", r->id);
	ret = obmm_mmap_check_access(file, vma->vm_flags);
	if (ret) {
		/* validate_perm()'s line, then obmm_shm_fops_mmap()'s. */
		obmm_klog("%s false: vm_flags: %#lx, f_mode: %#x", "validate_perm",
			  (unsigned long)vma->vm_flags,
			  (__force unsigned int)file->f_mode);
		return obmm_refuse(OBMM_OP_MMAP, ret,
				   "mmap region %d: invalid vma permission", r->id);
	}
	if (offset & OBMM_MMAP_FLAG_HUGETLB_PMD) {
		offset &= ~OBMM_MMAP_FLAG_HUGETLB_PMD;
		if (!IS_ALIGNED(vma->vm_start, PMD_SIZE) ||
		    !IS_ALIGNED(vma->vm_end, PMD_SIZE))
			return obmm_refuse(OBMM_OP_MMAP, -EINVAL,
					   "PMD mmap vma not PMD-aligned: start=%#lx end=%#lx",
					   vma->vm_start, vma->vm_end);
		if (!IS_ALIGNED(offset, PMD_SIZE))
			return obmm_refuse(OBMM_OP_MMAP, -EINVAL,
					   "PMD mmap offset not PMD-aligned: offset=%#lx",
					   (unsigned long)offset);
		granu = OBMM_MMAP_GRANU_PMD;
	}
	if (obmm_file_cacheable(file)) {
		mode = OBMM_MMAP_MODE_CACHEABLE;
		prot = vma->vm_page_prot;
	} else {
		mode = OBMM_MMAP_MODE_NONCACHEABLE;
		prot = pgprot_writecombine(vma->vm_page_prot);
	}

	mutex_lock(&r->mmap_lock);
	if (r->mmap_granu != OBMM_MMAP_GRANU_NONE && r->mmap_granu != granu) {
		ret = obmm_refuse(OBMM_OP_MMAP, -EPERM,
				  "map with PAGE_SIZE and PMD_SIZE granu should not be mixed on the same region");
		goto out;
	}
	if (offset >= r->size || len > r->size - offset) {
		ret = obmm_refuse(OBMM_OP_MMAP, -EINVAL,
				  "mmap region %d: offset:%#lx, size:%#lx over region size: %#llx",
				  r->id, (unsigned long)offset, len, r->size);
		goto out;
	}
	if (r->mmap_count && r->mmap_mode != mode) {
		ret = obmm_refuse(OBMM_OP_MMAP, -EPERM,
				  "region cannot be mapped to cc and nc at the same time");
		goto out;
	}
	/* Emulator: the export of a revoked import is gone. */
	if (r->revoked) {
		ret = obmm_refuse_emu(OBMM_OP_MMAP, -ENXIO,
				  "import %d was revoked (its export is gone)",
				  r->id);
		goto out;
	}

	/* Its entries' access; cacheable ones are counted as the real driver. */
	state = obmm_mem_state_of(vma->vm_flags, mode == OBMM_MMAP_MODE_CACHEABLE);
	vm = obmm_vmap_new(r, offset >> obmm_granu_shift(granu),
			   len >> obmm_granu_shift(granu), obmm_granu_shift(granu),
			   state, mode == OBMM_MMAP_MODE_CACHEABLE);
	if (IS_ERR(vm)) {
		ret = PTR_ERR(vm);
		goto out;
	}
	obmm_vma_set_flags(vma, VM_DONTCOPY | VM_DONTEXPAND | VM_LOCKED);
	vma->vm_page_prot = prot;
	/* The region offset without the PMD flag, as the real driver. */
	vma->vm_pgoff = offset >> PAGE_SHIFT;
	ret = obmm_shm_map(r, vma);
	if (ret) {
		obmm_vmap_release(vm, offset >> obmm_granu_shift(granu),
				  (offset + len) >> obmm_granu_shift(granu));
		obmm_vmap_put(vm);
		obmm_refuse(OBMM_OP_MMAP, ret, "Failed to mmap region %d. ret=%pe",
			    r->id, ERR_PTR(ret));
		goto out;
	}
	/* Only a counted mapping gets the close hook. */
	vma->vm_private_data = vm;
	vma->vm_ops = &obmm_vm_ops;
	r->mmap_granu = granu;
	r->mmap_mode = mode;
	r->mmap_count++;
	if (mode == OBMM_MMAP_MODE_CACHEABLE)
		r->ownership_init = true;
	/* Its processes use the memory now: no node may borrow it. */
	if (r->type == OBMM_REGION_EXPORT && r->mmap_count == 1)
		obmm_ctl_export_set_mapped(r, true);
out:
	mutex_unlock(&r->mmap_lock);
	if (!ret)
		obmm_shm_test_mmap_delay();
	return ret;
}

static bool obmm_mem_state_valid(u8 state)
{
	u8 cache = state & OBMM_SHM_MEM_CACHE_MASK;
	u8 access = state & OBMM_SHM_MEM_ACCESS_MASK;

	if (state & ~(OBMM_SHM_MEM_CACHE_MASK | OBMM_SHM_MEM_ACCESS_MASK))
		return false;
	if (cache == OBMM_SHM_MEM_CACHE_RESV)
		return false;
	if (access == OBMM_SHM_MEM_READEXEC && cache != OBMM_SHM_MEM_NORMAL)
		return false;
	if (cache == OBMM_SHM_MEM_NORMAL_NC &&
	    access != OBMM_SHM_MEM_NO_ACCESS)
		return false;
	return true;
}

static int obmm_mem_state_check_access(struct file *file, u8 state)
{
	switch (state & OBMM_SHM_MEM_ACCESS_MASK) {
	case OBMM_SHM_MEM_READWRITE:
		if (!(file->f_mode & FMODE_WRITE))
			return -EPERM;
		fallthrough;
	case OBMM_SHM_MEM_READONLY:
	case OBMM_SHM_MEM_READEXEC:
		if (!(file->f_mode & FMODE_READ))
			return -EPERM;
		break;
	default:
		break;
	}
	return 0;
}

/*
 * The vm_flags an UPDATE_RANGE sets.  Not VM_MAYREAD/VM_MAYWRITE, which the
 * real OBMM_UPDATE_VM_FLAGS_MASK has too: the kernel counts a mapping in
 * its file's i_mmap_writable by VM_SHARED | VM_MAYWRITE when it links and
 * unlinks each VMA (vma_is_shared_maywrite()), so a VM_MAYWRITE changed in
 * between (a split meanwhile) left the count at -1 and every later shared
 * writable mmap of the region EPERM.
 */
#define OBMM_UPDATE_VM_FLAGS	(VM_READ | VM_WRITE)

/* The part [*from, *to) of the VMA in [start, end), as region entries. */
static void obmm_update_piece(const struct vm_area_struct *vma,
			      unsigned long start, unsigned long end,
			      unsigned long *from, unsigned long *to)
{
	*from = obmm_vma_entry(vma, max(start, vma->vm_start));
	*to = obmm_vma_entry(vma, min(end, vma->vm_end) - 1) + 1;
}

/*
 * Every byte of [start, end) is mapped by VMAs of this region, with no
 * hole (obmm_shm_dev.c:obmm_shm_update_range()'s EFAULTs, in its order).
 * mmap write lock held.
 */
/* The vm_flags the real validate_ownership_perm() asks of a mem_state. */
static unsigned long obmm_mem_state_vm_flags(u8 mem_state)
{
	switch (mem_state & OBMM_SHM_MEM_ACCESS_MASK) {
	case OBMM_SHM_MEM_READONLY:
		return VM_READ;
	case OBMM_SHM_MEM_READWRITE:
		return VM_READ | VM_WRITE;
	case OBMM_SHM_MEM_READEXEC:
		return VM_READ | VM_EXEC;
	}
	return VM_NONE;
}

static int obmm_update_range_check(struct obmm_region *r, unsigned long start,
				   unsigned long end)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	unsigned long cursor = start;

	for (vma = find_vma(mm, start); vma && vma->vm_start < end;
	     vma = find_vma(mm, vma->vm_end)) {
		if (vma->vm_start > cursor)
			return obmm_refuse(OBMM_OP_UPDATE_RANGE, -EFAULT,
					   "VMA gap detected: expected start=%#lx, actual=%#lx",
					   cursor, vma->vm_start);
		if (vma->vm_ops != &obmm_vm_ops || obmm_vma_region(vma) != r)
			return obmm_refuse(OBMM_OP_UPDATE_RANGE, -EFAULT,
					   "VMA does not belong to this region: vma=[%#lx, %#lx)",
					   vma->vm_start, vma->vm_end);
		cursor = vma->vm_end;
		if (cursor >= end)
			return 0;
	}
	return obmm_refuse(OBMM_OP_UPDATE_RANGE, -EFAULT,
			   "VMAs do not cover requested range: expected_end=%#llx actual_end=%#lx",
			   (unsigned long long)end, cursor);
}

/*
 * Count the entries of [start, end) as @state, all or none (-EOVERFLOW
 * when a count would pass U16_MAX), then do each VMA piece's cache
 * maintenance: only once every count has moved, since a write-back cannot
 * be taken back when a later piece overflows.  mmap write lock and
 * mmap_lock held.
 */
static int obmm_update_range_count(struct obmm_region *r, unsigned long start,
				   unsigned long end, u8 state, u8 cache_ops)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma, *done;
	unsigned long from, to, first, n = 0, i = 0;
	int ret = 0;
	u8 *ops;

	for (vma = find_vma(mm, start); vma && vma->vm_start < end;
	     vma = find_vma(mm, vma->vm_end))
		n++;
	ops = kcalloc(n, sizeof(*ops), GFP_KERNEL);
	if (!ops)
		return -ENOMEM;
	for (vma = find_vma(mm, start); vma && vma->vm_start < end;
	     vma = find_vma(mm, vma->vm_end), i++) {
		obmm_update_piece(vma, start, end, &from, &to);
		ops[i] = OBMM_SHM_CACHE_NONE;
		ret = obmm_vmap_move(vma->vm_private_data, from, to, state,
				     &ops[i]);
		if (ret)
			break;
	}
	if (ret) {
		for (done = find_vma(mm, start); done != vma;
		     done = find_vma(mm, done->vm_end)) {
			obmm_update_piece(done, start, end, &from, &to);
			obmm_vmap_unmove(done->vm_private_data, from, to,
					 state);
		}
		kfree(ops);
		return ret;
	}
	/*
	 * Each piece's maintenance, explicit or inferred from its counts
	 * (obmm_shm_dev.c:obmm_shm_update_range).
	 */
	for (vma = find_vma(mm, start), i = 0; vma && vma->vm_start < end;
	     vma = find_vma(mm, vma->vm_end), i++) {
		first = max(start, vma->vm_start);
		obmm_cache_maintain(r, obmm_vma_offset(vma, first),
				    min(end, vma->vm_end) - first,
				    cache_ops == OBMM_SHM_CACHE_INFER ? ops[i] :
				    cache_ops);
	}
	kfree(ops);
	return 0;
}

/*
 * Give the entries of [start, end) @state: the VMAs get the union of
 * their entries' access, the range's page-table entries are zapped and
 * (page granule, unless revoked) made again with the new protection; PMD
 * entries, and strict mode's cached pages, come back at the next touch.
 * The cache maintenance was done by obmm_update_range_count().  mmap write
 * lock and mmap_lock held.
 */
static void obmm_update_range_apply(struct obmm_region *r, unsigned long start,
				    unsigned long end, u8 state)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	unsigned long from, to, addr, first, last;
	vm_flags_t flags;
	pgprot_t prot;

	for (vma = find_vma(mm, start); vma && vma->vm_start < end;
	     vma = find_vma(mm, vma->vm_end)) {
		obmm_update_piece(vma, start, end, &from, &to);
		obmm_vmap_commit(vma->vm_private_data, from, to, state);
		flags = obmm_vmap_vm_flags(vma->vm_private_data,
					   obmm_vma_entry(vma, vma->vm_start),
					   obmm_vma_entry(vma, vma->vm_end - 1) + 1) &
			OBMM_UPDATE_VM_FLAGS;
		/*
		 * A writer state does not make a VMA without VM_SHARED (a
		 * read-only fd's) writable: its file may not be written, and
		 * a write there would be copy-on-write, which a pfn mapping
		 * cannot do.
		 */
		if (!(vma->vm_flags & VM_SHARED))
			flags &= ~VM_WRITE;
		obmm_vma_clear_flags(vma, OBMM_UPDATE_VM_FLAGS & ~flags);
		obmm_vma_set_flags(vma, flags);
		/* As the core sets it for a shared mapping that write-notifies. */
		vma->vm_page_prot = obmm_prot(vma->vm_flags & ~VM_SHARED, state);
		first = max(start, vma->vm_start);
		last = min(end, vma->vm_end);
		zap_vma_ptes(vma, first, last - first);
		if (obmm_vma_lazy(r) || r->revoked ||
		    !obmm_state_reader(state) || obmm_cache_on(r))
			continue;
		prot = obmm_state_prot(vma, state);
		for (addr = first; addr < last; addr += PAGE_SIZE)
			/* A page that cannot be made now is made at its fault. */
			vmf_insert_pfn_prot(vma, addr,
					    PHYS_PFN(r->pa + obmm_vma_offset(vma, addr)),
					    prot);
	}
}

static long obmm_update_range(struct file *file, void __user *uarg)
{
	struct obmm_region *r = file->private_data;
	struct obmm_cmd_update_range cmd;
	unsigned long granu;
	int ret;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_UPDATE_RANGE, -EFAULT,
				   "failed to load update_range argument");
	if (!obmm_file_cacheable(file))
		return obmm_refuse(OBMM_OP_UPDATE_RANGE, -EINVAL,
				   "Ownership operation is not applicable to o-sync mmap %d.",
				   r->id);
	mutex_lock(&r->mmap_lock);
	granu = obmm_granu_size(r->mmap_granu);
	ret = r->ownership_init ? 0 : -EINVAL;
	mutex_unlock(&r->mmap_lock);
	if (ret)
		return obmm_refuse(OBMM_OP_UPDATE_RANGE, ret,
				   "error updating ownership: ownership of memdev %d not initialized.",
				   r->id);
	if (cmd.start >= cmd.end)
		return obmm_refuse(OBMM_OP_UPDATE_RANGE, -EINVAL,
				   "invalid range: start=%#llx end=%#llx",
				   cmd.start, cmd.end);
	if (!IS_ALIGNED(cmd.start, granu) || !IS_ALIGNED(cmd.end, granu))
		return obmm_refuse(OBMM_OP_UPDATE_RANGE, -EINVAL,
				   "ownership update must be aligned: pid=%d start=%#llx end=%#llx",
				   current->pid, cmd.start, cmd.end);
	ret = obmm_mem_state_check_access(file, cmd.mem_state);
	if (ret)
		return obmm_refuse(OBMM_OP_UPDATE_RANGE, ret,
				   "%s false: vm_flags: %#lx, f_mode: %#x",
				   "validate_perm",
				   obmm_mem_state_vm_flags(cmd.mem_state),
				   (__force unsigned int)file->f_mode);
	if (!obmm_mem_state_valid(cmd.mem_state))
		return obmm_refuse(OBMM_OP_UPDATE_RANGE, -EINVAL,
				   "Invalid mem_state: %#x", cmd.mem_state);
	if (cmd.cache_ops > OBMM_SHM_CACHE_INFER)
		return obmm_refuse_emu(OBMM_OP_UPDATE_RANGE, -EINVAL,
				       "invalid cache_ops %u", cmd.cache_ops);
	mmap_write_lock(current->mm);
	mutex_lock(&r->mmap_lock);
	ret = obmm_update_range_check(r, cmd.start, cmd.end);
	if (!ret)
		ret = obmm_update_range_count(r, cmd.start, cmd.end,
					      cmd.mem_state, cmd.cache_ops);
	if (!ret)
		obmm_update_range_apply(r, cmd.start, cmd.end, cmd.mem_state);
	mutex_unlock(&r->mmap_lock);
	mmap_write_unlock(current->mm);
	return ret;
}

static long obmm_shm_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	if (cmd != OBMM_SHMDEV_UPDATE_RANGE)
		return -ENOTTY;
	return obmm_update_range(file, (void __user *)arg);
}

static const struct file_operations obmm_shm_fops = {
	.owner = THIS_MODULE,
	.open = obmm_shm_open,
	.release = obmm_shm_release,
	.mmap = obmm_shm_mmap,
	.unlocked_ioctl = obmm_shm_ioctl,
#ifdef CONFIG_TRANSPARENT_HUGEPAGE
	.get_unmapped_area = thp_get_unmapped_area,
#endif
	.llseek = noop_llseek,
};

int obmm_shmdev_publish(struct obmm_region *r)
{
	int ret;

	if (!try_module_get(THIS_MODULE))
		return -EPERM;
	r->dev.devt = MKDEV(MAJOR(obmm_shmdev_devt), r->id);
	r->dev.parent = obmm_root;
	r->dev.groups = r->type == OBMM_REGION_EXPORT ? obmm_export_groups :
		obmm_import_groups;
	ret = dev_set_name(&r->dev, "obmm_shmdev%d", r->id);
	if (ret)
		goto err_put;
	cdev_init(&r->cdev, &obmm_shm_fops);
	r->cdev.owner = THIS_MODULE;
	ret = cdev_device_add(&r->cdev, &r->dev);
	if (ret)
		goto err_put;
	r->published = true;
	return 0;
err_put:
	module_put(THIS_MODULE);
	return ret;
}

void obmm_shmdev_unpublish(struct obmm_region *r)
{
	if (!r->published)
		return;
	cdev_device_del(&r->cdev, &r->dev);
	r->published = false;
	module_put(THIS_MODULE);
}

int obmm_shmdev_init(void)
{
	int ret;

	ret = alloc_chrdev_region(&obmm_shmdev_devt, OBMM_MIN_VALID_REGIONID,
				  OBMM_MAX_VALID_REGIONID, "OBMM_SHMDEV");
	if (ret)
		return ret;
	obmm_root = root_device_register("obmm");
	if (IS_ERR(obmm_root)) {
		ret = PTR_ERR(obmm_root);
		goto err_chrdev;
	}
	return 0;

err_chrdev:
	unregister_chrdev_region(obmm_shmdev_devt, OBMM_MAX_VALID_REGIONID);
	return ret;
}

void obmm_shmdev_exit(void)
{
	root_device_unregister(obmm_root);
	unregister_chrdev_region(obmm_shmdev_devt, OBMM_MAX_VALID_REGIONID);
}
