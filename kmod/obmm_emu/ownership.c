// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: ownership of region memory - who may read and write each
 * granule entry (page, or 2 MiB for PMD mappings) of a mapping, and the
 * region's reader and writer counts per entry, as OBMM_SHMDEV_UPDATE_RANGE
 * and mmap keep them (the real driver's obmm_ownership.c and
 * obmm_shm_dev.c).
 *
 * The real driver splits a VMA at the bounds of an UPDATE_RANGE and gives
 * each piece its access in vm_flags.  split_vma() is not for modules, so
 * here each mmap() keeps the mem_state (cache and access bits) of each of
 * its entries in a struct obmm_vmap, shared by the VMAs a split makes of
 * it.  A VMA then has the union of its entries' access in vm_flags, and
 * each entry's page-table entries have the entry's own (shmdev.c).
 *
 * Counters: u16 readers and writers per entry of the region, for its
 * cacheable mappings; one that would pass U16_MAX fails with -EOVERFLOW
 * (the newest obmm_ownership.c:update_page_ownership()) and leaves every
 * count as it was.  Everything here runs under the region's mmap_lock.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/limits.h>
#include <linux/mm.h>
#include <linux/overflow.h>
#include <linux/slab.h>

#include "ownership.h"

/* Readers and writers of one granule entry. */
struct obmm_owner {
	u16 readers;
	u16 writers;
};

/*
 * One mmap() of a region: the mem_state of each entry it maps, region
 * entries [first, first + nr).  Shared by the VMAs a split makes of it.
 *
 * cover[i]: how many VMAs map entry i, the pieces of a split counted as
 * the one VMA they were: mremap() copies a VMA (.open on the copy) and, when
 * the move fails (.mremap refuses it, copy_vma()'s link or
 * move_page_tables() runs out of memory), unmaps the copy again (.close),
 * and that close must release none of the entries the original still maps.
 */
struct obmm_vmap {
	struct obmm_region *r;
	refcount_t ref;
	unsigned long first;
	unsigned long nr;
	bool counted;		/* cacheable: in the region's counters */
	u8 *cover;		/* nr counts, after state[] */
	u8 state[];
};

bool obmm_state_reader(u8 state)
{
	return (state & OBMM_SHM_MEM_ACCESS_MASK) != OBMM_SHM_MEM_NO_ACCESS;
}

bool obmm_state_writer(u8 state)
{
	return (state & OBMM_SHM_MEM_ACCESS_MASK) == OBMM_SHM_MEM_READWRITE;
}

/* The mem_state a new mapping's vm_flags give its entries. */
u8 obmm_mem_state_of(vm_flags_t flags, bool cacheable)
{
	u8 state;

	if (flags & VM_WRITE)
		state = OBMM_SHM_MEM_READWRITE;
	else if (flags & VM_READ)
		state = flags & VM_EXEC ? OBMM_SHM_MEM_READEXEC :
			OBMM_SHM_MEM_READONLY;
	else
		return OBMM_SHM_MEM_NO_ACCESS;
	return state | (cacheable ? OBMM_SHM_MEM_NORMAL : OBMM_SHM_MEM_NORMAL_NC);
}

/* The vm_flags (of OBMM_UPDATE_VM_FLAGS) an entry's access needs. */
vm_flags_t obmm_state_vm_flags(u8 state)
{
	switch (state & OBMM_SHM_MEM_ACCESS_MASK) {
	case OBMM_SHM_MEM_READWRITE:
		return VM_READ | VM_WRITE | VM_MAYREAD | VM_MAYWRITE;
	case OBMM_SHM_MEM_READEXEC:
	case OBMM_SHM_MEM_READONLY:
		return VM_READ | VM_MAYREAD;
	default:
		return 0;
	}
}

/*
 * The region's counters, one per entry of the mapping's granule, made at
 * its first cacheable mapping.  A mapping that fails after they were made
 * does not fix the region's granule (r->mmap_granu), so the next mapping
 * may use the other one: counters made for another granule then count
 * nothing (the failed mapping took its counts back) and are made again.
 */
static int obmm_owners_get(struct obmm_region *r, unsigned int shift)
{
	if (r->owners && r->nr_owners == r->size >> shift)
		return 0;
	obmm_ownership_free(r);
	r->nr_owners = r->size >> shift;
	r->owners = kvcalloc(r->nr_owners, sizeof(*r->owners), OBMM_GFP_SIZED);
	return r->owners ? 0 : -ENOMEM;
}

void obmm_ownership_free(struct obmm_region *r)
{
	kvfree(r->owners);
	r->owners = NULL;
}

/* obmm_ownership.c:merge_cache_ops(): WB_ONLY + INVAL = WB_INVAL. */
static u8 obmm_cache_ops_merge(u8 a, u8 b)
{
	if (a == OBMM_SHM_CACHE_NONE)
		return b;
	if (b == OBMM_SHM_CACHE_NONE || a == b)
		return a;
	return OBMM_SHM_CACHE_WB_INVAL;
}

/*
 * The cache maintenance a move of counts asks for
 * (obmm_ownership.c:update_page_ownership): the last writer gone, write
 * back (and invalidate when no reader is left); the last reader gone,
 * invalidate.
 */
static u8 obmm_owner_cache_op(u16 old_w, u16 old_r, u16 new_w, u16 new_r)
{
	if (old_w && !new_w)
		return new_r ? OBMM_SHM_CACHE_WB_ONLY : OBMM_SHM_CACHE_WB_INVAL;
	if (old_r && !new_r && !new_w)
		return OBMM_SHM_CACHE_INVAL;
	return OBMM_SHM_CACHE_NONE;
}

/*
 * Move one entry's counts from @old to @new, merging the cache maintenance
 * that asks for into *@ops; nothing changes on error.
 */
static int obmm_owner_move(struct obmm_owner *o, unsigned long entry,
			   u8 old, u8 new, u8 *ops)
{
	u16 writers = o->writers, readers = o->readers;

	if (obmm_state_writer(old))
		writers--;
	if (obmm_state_reader(old))
		readers--;
	if (obmm_state_writer(new)) {
		if (writers == U16_MAX) {
			pr_err("obmm ownership: writer count overflow at pgoff=%lu\n",
			       entry);
			return -EOVERFLOW;
		}
		writers++;
	}
	if (obmm_state_reader(new)) {
		if (readers == U16_MAX) {
			pr_err("obmm ownership: reader count overflow at pgoff=%lu\n",
			       entry);
			return -EOVERFLOW;
		}
		readers++;
	}
	*ops = obmm_cache_ops_merge(*ops, obmm_owner_cache_op(o->writers,
							      o->readers,
							      writers, readers));
	o->writers = writers;
	o->readers = readers;
	return 0;
}

/*
 * Count vmap entries [from, to) (indexes into state[]) as @new instead of
 * their state, all or none; the states themselves are not changed
 * (obmm_vmap_commit()).  @undo takes back such a move.  The cache
 * maintenance the move asks for is merged into *@ops.
 */
static int obmm_vmap_count(struct obmm_vmap *vm, unsigned long from,
			   unsigned long to, u8 new, bool undo, u8 *ops)
{
	unsigned long i, entry;
	u8 ignored = OBMM_SHM_CACHE_NONE;
	int ret;

	if (!vm->counted)
		return 0;
	/* Counters of another granule than this mapping's would be overrun. */
	if (WARN_ON_ONCE(vm->first + to > vm->r->nr_owners))
		return -EINVAL;
	for (i = from; i < to; i++) {
		entry = vm->first + i;
		ret = undo ? obmm_owner_move(&vm->r->owners[entry], entry, new,
					     vm->state[i], &ignored) :
			     obmm_owner_move(&vm->r->owners[entry], entry,
					     vm->state[i], new, ops);
		if (ret) {
			WARN_ON(undo);
			if (i > from)
				obmm_vmap_count(vm, from, i, new, true, ops);
			return ret;
		}
	}
	return 0;
}

struct obmm_vmap *obmm_vmap_new(struct obmm_region *r, unsigned long first,
				unsigned long nr, unsigned int shift, u8 state,
				bool counted)
{
	u8 ops = OBMM_SHM_CACHE_NONE;
	struct obmm_vmap *vm;
	int ret;

	if (counted) {
		ret = obmm_owners_get(r, shift);
		if (ret)
			return ERR_PTR(ret);
	}
	vm = kvzalloc(struct_size(vm, state, array_size(nr, 2)), OBMM_GFP_SIZED);
	if (!vm)
		return ERR_PTR(-ENOMEM);
	vm->cover = vm->state + nr;
	memset(vm->cover, 1, nr);
	vm->r = r;
	refcount_set(&vm->ref, 1);
	vm->first = first;
	vm->nr = nr;
	vm->counted = counted;
	memset(vm->state, OBMM_SHM_MEM_NO_ACCESS, nr);
	ret = obmm_vmap_count(vm, 0, nr, state, false, &ops);
	if (ret) {
		kvfree(vm);
		return ERR_PTR(ret);
	}
	memset(vm->state, state, nr);
	return vm;
}

struct obmm_region *obmm_vmap_region(const struct obmm_vmap *vm)
{
	return vm->r;
}

void obmm_vmap_get(struct obmm_vmap *vm)
{
	refcount_inc(&vm->ref);
}

void obmm_vmap_put(struct obmm_vmap *vm)
{
	if (refcount_dec_and_test(&vm->ref))
		kvfree(vm);
}

/* Index in state[] of region entry @entry (which the vmap maps). */
static unsigned long obmm_vmap_index(const struct obmm_vmap *vm,
				     unsigned long entry)
{
	return entry - vm->first;
}

u8 obmm_vmap_state(const struct obmm_vmap *vm, unsigned long entry)
{
	return vm->state[obmm_vmap_index(vm, entry)];
}

/* One more VMA (a copy mremap() made) maps region entries [from, to). */
void obmm_vmap_cover(struct obmm_vmap *vm, unsigned long from,
		     unsigned long to)
{
	unsigned long i, end = obmm_vmap_index(vm, to);

	for (i = obmm_vmap_index(vm, from); i < end; i++)
		if (!WARN_ON_ONCE(vm->cover[i] == U8_MAX))
			vm->cover[i]++;
}

/*
 * A VMA mapping region entries [from, to) closes: the entries no other
 * VMA maps are released, and the cache maintenance their release asks for
 * is returned (OBMM_SHM_CACHE_*).
 */
u8 obmm_vmap_release(struct obmm_vmap *vm, unsigned long from,
		     unsigned long to)
{
	unsigned long i, end = obmm_vmap_index(vm, to);
	u8 ops = OBMM_SHM_CACHE_NONE;

	for (i = obmm_vmap_index(vm, from); i < end; i++) {
		if (WARN_ON_ONCE(!vm->cover[i]) || --vm->cover[i])
			continue;
		WARN_ON(obmm_vmap_count(vm, i, i + 1, OBMM_SHM_MEM_NO_ACCESS,
					false, &ops));
		vm->state[i] = OBMM_SHM_MEM_NO_ACCESS;
	}
	return ops;
}

/* The cache maintenance the move asks for is merged into *@ops. */
int obmm_vmap_move(struct obmm_vmap *vm, unsigned long from, unsigned long to,
		   u8 new, u8 *ops)
{
	return obmm_vmap_count(vm, obmm_vmap_index(vm, from),
			       obmm_vmap_index(vm, to), new, false, ops);
}

void obmm_vmap_unmove(struct obmm_vmap *vm, unsigned long from,
		      unsigned long to, u8 new)
{
	u8 ignored = OBMM_SHM_CACHE_NONE;

	obmm_vmap_count(vm, obmm_vmap_index(vm, from), obmm_vmap_index(vm, to),
			new, true, &ignored);
}

void obmm_vmap_commit(struct obmm_vmap *vm, unsigned long from,
		      unsigned long to, u8 new)
{
	unsigned long i = obmm_vmap_index(vm, from);

	memset(vm->state + i, new, obmm_vmap_index(vm, to) - i);
}

/* The access vm_flags region entries [from, to) need together. */
vm_flags_t obmm_vmap_vm_flags(const struct obmm_vmap *vm, unsigned long from,
			      unsigned long to)
{
	unsigned long i, end = obmm_vmap_index(vm, to);
	vm_flags_t flags = 0;

	for (i = obmm_vmap_index(vm, from); i < end; i++)
		flags |= obmm_state_vm_flags(vm->state[i]);
	return flags;
}
