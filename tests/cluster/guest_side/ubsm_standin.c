// SPDX-License-Identifier: MIT
/*
 * The stand-in SDK (see ubsm_standin.h): it reaches UBSE the way ubsmd does, by loading
 * /usr/lib64/libubse-client.so.1, and answers 6050 (UBSM_ERR_UBSE) where the real stack would:
 * the library missing (ubsmd's 801) or UBSE's node list failing or short of two nodes (800).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#include "ubs_mem.h"

#define UBSM_ERR_UBSE 6050

static void *g_ubse;

int ubsmem_init_attributes(ubsmem_options_t *opts)
{
	opts->unused = 0;
	return 0;
}

int ubsmem_initialize(const ubsmem_options_t *opts)
{
	(void)opts;
	g_ubse = dlopen("/usr/lib64/libubse-client.so.1", RTLD_LAZY | RTLD_GLOBAL);
	return g_ubse ? 0 : UBSM_ERR_UBSE;
}

int ubsmem_lookup_cluster_statistic(ubsmem_cluster_info_t *info)
{
	int32_t (*node_list)(void **, uint32_t *);
	void *nodes = NULL;
	uint32_t cnt = 0;

	*(void **)&node_list = g_ubse ? dlsym(g_ubse, "ubs_topo_node_list") : NULL;
	if (!node_list || node_list(&nodes, &cnt) != 0 || cnt < 2) {
		free(nodes);
		return UBSM_ERR_UBSE;
	}
	free(nodes);
	info->host_num = cnt;
	return 0;
}

int ubsmem_finalize(void)
{
	if (g_ubse)
		dlclose(g_ubse);
	g_ubse = NULL;
	return 0;
}
