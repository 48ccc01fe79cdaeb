/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ub_compat: interfaces between the module's own files.
 */
#ifndef UB_COMPAT_PRIV_H
#define UB_COMPAT_PRIV_H

#include <linux/kobject.h>
#include <linux/types.h>

#include "testbed_fabric.h"

/* node.c: this node's identity (module parameters), its fabric, its sysfs */
extern int ub_compat_node_id;
u32 ub_compat_cna(void);
u32 ub_compat_eid(void);
struct tb_fabric *ub_compat_fabric(void);
bool ub_compat_fabric_present(void);
/* the node the UB controller sits on: the first online local node */
int ub_compat_controller_nid(void);
unsigned long ub_compat_pool_base(void);
unsigned long ub_compat_pool_size(void);
int ub_compat_node_init(void);
void ub_compat_node_exit(void);
/* /sys/kernel/ub_compat/ */
int ub_compat_sysfs_init(void);
void ub_compat_sysfs_exit(void);

/* pool.c: the memory pfn_range_alloc() hands out */
int ub_compat_pool_init(phys_addr_t base, u64 size, int nid);
void ub_compat_pool_exit(void);
void ub_compat_pool_mapped(phys_addr_t pa, u64 len);

/* numa_remote.c */
int ub_compat_numa_remote_init(void);
void ub_compat_numa_remote_exit(void);

/* ummu.c */
void ub_compat_ummu_exit(void);

/* mm.c */
void ub_compat_mm_init(void);

/* controller.c: /sys/devices/ub_bus_controller<i>/... */
int ub_compat_controller_init(void);
void ub_compat_controller_exit(void);

#endif /* UB_COMPAT_PRIV_H */
