/* SPDX-License-Identifier: MIT */
/*
 * A stand-in for a ubs-mem build's include/ubs_mem.h, ours: only the four calls the testbed's
 * probe (ubse/ubsm_probe.c) makes, with placeholder types.  It lets the cluster test run
 * --ubs-mem's provisioning without a ubs-mem build; it is not ubs-mem.
 */
#ifndef UBSM_STANDIN_H
#define UBSM_STANDIN_H

typedef struct {
	int unused;
} ubsmem_options_t;

typedef struct {
	unsigned int host_num;
} ubsmem_cluster_info_t;

int ubsmem_init_attributes(ubsmem_options_t *opts);
int ubsmem_initialize(const ubsmem_options_t *opts);
int ubsmem_lookup_cluster_statistic(ubsmem_cluster_info_t *info);
int ubsmem_finalize(void);

#endif
