/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ub_compat: OLK's numa_remote (remote NUMA nodes that borrowed memory is
 * hot-added to), on a stock kernel.  Implemented in numa_remote.c.
 */
#ifndef UB_COMPAT_LINUX_NUMA_REMOTE_H
#define UB_COMPAT_LINUX_NUMA_REMOTE_H

#include <linux/types.h>

/* add_memory_remote() flags */
#define MEMORY_KEEP_ISOLATED	BIT(0)
#define MEMORY_DIRECT_ONLINE	BIT(1)

bool numa_is_remote_node(int nid);
int add_memory_remote(int nid, u64 start, u64 size, int flags);
int remove_memory_remote(int nid, u64 start, u64 size);
int numa_remote_set_distance(int target, int *node_ids, int *node_distances,
			     int count);

#endif /* UB_COMPAT_LINUX_NUMA_REMOTE_H */
