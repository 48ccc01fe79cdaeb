/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: emulated OBMM driver for obmm-testbed - what every layer
 * shares: the region (struct obmm_region), the export record an import
 * depends on, the constants, and obmm_refuse(), the refusal log.
 *
 * The functions of each file x.c are declared in x.h, and a file includes
 * the headers of exactly the files it calls (tests/host/test_c_layers.py),
 * so its includes show its place in the layers (README.md, "Layers").
 */
#ifndef OBMM_EMU_H
#define OBMM_EMU_H

#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/ioport.h>
#include <linux/kdev_t.h>
#include <linux/mm_types.h>
#include <linux/mutex.h>
#include <linux/printk.h>
#include <linux/refcount.h>
#include <linux/sizes.h>
#include <linux/string.h>
#include <linux/types.h>
#include <linux/version.h>

#include <ub/obmm.h>

#include "obmm_emu_ctl.h"

#define OBMM_EMU_NAME			"obmm_emu"

/* Region ids: one id space for exports and imports, lowest free first. */
#define OBMM_INVALID_REGIONID		0
#define OBMM_MIN_VALID_REGIONID		1
#define OBMM_MAX_VALID_REGIONID		MINORMASK

/*
 * Allocations whose size a request sets (a region's pages, lines, owners):
 * a failure is refused with the driver's own line, never a kernel warning
 * (vmalloc's warn_alloc under fault injection failed the debug campaign).
 */
#define OBMM_GFP_SIZED			(GFP_KERNEL | __GFP_NOWARN)

/* Import address/length granule of the real driver (PMD size, 4K pages). */
#define OBMM_BASIC_GRANU		SZ_2M
/* Default export memseg size (mem_allocator_granu). */
#define OBMM_DEFAULT_MEMSEG_SIZE	SZ_2M
/* Memory block size used when memory hotplug is not configured. */
#define OBMM_EMU_DEFAULT_MEMBLOCK	SZ_128M
/* LOCAL_DISTANCE: base_dist 1..10 is refused for NUMA imports. */
#define OBMM_LOCAL_DISTANCE		10

/* Region memory capabilities (open modes allowed). */
#define OBMM_CAP_CACHEABLE		BIT(0)
#define OBMM_CAP_NONCACHEABLE		BIT(1)

/* "MEMID_" + up to 7 decimal digits + NUL */
#define OBMM_MEMID_NAME_LEN		16

/* UB token ids are 20 bits wide. */
#define OBMM_EMU_TOKENID_MASK		GENMASK(19, 0)

/*
 * The export record an import depends on (emulated UMMU check): the
 * exporter's node, its record slot, and the generation and boot id the
 * record had when the import was made.
 */
struct obmm_pid_quarantine;
struct obmm_preimport;
struct obmm_owner;
struct obmm_vmap;
struct obmm_cache;

struct obmm_export_dep {
	int node;
	int slot;
	u64 generation;
	u64 boot_id;
	u32 flags;		/* the record's, when it was found */
	/* record unreadable (stuck or churning seq) since, when unreadable */
	bool unreadable;
	unsigned long unreadable_since;
};

enum obmm_region_type {
	OBMM_REGION_EXPORT,
	OBMM_REGION_IMPORT,
};

enum obmm_mmap_granu {
	OBMM_MMAP_GRANU_NONE,
	OBMM_MMAP_GRANU_PAGE,
	OBMM_MMAP_GRANU_PMD,
};

enum obmm_mmap_mode {
	OBMM_MMAP_MODE_NONE,
	OBMM_MMAP_MODE_CACHEABLE,
	OBMM_MMAP_MODE_NONCACHEABLE,
};

struct obmm_region {
	struct device dev;
	struct cdev cdev;
	int id;
	enum obmm_region_type type;
	/* 0: being created or destroyed; 1: active; +1 per open shmdev file */
	refcount_t ref;
	bool published;
	u64 size;
	bool allow_mmap;
	unsigned int mem_cap;
	u16 priv_len;
	u8 priv[OBMM_MAX_PRIV_LEN];
	u8 deid[OBMM_EMU_EID_LEN];
	u8 seid[OBMM_EMU_EID_LEN];

	/* mmap state, protected by mmap_lock */
	struct mutex mmap_lock;
	enum obmm_mmap_granu mmap_granu;
	enum obmm_mmap_mode mmap_mode;
	unsigned int mmap_count;
	bool ownership_init;
	/* readers and writers of each granule entry (ownership.c) */
	struct obmm_owner *owners;
	unsigned long nr_owners;
	/*
	 * x86 PAT: a kernel mapping of the whole region in the current
	 * mmap_mode, held while it is mapped, whose memtype reservation
	 * gives the entries installed on touch their caching mode (shmdev.c).
	 */
	void __iomem *pmd_memtype;
	/* coherence=strict: this node's cached copies of its pages (cache.c) */
	struct obmm_cache *cache;
	/* import only: access revoked, new mmaps fail and PTEs are zapped */
	bool revoked;
	/*
	 * The region's own inode, of the module's pseudo filesystem: every
	 * open file of the region maps through its i_mapping, whichever
	 * device node (on whichever filesystem) it was opened by, so that
	 * revocation reaches every mapping with unmap_mapping_range().
	 */
	struct inode *map_inode;

	/* export */
	phys_addr_t pa;
	u64 uba;
	u32 tokenid;
	u64 export_flags;
	int pxm_numa;
	u64 node_mem_size[OBMM_MAX_LOCAL_NUMA_NODES];
	unsigned int node_count;
	bool from_user;
	struct page **pages;
	unsigned long npages;
	struct mm_struct *mm;
	int record_slot;
	u64 withdrawn_epoch;	/* of a record withdrawn by a failed export */
	bool phys_contig;	/* EXPORT_PID: pages physically contiguous */
	/* EXPORT_PID: the entry that keeps the pages pinned after unexport */
	struct obmm_pid_quarantine *pid_quarantine;

	/* import */
	struct resource ubmem_res;	/* "DIRECT_IMPORT_UBMEM" in iomem */
	/* ubmem_res, or the "PREIMPORT_UBMEM" of the declaration it is in */
	struct resource *ubmem;
	/* "MEMID_<id>": child of ubmem (or of the borrowed "System RAM") */
	struct resource memid_res;
	char memid_name[OBMM_MEMID_NAME_LEN];
	u32 scna;
	u32 dcna;
	int numa_id;
	bool numa_remote;
	bool preimport;
	/* NUMA_REMOTE: the range is hot-added (borrow.c lock) */
	bool plugged;
	/*
	 * NUMA_REMOTE: an IMPORT is hot-adding the range (borrow.c lock
	 * held): the revocation scan holds back its acknowledgment as for a
	 * plugged range, since the memory is about to be this kernel's.
	 */
	bool plugging;
	/*
	 * A failed IMPORT whose hot-added memory could not be taken out at
	 * once (offlining interrupted or busy): owned by the unplug thread,
	 * which removes the memory, then the region (import.c).
	 */
	bool orphan;
	struct obmm_preimport *pre;	/* PREIMPORT: its declaration */
	struct obmm_export_dep dep;
	bool tracked;		/* under the revocation scan */
};

/*
 * The refusal log.  A refused call logs the real driver's line for that
 * check: its level (pr_err), its prefix (obmm_core.h's pr_fmt, "OBMM: ")
 * and its format, as the table obmm.driver_log lists them with their
 * drivers/ub/obmm/<file>.c:<function> (tests/host/tools/test_refusal_lines.py
 * holds every call below to it):
 *
 *   return obmm_refuse(OBMM_OP_IMPORT, -EINVAL, "PA=0 unexpected.");
 *
 * logs "OBMM: PA=0 unexpected." and evaluates to its errno, so it replaces
 * a plain return.  Where the real driver logs a second line for the same
 * refusal (its caller's), obmm_klog() logs it, in the real order.
 *
 * A refusal the real driver makes silently, or a check only the emulator
 * makes, logs the emulator's own line, marked as such and naming the
 * operation and errno (obmm.driver_log.EMULATOR_OWN says why for each):
 *
 *   OBMM: emulator: IMPORT refused (-EACCES): no live export covers ...
 *
 * Lines are rate-limited per call site (printk_ratelimit defaults: 10 per
 * 5 s; the real driver's are not), so a flood of bad calls cannot flood
 * the log.  The operation name of obmm_refuse() goes to a pr_debug line.
 */
#define OBMM_LOG_PREFIX		"OBMM: "

/* An EID in the real driver's log lines: its high and low 64 bits. */
#define OBMM_EID_FMT64			"%#llx:%#llx"
#define OBMM_EID_ARGS64(eid)		obmm_eid_half(eid, 8), obmm_eid_half(eid, 0)

static inline u64 obmm_eid_half(const u8 *eid, unsigned int off)
{
	u64 half;

	memcpy(&half, eid + off, sizeof(half));
	return half;
}

#define obmm_klog(fmt, ...)						\
	printk_ratelimited(KERN_ERR OBMM_LOG_PREFIX fmt "\n", ##__VA_ARGS__)

#define obmm_refuse(op, err, fmt, ...)					\
({									\
	int __obmm_err = (err);						\
									\
	obmm_klog(fmt, ##__VA_ARGS__);					\
	pr_debug("%s refused (%pe)\n", (op), ERR_PTR(__obmm_err));	\
	__obmm_err;							\
})

#define obmm_refuse_emu(op, err, fmt, ...)				\
({									\
	int __obmm_err = (err);						\
									\
	obmm_klog("emulator: %s refused (%pe): " fmt, (op),		\
		  ERR_PTR(__obmm_err), ##__VA_ARGS__);			\
	__obmm_err;							\
})

/* Operation names of the refusal log (the ioctl names without OBMM_CMD_). */
#define OBMM_OP_EXPORT			"EXPORT"
#define OBMM_OP_EXPORT_PID		"EXPORT_PID"
#define OBMM_OP_UNEXPORT		"UNEXPORT"
#define OBMM_OP_IMPORT			"IMPORT"
#define OBMM_OP_UNIMPORT		"UNIMPORT"
#define OBMM_OP_ADDR_QUERY		"ADDR_QUERY"
#define OBMM_OP_DECLARE_PREIMPORT	"DECLARE_PREIMPORT"
#define OBMM_OP_UNDECLARE_PREIMPORT	"UNDECLARE_PREIMPORT"
#define OBMM_OP_UPDATE_RANGE		"SHMDEV_UPDATE_RANGE"
#define OBMM_OP_MMAP			"SHMDEV_MMAP"
#define OBMM_OP_OPEN			"SHMDEV_OPEN"

static inline struct obmm_region *to_obmm_region(struct device *dev)
{
	return container_of(dev, struct obmm_region, dev);
}

/*
 * Test hooks (module parameters test_*, each a delay that widens a race
 * window for a guest test) exist only in the build the project's suites
 * load: make ... OBMM_EMU_TEST=y (Kbuild: -DOBMM_EMU_TEST).  The module
 * users load has none.  Every delay is bounded.
 */
#define OBMM_TEST_DELAY_MAX_MS		5000

#endif /* OBMM_EMU_H */
