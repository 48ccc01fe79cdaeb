/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: emulated OBMM driver for obmm-testbed - internal interfaces.
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
#include <linux/types.h>
#include <linux/version.h>

#include <ub/obmm.h>

#include "obmm_emu_ctl.h"

#define OBMM_EMU_NAME			"obmm_emu"

/* Region ids: one id space for exports and imports, lowest free first. */
#define OBMM_INVALID_REGIONID		0
#define OBMM_MIN_VALID_REGIONID		1
#define OBMM_MAX_VALID_REGIONID		MINORMASK

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

struct obmm_export_dep {
	int node;
	int slot;
	u64 generation;
	u64 boot_id;
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
	 * PMD granule on x86 PAT: a kernel mapping of the whole region in
	 * the current mmap_mode, held while it is mapped, whose memtype
	 * reservation gives the huge entries their caching mode (shmdev.c).
	 */
	void __iomem *pmd_memtype;
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
 * The refusal log.  Every refused ioctl leaves one kernel log line that
 * names the operation, the errno, the check and the offending values, the
 * real driver's wording where it logs one:
 *
 *   obmm_emu: IMPORT refused (-EINVAL): PA=0 unexpected
 *
 * Write each refusal where its check is made, as
 *
 *   return obmm_refuse("IMPORT", -EINVAL, "PA=0 unexpected");
 *
 * The macro evaluates to its errno, so it replaces a plain return.  Lines
 * are rate-limited per call site (printk_ratelimit defaults: 10 per 5 s),
 * so a flood of bad calls cannot flood the log.  One refusal, one line:
 * a helper that logs takes the operation's name; its caller does not log.
 */
#define obmm_refuse(op, err, fmt, ...)					\
({									\
	int __obmm_err = (err);						\
									\
	pr_err_ratelimited("%s refused (%pe): " fmt "\n", (op),	\
			   ERR_PTR(__obmm_err), ##__VA_ARGS__);		\
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

/* core.c */
extern int obmm_emu_node_id;

/* region.c */
struct obmm_region *obmm_region_alloc(enum obmm_region_type type);
void obmm_region_free(struct obmm_region *r);
int obmm_region_add_id(struct obmm_region *r, const char *op);
void obmm_region_remove_id(struct obmm_region *r);
void obmm_region_activate(struct obmm_region *r);
int obmm_region_deactivate(const char *op, u64 mem_id, u64 flags,
			   u64 valid_flags, enum obmm_region_type type,
			   struct obmm_region **out);
void obmm_region_reactivate(struct obmm_region *r);
struct obmm_region *obmm_region_get_by_id(int id, int *err);
void obmm_region_put(struct obmm_region *r);
int obmm_copy_priv(struct obmm_region *r, const void __user *priv, u16 len,
		   const char *op);
int obmm_check_vendor(const void __user *vendor, u16 len, const char *op);
long obmm_addr_query_ioctl(void __user *uarg);
void obmm_regions_init(void);
void obmm_regions_exit(void);
int obmm_region_fs_init(void);
void obmm_region_fs_exit(void);

/* pool.c */
int obmm_pool_init(phys_addr_t win_size, unsigned int scan_ms);
void obmm_pool_exit(void);
bool obmm_pool_present(void);
int obmm_pool_nid(void);
u64 obmm_pool_granu(void);
int obmm_pool_alloc(u64 size, bool fast, phys_addr_t *pa);
void obmm_pool_free(phys_addr_t pa, u64 size, u64 epoch);
void obmm_pool_stats(u64 *total, u64 *used, u64 *cleared, u64 *uncleared);
phys_addr_t obmm_pool_base(void);
u64 obmm_pool_size(void);
int obmm_pool_parse_params(void);
u64 obmm_pool_quarantined(void);
unsigned long obmm_pool_quarantine_jiffies(void);

/* export.c */
long obmm_export_ioctl(void __user *uarg);
long obmm_export_pid_ioctl(void __user *uarg);
long obmm_unexport_ioctl(void __user *uarg);
void obmm_exports_exit(void);

/* import.c */
long obmm_import_ioctl(void __user *uarg);
long obmm_unimport_ioctl(void __user *uarg);
long obmm_declare_preimport_ioctl(void __user *uarg);
long obmm_undeclare_preimport_ioctl(void __user *uarg);
int obmm_imports_init(void);
void obmm_imports_exit(void);
unsigned long obmm_imports_revoke_scan(void);
bool obmm_imports_own_borrow_pending(void);
ssize_t obmm_imports_show_revoked(char *buf);

/* shmdev.c */
int obmm_shmdev_init(void);
void obmm_shmdev_exit(void);
int obmm_shmdev_publish(struct obmm_region *r);
void obmm_shmdev_unpublish(struct obmm_region *r);
struct device *obmm_shmdev_root(void);
void obmm_shmdev_revoke(struct obmm_region *r);
bool obmm_shmdev_revoked(struct obmm_region *r);

/* ownership.c: per-mapping access and per-entry ownership counters */
bool obmm_state_reader(u8 state);
bool obmm_state_writer(u8 state);
u8 obmm_mem_state_of(vm_flags_t flags, bool cacheable);
vm_flags_t obmm_state_vm_flags(u8 state);
void obmm_ownership_free(struct obmm_region *r);
struct obmm_vmap *obmm_vmap_new(struct obmm_region *r, unsigned long first,
				unsigned long nr, unsigned int shift, u8 state,
				bool counted);
struct obmm_region *obmm_vmap_region(const struct obmm_vmap *vm);
void obmm_vmap_get(struct obmm_vmap *vm);
void obmm_vmap_put(struct obmm_vmap *vm);
void obmm_vmap_refuse_copy(struct obmm_vmap *vm, struct vm_area_struct *copy);
bool obmm_vmap_is_refused_copy(struct obmm_vmap *vm,
			       struct vm_area_struct *vma);
u8 obmm_vmap_state(const struct obmm_vmap *vm, unsigned long entry);
void obmm_vmap_release(struct obmm_vmap *vm, unsigned long from,
		       unsigned long to);
int obmm_vmap_move(struct obmm_vmap *vm, unsigned long from, unsigned long to,
		   u8 new);
void obmm_vmap_unmove(struct obmm_vmap *vm, unsigned long from,
		      unsigned long to, u8 new);
void obmm_vmap_commit(struct obmm_vmap *vm, unsigned long from,
		      unsigned long to, u8 new);
vm_flags_t obmm_vmap_vm_flags(const struct obmm_vmap *vm, unsigned long from,
			      unsigned long to);

/* fabric.c */
int obmm_fabric_init(void);
const struct tb_fabric_window *obmm_fabric_own_window(void);
void obmm_fabric_start(phys_addr_t pool_base, u64 pool_size);
void obmm_fabric_stop(void);
void obmm_fabric_exit(void);
bool obmm_fabric_enabled(void);
u32 obmm_fabric_cna(void);
u32 obmm_fabric_eid(void);
const struct tb_fabric_window *obmm_fabric_window(int node);
phys_addr_t obmm_fabric_ctl_base(void);
u64 obmm_fabric_ctl_size(void);
struct tb_fabric *obmm_fabric_tb(void);
u64 obmm_fabric_make_uba(phys_addr_t pa);
int obmm_ctl_publish_export(struct obmm_region *r);
u64 obmm_ctl_withdraw_export(struct obmm_region *r);
u64 obmm_fabric_withdraw_epoch(void);
void obmm_ctl_write_ack(int node, u64 boot_id, u64 epoch);
int obmm_fabric_window_node(phys_addr_t start, u64 len, u64 *offset);
u64 obmm_fabric_boot_id(void);
bool obmm_ctl_read_node(int node, struct obmm_emu_ctl_node *out);
bool obmm_ctl_read_record(int node, int slot,
			  struct obmm_emu_ctl_export *out);
u32 obmm_ctl_record_state(int node, int slot);

/* access.c: emulated UMMU access control and revocation */
/* What the UMMU asks of the importer's side (import.c; wired by core.c). */
struct obmm_access_ops {
	/* revoke what lost its export; bit j: node j's records unsure */
	unsigned long (*revoke_scan)(void);
	/* a loopback borrow of withdrawn memory is still being unplugged */
	bool (*own_borrow_pending)(void);
};

void obmm_access_register(const struct obmm_access_ops *ops);
void obmm_access_start(void);
void obmm_access_stop(void);
u64 obmm_access_acked_epoch(void);
unsigned int obmm_access_scan_ms(void);
/* The live export record covering the range, if any (no tokenid check). */
bool obmm_access_find_export(phys_addr_t addr, u64 len,
			     struct obmm_export_dep *dep);
const char *obmm_access_dep_lost(struct obmm_export_dep *dep,
				 bool *unsure);

/* borrow.c: NUMA_REMOTE memory hot-plug */
u64 obmm_memory_block_bytes(void);
void obmm_borrow_init(void);
int obmm_borrow_lock_killable(void);
bool obmm_borrow_trylock(void);
void obmm_borrow_unlock(void);
bool obmm_borrow_node_remote(int nid);
int obmm_borrow_claim_node(int nid);
void obmm_borrow_release_node_locked(int nid);
int obmm_borrow_add_locked(struct obmm_region *r, int nid);
int obmm_borrow_remove_locked(struct obmm_region *r, bool keep_memid);
struct resource *obmm_borrow_ram_res(struct obmm_region *r);

/* ubc.c: the emulated UB controllers and bus */
int obmm_ubc_init(void);
void obmm_ubc_exit(void);
bool obmm_ubc_known_cna(u32 cna);
u64 obmm_ubc_feature(void);

/* sysfs.c */
extern const struct attribute_group *obmm_export_groups[];
extern const struct attribute_group *obmm_import_groups[];
int obmm_sysfs_init(void);
void obmm_sysfs_exit(void);

#endif /* OBMM_EMU_H */
