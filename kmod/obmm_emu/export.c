// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: OBMM_CMD_EXPORT, OBMM_CMD_EXPORT_PID and OBMM_CMD_UNEXPORT.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/delay.h>
#include <linux/hugetlb.h>
#include <linux/io.h>
#include <linux/jiffies.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/nodemask.h>
#include <linux/overflow.h>
#include <linux/pid.h>
#include <linux/pid_namespace.h>
#include <linux/random.h>
#include <linux/sched.h>
#include <linux/sched/coredump.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/topology.h>
#include <linux/uaccess.h>

#include "access.h"
#include "export.h"
#include "fabric.h"
#include "import.h"
#include "pool.h"
#include "region.h"
#include "shmdev.h"
#include "testbed_fabric.h"

static u32 obmm_new_tokenid(void)
{
	u32 token;

	do {
		token = get_random_u32() & OBMM_EMU_TOKENID_MASK;
	} while (!token);
	return token;
}

/* Physical package of a node with CPUs, -EINVAL for a node without. */
static int obmm_node_package(int nid)
{
	unsigned int cpu;

	if (nid < 0 || nid >= nr_node_ids || !node_online(nid))
		return -EINVAL;
	cpu = cpumask_first(cpumask_of_node(nid));
	if (cpu >= nr_cpu_ids)
		return -EINVAL;
	return topology_physical_package_id(cpu);
}

static bool obmm_pxm_numa_valid(int pxm_numa)
{
	return pxm_numa >= 0 && pxm_numa <= OBMM_MAX_LOCAL_NUMA_NODES;
}

/* EXPORT checks 1-5: sizes, nodes, pxm_numa. */
static int obmm_export_check_sizes(const struct obmm_cmd_export *cmd,
				   u64 *total)
{
	u64 memseg = obmm_pool_granu();
	int pkg, node_pkg, min_nid = -1, max_nid = 0;
	u64 sum = 0;
	unsigned int i;

	if (cmd->length > OBMM_MAX_LOCAL_NUMA_NODES)
		return obmm_refuse(OBMM_OP_EXPORT, -E2BIG,
				   "Size list is too long: max=%d, actual_length=%lld",
				   OBMM_MAX_LOCAL_NUMA_NODES, (long long)cmd->length);
	if (!obmm_pxm_numa_valid(cmd->pxm_numa))
		return obmm_refuse(OBMM_OP_EXPORT, -EINVAL, "Invalid pxm_numa %d",
				   cmd->pxm_numa);
	for (i = 0; i < cmd->length; i++) {
		if (cmd->size[i] % memseg)
			return obmm_refuse(OBMM_OP_EXPORT, -EINVAL,
					   "The size of new OBMM region 0x%llx on node %d is not aligned to OBMM memseg size %#lx.",
					   cmd->size[i], (int)i, (unsigned long)memseg);
		if (cmd->size[i] && (i >= nr_node_ids || tb_node_unpopulated(i)))
			return obmm_refuse(OBMM_OP_EXPORT, -ENODEV,
					   "Cannot export memory from offlined or remote numa node %d",
					   (int)i);
		if (check_add_overflow(sum, cmd->size[i], &sum))
			return obmm_refuse(OBMM_OP_EXPORT, -EOVERFLOW,
					   "Memory size overflowed!");
	}
	if (!sum)
		return obmm_refuse(OBMM_OP_EXPORT, -EINVAL,
				   "The size of new OBMM region is 0. Non-zero value expected");

	/* One package for the memory nodes and pxm_numa, or two lines. */
	pkg = obmm_node_package(cmd->pxm_numa);
	for (i = 0; i < cmd->length; i++) {
		if (!cmd->size[i])
			continue;
		if (min_nid < 0)
			min_nid = i;
		max_nid = i;
		node_pkg = obmm_node_package(i);
		if (node_pkg < 0 || node_pkg != pkg)
			pkg = -1;
	}
	if (pkg < 0) {
		obmm_klog("Cannot use memory from multiple sockets or memory and ub controller is from different sockets.");
		return obmm_refuse(OBMM_OP_EXPORT, -EINVAL,
				   "memory numa id ranges: [%d, %d], ub controller pxm: %d.",
				   min_nid, max_nid, cmd->pxm_numa);
	}
	*total = sum;
	return 0;
}

/* EXPORT check 8: the per-node allocation; one node carries the pool. */
static int obmm_export_alloc(struct obmm_region *r,
			     const struct obmm_cmd_export *cmd, u64 total)
{
	unsigned int i;

	bool fast = cmd->flags & OBMM_EXPORT_FLAG_FAST;
	int ret;

	/* alloc_export_memory_pool(): every size's granule first. */
	for (i = 0; i < cmd->length; i++)
		if (cmd->size[i] % obmm_pool_granu())
			return obmm_refuse(OBMM_OP_EXPORT, -EINVAL,
					   "invalid size 0x%llx on node %d: not aligned to mempool granu %#lx",
					   cmd->size[i], (int)i, (unsigned long)obmm_pool_granu());
	/* allocate_memory_contiguous(): a node without an allocator. */
	for (i = 0; i < cmd->length; i++)
		if (cmd->size[i] &&
		    (!obmm_pool_present() || i != obmm_pool_nid()))
			return obmm_refuse(OBMM_OP_EXPORT, -ENODEV,
					   "%s:no allocator working on node %d",
					   "allocate_memory_contiguous", (int)i);
	ret = obmm_pool_alloc(total, fast, &r->pa);
	if (ret == -ENOMEM)
		return obmm_refuse(OBMM_OP_EXPORT, ret,
				   "%s: failed to alloc %#llx bytes for node %d",
				   "allocate_memory_contiguous",
				   (unsigned long long)total, obmm_pool_nid());
	if (ret)
		return obmm_refuse_emu(OBMM_OP_EXPORT, ret,
				       "cannot allocate %#llx bytes%s from the pool of node %d",
				       total, fast ? " of cleared memory (FAST)" : "",
				       obmm_pool_nid());
	return 0;
}

static int obmm_export_finish(struct obmm_region *r, const char *op)
{
	int ret;

	r->tokenid = obmm_new_tokenid();
	r->uba = obmm_fabric_make_uba(r->pa);
	/* Emulator: no free record slot is ENOSPC (FIDELITY.md). */
	ret = obmm_ctl_publish_export(r);
	if (ret)
		return obmm_refuse_emu(op, ret,
				   "no free export record slot in the control region (%d per node)",
				   OBMM_EMU_CTL_RECORDS_PER_NODE);
	ret = obmm_shmdev_publish(r);
	if (ret) {
		/* Published a moment: quarantined like any unexport. */
		r->withdrawn_epoch = obmm_ctl_withdraw_export(r);
		return obmm_refuse(op, ret, "Failed to create device %d. ret=%pe",
				   r->id, ERR_PTR(ret));
	}
	obmm_region_activate(r);
	return 0;
}

/*
 * The reply of EXPORT and EXPORT_PID: the outputs written into the
 * caller's copy of the command (of len bytes at cmd) and copied back.  As
 * the real driver: the region stays exported on a copy fault.
 */
static long obmm_export_reply(const struct obmm_region *r, const char *op,
			      void __user *uarg, const void *cmd, size_t len,
			      __u64 *mem_id, __u64 *uba, __u32 *tokenid)
{
	*mem_id = r->id;
	*uba = r->uba;
	*tokenid = r->tokenid;
	if (copy_to_user(uarg, cmd, len)) {
		if (!strcmp(op, OBMM_OP_EXPORT))
			return obmm_refuse(op, -EFAULT,
					   "failed to write export result");
		return obmm_refuse(op, -EFAULT,
				   "failed to write export_pid result.");
	}
	return 0;
}

/*
 * EXPORT and EXPORT_PID after their own argument checks: a new region with
 * the caller's priv, its vendor info checked, and an id.
 */
static struct obmm_region *obmm_export_region_new(const char *op,
						  const void __user *priv,
						  u16 priv_len,
						  const void __user *vendor,
						  u16 vendor_len)
{
	struct obmm_region *r;
	int ret;

	r = obmm_region_alloc(OBMM_REGION_EXPORT);
	if (!r)
		return ERR_PTR(obmm_refuse_emu(op, -ENOMEM, "no memory for a region"));
	ret = obmm_copy_priv(r, priv, priv_len, op);
	if (!ret)
		ret = obmm_check_vendor(vendor, vendor_len, op);
	if (!ret)
		ret = obmm_region_add_id(r, op);
	if (ret) {
		obmm_region_free(r);
		return ERR_PTR(ret);
	}
	return r;
}

long obmm_export_ioctl(void __user *uarg)
{
	struct obmm_cmd_export cmd;
	struct obmm_region *r;
	unsigned int i;
	u64 total;
	int ret;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_EXPORT, -EFAULT,
				   "failed to load export argument");
	ret = obmm_export_check_sizes(&cmd, &total);
	if (ret)
		return ret;
	if (cmd.flags & ~OBMM_EXPORT_FLAG_MASK)
		return obmm_refuse(OBMM_OP_EXPORT, -EINVAL,
				   "undefined flags specified in export flags parameter %#lx.",
				   (unsigned long)cmd.flags);

	r = obmm_export_region_new(OBMM_OP_EXPORT, cmd.priv, cmd.priv_len,
				   cmd.vendor_info, cmd.vendor_len);
	if (IS_ERR(r))
		return PTR_ERR(r);
	ret = obmm_export_alloc(r, &cmd, total);
	if (ret)
		goto err_id;

	r->size = total;
	r->export_flags = cmd.flags;
	r->allow_mmap = cmd.flags & OBMM_EXPORT_FLAG_ALLOW_MMAP;
	r->mem_cap = OBMM_CAP_CACHEABLE | OBMM_CAP_NONCACHEABLE;
	r->pxm_numa = cmd.pxm_numa;
	for (i = 0; i < cmd.length; i++) {
		r->node_mem_size[i] = cmd.size[i];
		if (cmd.size[i])
			r->node_count = i + 1;
	}
	memcpy(r->deid, cmd.deid, sizeof(r->deid));
	ret = obmm_export_finish(r, OBMM_OP_EXPORT);
	if (ret)
		goto err_pool;

	return obmm_export_reply(r, OBMM_OP_EXPORT, uarg, &cmd, sizeof(cmd),
				 &cmd.mem_id, &cmd.uba, &cmd.tokenid);

err_pool:
	obmm_pool_free(r->pa, total, r->withdrawn_epoch);
err_id:
	obmm_region_remove_id(r);
	obmm_region_free(r);
	return ret;
}

static bool obmm_page_is_hugetlb(struct page *page)
{
#ifdef OBMM_HAVE_FOLIO_HUGETLB
	return folio_test_hugetlb(page_folio(page));
#else
	return PageHuge(page);
#endif
}

/*
 * The pages stay pinned until unexport, for DMA by the (emulated) UMMU:
 * a long-term pin, which keeps them out of movable zones and CMA.  The
 * caller holds an mmget() reference of mm.
 */
static long obmm_pin_pages(struct mm_struct *mm, unsigned long va,
			   unsigned long npages, struct page **pages)
{
	const unsigned int gup = FOLL_WRITE | FOLL_LONGTERM;
	long pinned;

	if (mm == current->mm)
		return pin_user_pages_fast(va, npages, gup, pages);
	mmap_read_lock(mm);
#ifdef OBMM_HAVE_PIN_REMOTE_NO_VMAS
	pinned = pin_user_pages_remote(mm, va, npages, gup, pages, NULL);
#else
	pinned = pin_user_pages_remote(mm, va, npages, gup, pages, NULL, NULL);
#endif
	mmap_read_unlock(mm);
	return pinned;
}

/* EXPORT_PID check 6: hugetlbfs pages on local nodes of one package. */
static int obmm_pid_check_pages(struct obmm_region *r)
{
	int pkg = obmm_node_package(r->pxm_numa);
	unsigned long i;
	int nid;

	/* The real order: the pages first, then pxm_numa, then the package. */
	for (i = 0; i < r->npages; i++) {
		if (!obmm_page_is_hugetlb(r->pages[i])) {
			obmm_klog("Only hugetlbfs pages are allowed");
			goto refuse;
		}
		nid = page_to_nid(r->pages[i]);
		if (nid < 0 || nid >= OBMM_MAX_LOCAL_NUMA_NODES) {
			obmm_klog("Invalid node ID %d.", nid);
			goto refuse;
		}
		if (obmm_node_package(nid) != pkg)
			pkg = -1;
	}
	if (!obmm_pxm_numa_valid(r->pxm_numa)) {
		obmm_klog("Invalid pxm_numa %d", r->pxm_numa);
		goto refuse;
	}
	if (pkg >= 0)
		return 0;
refuse:
	return obmm_refuse(OBMM_OP_EXPORT_PID, -EOPNOTSUPP,
			   "hisi workarounds check no passing.");
}

/* EXPORT_PID check 7: every memseg must be physically aligned and whole. */
static int obmm_pid_check_memsegs(struct obmm_region *r)
{
	unsigned long per_seg = obmm_pool_granu() >> PAGE_SHIFT;
	unsigned long i;
	phys_addr_t first;

	if (r->size % obmm_pool_granu())
		return obmm_refuse_emu(OBMM_OP_EXPORT_PID, -EINVAL,
				   "length %#llx not a multiple of memseg size %#llx",
				   r->size, obmm_pool_granu());
	for (i = 0; i < r->npages; i++) {
		if (i % per_seg == 0) {
			first = page_to_phys(r->pages[i]);
			if (!IS_ALIGNED(first, obmm_pool_granu()))
				break;
		} else if (page_to_phys(r->pages[i]) !=
			   first + (i % per_seg) * PAGE_SIZE) {
			break;
		}
	}
	if (i < r->npages)
		return obmm_refuse_emu(OBMM_OP_EXPORT_PID, -EINVAL,
				   "memseg %lu (page %lu) is not physically contiguous and %#llx-aligned",
				   i / per_seg, i, obmm_pool_granu());
	return 0;
}

/* Whether [pa, pa + size) is the export (an import can reach it). */
static bool obmm_pid_pages_contig(struct obmm_region *r)
{
	phys_addr_t first = page_to_phys(r->pages[0]);
	unsigned long i;

	for (i = 1; i < r->npages; i++)
		if (page_to_phys(r->pages[i]) != first + i * PAGE_SIZE)
			return false;
	return true;
}

/*
 * Emulator: whether the caller may pin another process's memory.  The
 * real driver only resolves the pid; the emulator also asks what
 * process_vm_readv() would (the credential part of the ptrace access
 * check): the target runs with the caller's uid and gid and is dumpable,
 * or the caller has CAP_SYS_PTRACE.
 */
static bool obmm_pid_may_access(struct task_struct *task,
				struct mm_struct *mm)
{
	const struct cred *cred = current_cred(), *tcred;
	bool same;

	if (capable(CAP_SYS_PTRACE))
		return true;
	rcu_read_lock();
	tcred = __task_cred(task);
	same = uid_eq(cred->uid, tcred->euid) &&
	       uid_eq(cred->uid, tcred->suid) &&
	       uid_eq(cred->uid, tcred->uid) &&
	       gid_eq(cred->gid, tcred->egid) &&
	       gid_eq(cred->gid, tcred->sgid) &&
	       gid_eq(cred->gid, tcred->gid);
	rcu_read_unlock();
	return same && get_dumpable(mm) == SUID_DUMP_USER;
}

/*
 * EXPORT_PID check 4: the mm of the process with global pid nr (0: the
 * caller), held with mmget() so that it cannot exit under the pin.
 * -ESRCH without such a process or mm, -EPERM when the caller may not
 * access it (emulator rule above).
 */
static int obmm_pid_get_mm(pid_t nr, struct mm_struct **out)
{
	struct task_struct *task;
	struct mm_struct *mm;
	struct pid *pid;
	int ret = 0;

	if (!nr) {
		*out = get_task_mm(current);
		return *out ? 0 : obmm_refuse(OBMM_OP_EXPORT_PID, -ESRCH,
					      "get mm from pid(%d) failed.", nr);
	}
	rcu_read_lock();
	pid = find_pid_ns(nr, &init_pid_ns);
	task = pid ? pid_task(pid, PIDTYPE_PID) : NULL;
	if (task)
		get_task_struct(task);
	rcu_read_unlock();
	if (!task)
		return obmm_refuse(OBMM_OP_EXPORT_PID, -ESRCH,
				   "get tsk from pid(%d) failed.", nr);
	mm = get_task_mm(task);
	if (!mm) {
		ret = obmm_refuse(OBMM_OP_EXPORT_PID, -ESRCH,
				  "get mm from pid(%d) failed.", nr);
	} else if (mm != current->mm && !obmm_pid_may_access(task, mm)) {
		mmput(mm);
		ret = obmm_refuse_emu(OBMM_OP_EXPORT_PID, -EPERM,
				  "the caller may not access pid(%d) (ptrace credential rule)",
				  nr);
	}
	put_task_struct(task);
	*out = ret ? NULL : mm;
	return ret;
}

static void obmm_pages_unpin(struct page **pages, unsigned long npinned,
			     struct mm_struct *mm)
{
	if (npinned)
		unpin_user_pages_dirty_lock(pages, npinned, true);
	atomic64_sub(npinned, &mm->pinned_vm);
}

static void obmm_pid_unpin(struct obmm_region *r, unsigned long npinned)
{
	obmm_pages_unpin(r->pages, npinned, r->mm);
}

/*
 * Unexported EXPORT_PID pages stay pinned like quarantined pool memory:
 * for the pool's quarantine time and until every live peer acknowledged
 * the withdrawal, so that no importer that has not yet revoked its import
 * can reach pages the kernel has handed to someone else.
 */
/* How long unload waits for peers' acknowledgments of quarantined pages. */
#define OBMM_PID_EXIT_ACK_MS	2000

struct obmm_pid_quarantine {
	struct list_head link;
	struct page **pages;
	unsigned long npages;
	struct mm_struct *mm;
	unsigned long release_at;
	u64 epoch;
};

#ifdef OBMM_EMU_TEST
/*
 * Test only (0, the default: off): EXPORT_PID waits this long between
 * taking the target's mm and pinning its pages, so that a test can make
 * the target exit, and be reaped, in that window.  The pin must then still
 * find the whole address space: the mm is held (mmget) across it.  A
 * signal ends the wait.
 */
static unsigned int test_pin_delay_ms;
module_param(test_pin_delay_ms, uint, 0600);
MODULE_PARM_DESC(test_pin_delay_ms,
		 "test only: EXPORT_PID waits this long before pinning (ms, at most 5000)");

static void obmm_pid_test_pin_delay(void)
{
	unsigned int ms = min_t(unsigned int, READ_ONCE(test_pin_delay_ms),
				OBMM_TEST_DELAY_MAX_MS);

	if (ms)
		msleep_interruptible(ms);
}
#else
static void obmm_pid_test_pin_delay(void)
{
}
#endif

static LIST_HEAD(obmm_pid_quarantine_list);
static DEFINE_MUTEX(obmm_pid_quarantine_lock);
static void obmm_pid_quarantine_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(obmm_pid_quarantine_work, obmm_pid_quarantine_fn);

static void obmm_pid_release(struct obmm_pid_quarantine *q)
{
	obmm_pages_unpin(q->pages, q->npages, q->mm);
	kvfree(q->pages);
	mmdrop(q->mm);
	kfree(q);
}

/* Release the entries whose time has come (all with @all). */
static void obmm_pid_quarantine_run(bool all)
{
	unsigned long poll = msecs_to_jiffies(obmm_access_scan_ms());
	struct obmm_pid_quarantine *q, *tmp;
	unsigned long now = jiffies, next = 0, left;
	u64 acked = all ? U64_MAX : obmm_access_acked_epoch();
	LIST_HEAD(done);

	mutex_lock(&obmm_pid_quarantine_lock);
	list_for_each_entry_safe(q, tmp, &obmm_pid_quarantine_list, link) {
		if (all || (time_after_eq(now, q->release_at) &&
			    q->epoch <= acked)) {
			list_move_tail(&q->link, &done);
			continue;
		}
		/* Past its time: an acknowledgment is outstanding. */
		left = time_after_eq(now, q->release_at) ? poll :
		       q->release_at - now;
		if (!next || left < next)
			next = left;
	}
	mutex_unlock(&obmm_pid_quarantine_lock);
	list_for_each_entry_safe(q, tmp, &done, link) {
		list_del(&q->link);
		obmm_pid_release(q);
	}
	if (next && !all)
		schedule_delayed_work(&obmm_pid_quarantine_work, next);
}

static void obmm_pid_quarantine_fn(struct work_struct *work)
{
	obmm_pid_quarantine_run(false);
}

/*
 * The entry is allocated at EXPORT_PID (r->pid_quarantine), so that
 * unexport cannot fail to keep the pages pinned.
 */
static void obmm_pid_quarantine_add(struct obmm_region *r, u64 epoch)
{
	struct obmm_pid_quarantine *q = r->pid_quarantine;
	unsigned long delay = obmm_pool_quarantine_jiffies();

	r->pid_quarantine = NULL;
	q->pages = r->pages;
	q->npages = r->npages;
	q->mm = r->mm;
	q->epoch = epoch;
	q->release_at = jiffies + delay;
	mutex_lock(&obmm_pid_quarantine_lock);
	list_add_tail(&q->link, &obmm_pid_quarantine_list);
	mutex_unlock(&obmm_pid_quarantine_lock);
	schedule_delayed_work(&obmm_pid_quarantine_work, delay);
}

/* Whether every quarantined entry's withdrawal is acknowledged. */
static bool obmm_pid_quarantine_acked(void)
{
	u64 acked = obmm_access_acked_epoch();
	struct obmm_pid_quarantine *q;
	bool all = true;

	mutex_lock(&obmm_pid_quarantine_lock);
	list_for_each_entry(q, &obmm_pid_quarantine_list, link)
		all &= q->epoch <= acked;
	mutex_unlock(&obmm_pid_quarantine_lock);
	return all;
}

/*
 * Module exit, while the node is still ONLINE: the quarantine work stops
 * and every live peer gets a while to acknowledge what is quarantined
 * (each does within its scan period).  Nothing is unpinned yet: the node
 * goes OFFLINE first (obmm_exports_exit()).  Whether all was acknowledged.
 */
bool obmm_exports_exit_wait(void)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(OBMM_PID_EXIT_ACK_MS);

	cancel_delayed_work_sync(&obmm_pid_quarantine_work);
	while (!obmm_pid_quarantine_acked()) {
		if (time_after(jiffies, deadline))
			return false;
		msleep(obmm_access_scan_ms());
	}
	return true;
}

/*
 * Module exit, once the node is OFFLINE: the quarantined pages are let go.
 * What a live peer did not acknowledge waits a peer's longest scan period
 * first, in which it sees the node OFFLINE and revokes every import of it.
 */
void obmm_exports_exit(bool acked)
{
	if (!acked)
		msleep(OBMM_ACCESS_MAX_SCAN_MS);
	obmm_pid_quarantine_run(true);
}

/*
 * Emulator: a length beyond the machine's RAM can never be pinned; refuse
 * it before the page array is sized from it (the real driver allocates
 * first: a kernel WARN from 1 TiB on, a huge allocation below).
 */
static int obmm_pid_check_length(u64 length)
{
	if (length >> PAGE_SHIFT > totalram_pages())
		return obmm_refuse_emu(OBMM_OP_EXPORT_PID, -ENOMEM,
				   "length %#llx exceeds the machine's RAM (%lu pages)",
				   length, totalram_pages());
	return 0;
}

static int obmm_pid_pin(struct obmm_region *r, unsigned long va)
{
	long pinned;

	r->pages = kvcalloc(r->npages, sizeof(*r->pages), OBMM_GFP_SIZED);
	if (!r->pages)
		return obmm_refuse_emu(OBMM_OP_EXPORT_PID, -ENOMEM,
				   "no memory for a page list of %lu pages", r->npages);
	pinned = obmm_pin_pages(r->mm, va, r->npages, r->pages);
	if (pinned < 0)
		return obmm_refuse(OBMM_OP_EXPORT_PID, (int)pinned,
				   "pin memory failed, %d.", (int)pinned);
	atomic64_add(pinned, &r->mm->pinned_vm);
	if (pinned != r->npages) {
		obmm_pid_unpin(r, pinned);
		return obmm_refuse(OBMM_OP_EXPORT_PID, -ENOMEM,
				   "failed to pin user pages(%d/%lu)!", (int)pinned,
				   r->npages);
	}
	return 0;
}

long obmm_export_pid_ioctl(void __user *uarg)
{
	struct obmm_cmd_export_pid cmd;
	struct obmm_region *r;
	struct mm_struct *mm;
	int ret;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_EXPORT_PID, -EFAULT,
				   "Failed to load export_pid param.");
	if (cmd.flags & ~OBMM_EXPORT_FLAG_MASK)
		return obmm_refuse(OBMM_OP_EXPORT_PID, -EINVAL,
				   "invalid flags %#llx encountered in export_user_addr.",
				   cmd.flags);
	if (cmd.flags & OBMM_EXPORT_FLAG_ALLOW_MMAP)
		return obmm_refuse(OBMM_OP_EXPORT_PID, -EINVAL,
				   "ALLOW_MMAP flag is not allowed in export_user_addr.");
	if (cmd.flags & OBMM_EXPORT_FLAG_FAST)
		return obmm_refuse(OBMM_OP_EXPORT_PID, -EINVAL,
				   "FAST flag is not allowed in export_user_addr.");
	if (!cmd.length)
		return obmm_refuse(OBMM_OP_EXPORT_PID, -EINVAL,
				   "export sizeof 0 memory is not allowed.");
	if (cmd.length % PMD_SIZE)
		return obmm_refuse(OBMM_OP_EXPORT_PID, -EINVAL,
				   "export memory size is not aligned to PMD_SIZE.");

	r = obmm_export_region_new(OBMM_OP_EXPORT_PID, cmd.priv, cmd.priv_len,
				   cmd.vendor_info, cmd.vendor_len);
	if (IS_ERR(r))
		return PTR_ERR(r);

	ret = obmm_pid_get_mm(cmd.pid, &mm);
	if (ret)
		goto err_id;
	ret = obmm_pid_check_length(cmd.length);
	if (ret) {
		mmput(mm);
		goto err_id;
	}
	r->mm = mm;
	r->from_user = true;
	r->size = cmd.length;
	r->npages = cmd.length >> PAGE_SHIFT;
	r->pxm_numa = cmd.pxm_numa;
	r->pid_quarantine = kmalloc(sizeof(*r->pid_quarantine), GFP_KERNEL);
	if (!r->pid_quarantine) {
		mmput(mm);
		ret = obmm_refuse_emu(OBMM_OP_EXPORT_PID, -ENOMEM,
				  "no memory for the quarantine entry");
		goto err_id;
	}
	obmm_pid_test_pin_delay();
	ret = obmm_pid_pin(r, (unsigned long)cmd.va);
	/* Pinned (or not): from now on the region needs the mm_struct only. */
	mmgrab(mm);
	mmput(mm);
	if (ret)
		goto err_mm;
	ret = obmm_pid_check_pages(r);
	if (ret)
		goto err_unpin;
	ret = obmm_pid_check_memsegs(r);
	if (ret)
		goto err_unpin;

	/* No shmdev access to user memory: mem_cap stays 0. */
	r->pa = page_to_phys(r->pages[0]);
	r->phys_contig = obmm_pid_pages_contig(r);
	r->mem_cap = 0;
	memcpy(r->deid, cmd.deid, sizeof(r->deid));
	ret = obmm_export_finish(r, OBMM_OP_EXPORT_PID);
	if (ret && r->withdrawn_epoch) {
		/* The record was published: the pages stay pinned a while. */
		obmm_pid_quarantine_add(r, r->withdrawn_epoch);
		r->pages = NULL;
		r->mm = NULL;
		goto err_id;
	}
	if (ret)
		goto err_unpin;

	return obmm_export_reply(r, OBMM_OP_EXPORT_PID, uarg, &cmd, sizeof(cmd),
				 &cmd.mem_id, &cmd.uba, &cmd.tokenid);

err_unpin:
	obmm_pid_unpin(r, r->npages);
err_mm:
	kvfree(r->pages);
	r->pages = NULL;
	mmdrop(r->mm);
err_id:
	kfree(r->pid_quarantine);
	r->pid_quarantine = NULL;
	obmm_region_remove_id(r);
	obmm_region_free(r);
	return ret;
}

static void obmm_export_teardown(struct obmm_region *r)
{
	u64 epoch = obmm_ctl_withdraw_export(r);

	/*
	 * Loopback importers of this export are revoked (their PTEs zapped)
	 * before UNEXPORT returns; remote ones acknowledge at their scan.
	 */
	obmm_imports_revoke_scan();
	obmm_shmdev_unpublish(r);
	if (r->from_user) {
		obmm_pid_quarantine_add(r, epoch);
		r->pages = NULL;
		r->mm = NULL;
	} else {
		obmm_pool_free(r->pa, r->size, epoch);
	}
	obmm_region_remove_id(r);
	obmm_region_free(r);
}

long obmm_unexport_ioctl(void __user *uarg)
{
	struct obmm_cmd_unexport cmd;
	struct obmm_region *r;
	int ret;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return obmm_refuse(OBMM_OP_UNEXPORT, -EFAULT,
				   "failed to load unexport argument");
	ret = obmm_region_deactivate(OBMM_OP_UNEXPORT, cmd.mem_id, cmd.flags,
				     OBMM_UNEXPORT_FLAG_MASK,
				     OBMM_REGION_EXPORT, &r);
	if (ret)
		return ret;
	obmm_export_teardown(r);
	return 0;
}
