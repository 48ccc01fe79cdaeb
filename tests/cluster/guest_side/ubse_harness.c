// SPDX-License-Identifier: MIT
/*
 * Calls libubse-client.so.1 the way ubsmd does: dlopen by path, dlsym the 26 functions (all
 * required: ubs-mem src/under_api/ubse/ubse_mem_adapter.cpp:UbseMemAdapter::DlopenLibUbse),
 * then the shared-memory calls ubsmd makes for allocate / map / unmap / deallocate
 * (ShmCreateWithProvider, ShmAttach, ShmDetach, ShmDelete), mapping /dev/obmm_shmdev<memid>
 * per block as the SDK does.  One command per run, one JSON line out:
 *
 *   ubse_harness [--lib PATH] symbols | local | nodes | list
 *   ubse_harness create NAME SIZE REGION PROVIDER     (lists: 1,2 | - for NULL | none: count 0)
 *   ubse_harness create-lender NAME SIZE SLOT
 *   ubse_harness attach|get|detach|delete NAME
 *   ubse_harness fill NAME SEED                       (attach, write the pattern with O_SYNC)
 *   ubse_harness read NAME SEED [sync]                (attach, check the pattern)
 *
 * Built against ubse/ubse_client.h (the testbed's own header).  Exit 0 when the call was made
 * (its code is "ret"), 2 on a usage error, 3 when the library or a symbol is missing.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ubse_client.h"

#define DEFAULT_LIB "/usr/lib64/libubse-client.so.1"

static struct {
	int32_t (*client_initialize)(const char *);
	void (*client_finalize)(void);
	int32_t (*node_list)(ubs_topo_node_t **, uint32_t *);
	int32_t (*node_local_get)(ubs_topo_node_t *);
	int32_t (*link_list)(ubs_topo_link_t **, uint32_t *);
	int32_t (*numastat_get)(uint32_t, ubs_mem_numastat_t **, uint32_t *);
	void *fd_create, *fd_create_with_lender, *fd_create_with_candidate, *fd_permission;
	void *fd_get, *fd_delete, *numa_create, *numa_create_with_lender;
	void *numa_create_with_candidate, *numa_get, *numa_delete;
	int32_t (*shm_create)(const char *, uint64_t, uint8_t *, uint64_t, const ubs_mem_nodes_t *,
			      const ubs_mem_nodes_t *);
	int32_t (*shm_create_with_lender)(const char *, uint8_t *, uint64_t,
					  const ubs_mem_nodes_t *, const ubs_mem_lender_t *);
	void *shm_create_with_affinity;
	int32_t (*shm_attach)(const char *, const ubs_mem_fd_owner_t *, mode_t,
			      ubs_mem_shm_desc_t **);
	int32_t (*shm_get)(const char *, ubs_mem_shm_desc_t **);
	int32_t (*shm_list)(ubs_mem_shm_desc_t **, uint32_t *);
	int32_t (*shm_detach)(const char *);
	int32_t (*shm_delete)(const char *);
	void (*log_register)(ubs_engine_log_handler);
} api;

static const struct {
	const char *name;
	void **slot;
} SYMBOLS[] = {
	{ "ubs_engine_client_initialize", (void **)&api.client_initialize },
	{ "ubs_engine_client_finalize", (void **)&api.client_finalize },
	{ "ubs_topo_node_list", (void **)&api.node_list },
	{ "ubs_topo_node_local_get", (void **)&api.node_local_get },
	{ "ubs_topo_link_list", (void **)&api.link_list },
	{ "ubs_mem_numastat_get", (void **)&api.numastat_get },
	{ "ubs_mem_fd_create", &api.fd_create },
	{ "ubs_mem_fd_create_with_lender", &api.fd_create_with_lender },
	{ "ubs_mem_fd_create_with_candidate", &api.fd_create_with_candidate },
	{ "ubs_mem_fd_permission", &api.fd_permission },
	{ "ubs_mem_fd_get", &api.fd_get },
	{ "ubs_mem_fd_delete", &api.fd_delete },
	{ "ubs_mem_numa_create", &api.numa_create },
	{ "ubs_mem_numa_create_with_lender", &api.numa_create_with_lender },
	{ "ubs_mem_numa_create_with_candidate", &api.numa_create_with_candidate },
	{ "ubs_mem_numa_get", &api.numa_get },
	{ "ubs_mem_numa_delete", &api.numa_delete },
	{ "ubs_mem_shm_create", (void **)&api.shm_create },
	{ "ubs_mem_shm_create_with_lender", (void **)&api.shm_create_with_lender },
	{ "ubs_mem_shm_create_with_affinity", &api.shm_create_with_affinity },
	{ "ubs_mem_shm_attach", (void **)&api.shm_attach },
	{ "ubs_mem_shm_get", (void **)&api.shm_get },
	{ "ubs_mem_shm_list", (void **)&api.shm_list },
	{ "ubs_mem_shm_detach", (void **)&api.shm_detach },
	{ "ubs_mem_shm_delete", (void **)&api.shm_delete },
	{ "ubs_engine_log_callback_register", (void **)&api.log_register },
};
#define NSYMBOLS (sizeof(SYMBOLS) / sizeof(SYMBOLS[0]))

static void on_log(uint32_t level, const char *message)
{
	fprintf(stderr, "ubse log %u: %s\n", level, message);
}

static int load(const char *path)
{
	void *handle = dlopen(path, RTLD_LAZY | RTLD_GLOBAL);

	if (!handle) {
		printf("{\"ret\": 801, \"missing\": \"%s\"}\n", path);
		fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
		return -1;
	}
	for (size_t i = 0; i < NSYMBOLS; i++) {
		*SYMBOLS[i].slot = dlsym(handle, SYMBOLS[i].name);
		if (!*SYMBOLS[i].slot) {
			printf("{\"ret\": 801, \"missing\": \"%s\"}\n", SYMBOLS[i].name);
			return -1;
		}
	}
	api.log_register(on_log);
	return 0;
}

/* "1,2" -> a list; "-" -> NULL; "none" -> a list of no nodes */
static const ubs_mem_nodes_t *nodes_arg(const char *arg, ubs_mem_nodes_t *out)
{
	char *copy, *save = NULL;

	if (!strcmp(arg, "-"))
		return NULL;
	memset(out, 0, sizeof(*out));
	if (!strcmp(arg, "none"))
		return out;
	copy = strdup(arg);
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
		if (out->node_cnt < UBS_MEM_MAX_SLOT_NUM)
			out->slot_ids[out->node_cnt++] = (uint32_t)strtoul(t, NULL, 0);
	free(copy);
	return out;
}

static void print_node(const ubs_topo_node_t *n)
{
	printf("{\"slot\": %u, \"host\": \"%s\"}", n->slot_id, n->host_name);
}

static void print_desc(const ubs_mem_shm_desc_t *d)
{
	printf("\"name\": \"%s\", \"mem_size\": %llu, \"unit_size\": %zu, \"stage\": %d, "
	       "\"export_slot\": %u, \"imports\": [",
	       d->name, (unsigned long long)d->mem_size, d->unit_size, (int)d->mem_stage,
	       d->export_node.slot_id);
	for (uint32_t i = 0; i < d->import_desc_cnt; i++) {
		const ubs_mem_shm_import_desc_t *imp = &d->import_desc[i];

		printf("%s{\"slot\": %u, \"stage\": %d, \"memids\": [", i ? ", " : "",
		       imp->import_node.slot_id, (int)imp->mem_stage);
		for (uint32_t j = 0; j < imp->memid_cnt; j++)
			printf("%s%llu", j ? ", " : "", (unsigned long long)imp->memids[j]);
		printf("]}");
	}
	printf("]");
}

static unsigned char pattern(uint64_t offset, unsigned int seed)
{
	uint64_t x = offset * 0x9E3779B97F4A7C15ULL + seed;

	return (unsigned char)(x >> 29);
}

/*
 * Attach (a node that has attached gets 1006 and the descriptor, as ubsmd accepts), then map
 * each block's shmdev and write or check the pattern over mem_size bytes.
 */
static int map_blocks(const char *name, unsigned int seed, int write, int sync)
{
	ubs_mem_shm_desc_t *d = NULL;
	int32_t ret = api.shm_attach(name, NULL, 0600, &d);
	long long mismatch = -1;
	uint64_t done = 0;

	if ((ret && ret != UBS_ENGINE_ERR_EXISTED) || !d || d->import_desc_cnt != 1) {
		printf("{\"ret\": %d, \"step\": \"attach\"}\n", ret);
		free(d);
		return 0;
	}
	for (uint32_t b = 0; b < d->import_desc[0].memid_cnt && done < d->mem_size; b++) {
		char path[64];
		size_t len = d->unit_size;
		unsigned char *p;
		int fd;

		if (len > d->mem_size - done)
			len = d->mem_size - done;
		snprintf(path, sizeof(path), "%s%llu", UBS_MEM_DEV_PATH,
			 (unsigned long long)d->import_desc[0].memids[b]);
		fd = open(path, O_RDWR | O_CLOEXEC | (sync ? O_SYNC : 0));
		if (fd < 0) {
			printf("{\"ret\": %d, \"step\": \"open\", \"errno\": %d, \"path\": \"%s\"}\n",
			       ret, errno, path);
			free(d);
			return 0;
		}
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
		if (p == MAP_FAILED) {
			printf("{\"ret\": %d, \"step\": \"mmap\", \"errno\": %d, \"path\": \"%s\"}\n",
			       ret, errno, path);
			free(d);
			return 0;
		}
		for (size_t i = 0; i < len; i++) {
			if (write)
				p[i] = pattern(done + i, seed);
			else if (p[i] != pattern(done + i, seed) && mismatch < 0)
				mismatch = (long long)(done + i);
		}
		munmap(p, len);
		done += len;
	}
	printf("{\"ret\": %d, \"bytes\": %llu, \"blocks\": %u, \"mismatch\": %lld}\n", ret,
	       (unsigned long long)done, d->import_desc[0].memid_cnt, mismatch);
	free(d); /* one allocation, as ubsmd frees it */
	return 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: ubse_harness [--lib PATH] COMMAND ARGS (see the source)\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *lib = DEFAULT_LIB, *cmd;
	ubs_mem_shm_desc_t *d = NULL;
	int32_t ret;

	if (argc > 2 && !strcmp(argv[1], "--lib")) {
		lib = argv[2];
		argv += 2;
		argc -= 2;
	}
	if (argc < 2)
		return usage();
	if (load(lib))
		return 3;
	cmd = argv[1];
	if (!strcmp(cmd, "symbols")) {
		printf("{\"ret\": 0, \"symbols\": %zu}\n", NSYMBOLS);
	} else if (!strcmp(cmd, "local")) {
		ubs_topo_node_t n;

		ret = api.node_local_get(&n);
		printf("{\"ret\": %d, \"node\": ", ret);
		print_node(&n);
		printf("}\n");
	} else if (!strcmp(cmd, "nodes")) {
		ubs_topo_node_t *nodes = NULL;
		ubs_topo_link_t *links = NULL;
		uint32_t cnt = 0, lcnt = 0;

		ret = api.node_list(&nodes, &cnt);
		if (!ret)
			ret = api.link_list(&links, &lcnt);
		printf("{\"ret\": %d, \"links\": %u, \"nodes\": [", ret, lcnt);
		for (uint32_t i = 0; i < cnt; i++) {
			printf("%s", i ? ", " : "");
			print_node(&nodes[i]);
		}
		printf("]}\n");
		free(nodes);
		free(links);
	} else if (!strcmp(cmd, "create") && argc == 6) {
		ubs_mem_nodes_t region, provider;
		uint8_t usr[UBS_MEM_MAX_USR_INFO_LEN] = { 0x55 };

		ret = api.shm_create(argv[2], strtoull(argv[3], NULL, 0), usr, UBS_MEM_FLAG_CACHEABLE,
				     nodes_arg(argv[4], &region), nodes_arg(argv[5], &provider));
		printf("{\"ret\": %d}\n", ret);
	} else if (!strcmp(cmd, "create-lender") && argc == 5) {
		ubs_mem_lender_t lender = { .lender_size = strtoull(argv[3], NULL, 0),
					    .slot_id = (uint32_t)strtoul(argv[4], NULL, 0) };
		uint8_t usr[UBS_MEM_MAX_USR_INFO_LEN] = { 0x55 };

		ret = api.shm_create_with_lender(argv[2], usr, UBS_MEM_FLAG_CACHEABLE, NULL, &lender);
		printf("{\"ret\": %d}\n", ret);
	} else if ((!strcmp(cmd, "attach") || !strcmp(cmd, "get")) && argc == 3) {
		ret = cmd[0] == 'a' ? api.shm_attach(argv[2], NULL, 0600, &d)
				    : api.shm_get(argv[2], &d);
		printf("{\"ret\": %d", ret);
		if (d) {
			printf(", ");
			print_desc(d);
		}
		printf("}\n");
		free(d);
	} else if (!strcmp(cmd, "list")) {
		uint32_t cnt = 0;

		ret = api.shm_list(&d, &cnt);
		printf("{\"ret\": %d, \"shms\": [", ret);
		for (uint32_t i = 0; i < cnt; i++) {
			printf("%s{", i ? ", " : "");
			print_desc(&d[i]);
			printf("}");
		}
		printf("]}\n");
		free(d);
	} else if (!strcmp(cmd, "detach") && argc == 3) {
		printf("{\"ret\": %d}\n", api.shm_detach(argv[2]));
	} else if (!strcmp(cmd, "delete") && argc == 3) {
		printf("{\"ret\": %d}\n", api.shm_delete(argv[2]));
	} else if (!strcmp(cmd, "fill") && argc == 4) {
		return map_blocks(argv[2], (unsigned int)strtoul(argv[3], NULL, 0), 1, 1);
	} else if (!strcmp(cmd, "read") && (argc == 4 || argc == 5)) {
		return map_blocks(argv[2], (unsigned int)strtoul(argv[3], NULL, 0), 0, argc == 5);
	} else {
		return usage();
	}
	return 0;
}
