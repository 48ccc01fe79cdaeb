// SPDX-License-Identifier: MIT
/*
 * Whether the ubs-mem SDK answers on this node: initialize it, look up the cluster, print
 * what came back.  Built on a node against the user's ubs-mem build (its include/ and lib/),
 * by obmm.testbed.ubsmem while it waits for ubsmd.  Exit 0 when both calls returned 0.
 */
#include <stdio.h>

#include <ubs_mem.h>

static ubsmem_cluster_info_t info; /* large: not on the stack */

int main(void)
{
	ubsmem_options_t opts;
	int ret = ubsmem_init_attributes(&opts);

	if (ret == 0)
		ret = ubsmem_initialize(&opts);
	if (ret != 0) {
		printf("ubsmem_initialize: %d\n", ret);
		return 1;
	}
	ret = ubsmem_lookup_cluster_statistic(&info);
	printf("ubsmem_lookup_cluster_statistic: %d\n", ret);
	ubsmem_finalize();
	return ret == 0 ? 0 : 1;
}
