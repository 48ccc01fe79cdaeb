/* SPDX-License-Identifier: MIT */
/*
 * libubse-client.so.1, ours: the UBSE client calls that ubsmd (ubs-mem) resolves with dlsym.
 *
 * Written for obmm-testbed from the facts of UBSE's public client API (ubs-engine
 * src/sdk/c/include: ubs_engine.h, ubs_engine_log.h, ubs_engine_topo.h, ubs_engine_mem.h,
 * ubs_error.h) and of how ubsmd calls it (ubs-mem src/under_api/ubse/ubse_mem_adapter.cpp:
 * UbseMemAdapter::DlopenLibUbse resolves the 26 functions below).  The names, argument lists
 * and struct layouts are those ubsmd is compiled against, so it can load this library in place
 * of UBSE's; the code behind them is ours (ubse_client.c), talking to our per-node service
 * (python -m obmm.ubse serve).  docs/ubs-mem.md says what is UBSE's behaviour and what is ours.
 */
#ifndef OBMM_UBSE_CLIENT_H
#define OBMM_UBSE_CLIENT_H

#include <limits.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef HOST_NAME_MAX
#define HOST_NAME_MAX 64 /* glibc's, which ubsmd's ubs_topo_node_t is laid out with */
#endif

/* ---- return codes (ubs_error_t; the numbers ubsmd compares against) ---- */
typedef enum {
	UBS_SUCCESS = 0,
	UBS_ERR_INVALID_ARG = 1,
	UBS_ERR_NULL_POINTER = 3,
	UBS_ERR_OUT_OF_MEMORY = 10,
	UBS_ERR_NOT_SUPPORTED = 41,
	UBS_ERR_TIMED_OUT = 43,
	UBS_ENGINE_ERR_OUT_OF_RANGE = 1000,
	UBS_ENGINE_ERR_CONNECTION_FAILED = 1002,
	UBS_ENGINE_ERR_AUTH_FAILED = 1003,
	UBS_ENGINE_ERR_INTERNAL = 1005,
	UBS_ENGINE_ERR_EXISTED = 1006,
	UBS_ENGINE_ERR_NOT_EXIST = 1007,
	UBS_ENGINE_ERR_ALLOCATE = 1013,
	UBS_ENGINE_ERR_SHM_NO_ATTACH = 1015,
	UBS_ENGINE_ERR_SHM_ATTACH_USING = 1024,
	UBS_ENGINE_ERR_NODE_NOT_EXIST = 1027,
} ubs_error_t;

/* ---- limits ---- */
#define UBS_TOPO_SOCKET_NUM 2
#define UBS_TOPO_IPADDR_NUM 50
#define UBS_TOPO_NUMA_NUM 4
#define UBS_TOPO_MAX_NODE_NUM 512
#define UBS_TOPO_MAX_CPU_LINK_NUM 1024
#define UBS_MEM_MAX_SLOT_NUM 16
#define UBS_MEM_MAX_MEMID_NUM 2048
#define UBS_MEM_MAX_NAME_LENGTH 48 /* with the NUL */
#define UBS_MEM_MAX_USR_INFO_LEN 32
#define UBS_MEM_MIN_SIZE (4ULL << 20)
#define UBS_MEM_SHM_ALIGNMENT (2ULL << 20) /* UBSE_SHM_MEM_ALIGNMENT */
#define UBS_MEM_MAX_DESC_LIST 2000

/* ubs_mem_shm_create's flag bits */
#define UBS_MEM_FLAG_NO_WR_DELAY 0x1
#define UBS_MEM_FLAG_SHM_ANONYMOUS 0x2
#define UBS_MEM_FLAG_CACHEABLE 0x4

/* a memid's device: UBS_MEM_DEV_PATH followed by the memid in decimal */
#define UBS_MEM_DEV_PATH "/dev/obmm_shmdev"

/* ---- topology ---- */
typedef struct {
	int32_t af;
	struct in_addr ipv4;
	struct in6_addr ipv6;
} ubs_topo_ip_address_t;

typedef struct {
	uint32_t slot_id;
	uint32_t socket_id[UBS_TOPO_SOCKET_NUM];
	uint32_t numa_ids[UBS_TOPO_SOCKET_NUM][UBS_TOPO_NUMA_NUM];
	ubs_topo_ip_address_t ips[UBS_TOPO_IPADDR_NUM];
	char host_name[HOST_NAME_MAX];
} ubs_topo_node_t;

typedef struct {
	uint32_t slot_id;
	uint32_t socket_id;
	uint32_t port_id;
	uint32_t peer_slot_id;
	uint32_t peer_socket_id;
	uint32_t peer_port_id;
} ubs_topo_link_t;

/* ---- memory ---- */
typedef enum { NUMA_LOCAL, NUMA_REMOTE } ubs_mem_numa_type_t;

typedef enum {
	UBSE_NOT_EXIST = 0,
	UBSE_CREATING = 1,
	UBSE_DELETING = 2,
	UBSE_EXIST = 3,
	UBSE_ERR_ONLY_IMPORT = 4,
	UBSE_ERR_WAIT_UNEXPORT = 5,
	UBSE_END = 6,
} ubs_mem_stage;

typedef enum { MEM_DISTANCE_L0, MEM_DISTANCE_L1, MEM_DISTANCE_L2 } ubs_mem_distance_t;

typedef struct {
	uint32_t slot_id;
	uint32_t socket_id;
	uint32_t numa_id;
	ubs_mem_numa_type_t numa_type;
	uint32_t mem_lend_ratio;
	uint64_t mem_total;
	uint64_t mem_free;
	uint32_t huge_pages_2M;
	uint32_t free_huge_pages_2M;
	uint32_t huge_pages_1G;
	uint32_t free_huge_pages_1G;
	uint64_t mem_borrow;
	uint64_t mem_lend;
} ubs_mem_numastat_t;

typedef struct {
	uid_t uid;
	gid_t gid;
	pid_t pid;
} ubs_mem_fd_owner_t;

typedef struct {
	uint64_t lender_size;
	uint32_t slot_id;
	uint32_t socket_id;
	uint32_t numa_id;
	uint32_t port_id;
} ubs_mem_lender_t;

typedef struct {
	char name[UBS_MEM_MAX_NAME_LENGTH];
	uint32_t memid_cnt;
	uint64_t memids[UBS_MEM_MAX_MEMID_NUM];
	uint64_t mem_size;
	size_t unit_size;
	ubs_topo_node_t export_node;
	ubs_topo_node_t import_node;
	ubs_mem_stage mem_stage;
} ubs_mem_fd_desc_t;

typedef struct {
	char name[UBS_MEM_MAX_NAME_LENGTH];
	int64_t numaid;
	ubs_topo_node_t export_node;
	ubs_topo_node_t import_node;
	uint64_t size;
	ubs_mem_stage mem_stage;
	uint8_t usrInfo[UBS_MEM_MAX_USR_INFO_LEN];
} ubs_mem_numa_desc_t;

typedef struct {
	uint32_t node_cnt; /* 1..UBS_MEM_MAX_SLOT_NUM */
	uint32_t slot_ids[UBS_MEM_MAX_SLOT_NUM];
} ubs_mem_nodes_t;

typedef struct {
	uint32_t memid_cnt;
	uint64_t memids[UBS_MEM_MAX_MEMID_NUM];
	ubs_topo_node_t import_node;
	ubs_mem_stage mem_stage;
} ubs_mem_shm_import_desc_t;

/*
 * A shared memory.  import_desc points into the same allocation as the descriptor: the caller
 * frees the one pointer it was given (ubsmd's FreeShmDesc calls free() once).
 */
typedef struct {
	char name[UBS_MEM_MAX_NAME_LENGTH];
	uint64_t mem_size;
	size_t unit_size; /* the block size: each memid is one block */
	ubs_topo_node_t export_node;
	uint8_t usr_info[UBS_MEM_MAX_USR_INFO_LEN];
	uint32_t import_desc_cnt;
	ubs_mem_stage mem_stage;
	ubs_mem_shm_import_desc_t *import_desc;
} ubs_mem_shm_desc_t;

typedef void (*ubs_engine_log_handler)(uint32_t level, const char *message);

/* ---- the 26 functions ubsmd resolves ---- */
int32_t ubs_engine_client_initialize(const char *ubs_engine_uds_path);
void ubs_engine_client_finalize(void);
void ubs_engine_log_callback_register(ubs_engine_log_handler handler);

int32_t ubs_topo_node_list(ubs_topo_node_t **node_list, uint32_t *node_cnt);
int32_t ubs_topo_node_local_get(ubs_topo_node_t *node);
int32_t ubs_topo_link_list(ubs_topo_link_t **cpu_links, uint32_t *cpu_link_cnt);
int32_t ubs_mem_numastat_get(uint32_t slot_id, ubs_mem_numastat_t **numa_mems,
			     uint32_t *numa_mem_cnt);

int32_t ubs_mem_fd_create(const char *name, uint64_t size, const ubs_mem_fd_owner_t *owner,
			  mode_t mode, ubs_mem_distance_t distance, ubs_mem_fd_desc_t *fd_desc);
int32_t ubs_mem_fd_create_with_lender(const char *name, const ubs_mem_fd_owner_t *owner,
				      mode_t mode, const ubs_mem_lender_t *lender,
				      uint32_t lender_cnt, ubs_mem_fd_desc_t *fd_desc);
int32_t ubs_mem_fd_create_with_candidate(const char *name, uint64_t size,
					 const ubs_mem_fd_owner_t *owner, mode_t mode,
					 const uint32_t *slot_ids, uint32_t slot_cnt,
					 ubs_mem_fd_desc_t *fd_desc);
int32_t ubs_mem_fd_permission(const char *name, const ubs_mem_fd_owner_t *owner, mode_t mode);
int32_t ubs_mem_fd_get(const char *name, ubs_mem_fd_desc_t *fd_desc);
int32_t ubs_mem_fd_delete(const char *name);

int32_t ubs_mem_numa_create(const char *name, uint64_t size, ubs_mem_distance_t distance,
			    ubs_mem_numa_desc_t *numa_desc);
int32_t ubs_mem_numa_create_with_lender(const char *name, const ubs_mem_lender_t *lender,
					uint32_t lender_cnt, ubs_mem_numa_desc_t *numa_desc);
int32_t ubs_mem_numa_create_with_candidate(const char *name, uint64_t size,
					   const uint32_t *slot_ids, uint32_t slot_cnt,
					   ubs_mem_numa_desc_t *numa_desc);
int32_t ubs_mem_numa_get(const char *name, ubs_mem_numa_desc_t *numa_desc);
int32_t ubs_mem_numa_delete(const char *name);

int32_t ubs_mem_shm_create(const char *name, uint64_t size,
			   uint8_t usr_info[UBS_MEM_MAX_USR_INFO_LEN], uint64_t flag,
			   const ubs_mem_nodes_t *region, const ubs_mem_nodes_t *provider);
int32_t ubs_mem_shm_create_with_affinity(const char *name, uint64_t size,
					 uint32_t affinity_socket_id,
					 uint8_t usr_info[UBS_MEM_MAX_USR_INFO_LEN], uint64_t flag,
					 const ubs_mem_nodes_t *region,
					 const ubs_mem_nodes_t *provider);
int32_t ubs_mem_shm_create_with_lender(const char *name,
				       uint8_t usr_info[UBS_MEM_MAX_USR_INFO_LEN], uint64_t flag,
				       const ubs_mem_nodes_t *region,
				       const ubs_mem_lender_t *lender);
int32_t ubs_mem_shm_attach(const char *name, const ubs_mem_fd_owner_t *owner, mode_t mode,
			   ubs_mem_shm_desc_t **shm_desc);
int32_t ubs_mem_shm_get(const char *name, ubs_mem_shm_desc_t **shm_desc);
int32_t ubs_mem_shm_list(ubs_mem_shm_desc_t **shm_descs, uint32_t *shm_desc_cnt);
int32_t ubs_mem_shm_detach(const char *name);
int32_t ubs_mem_shm_delete(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* OBMM_UBSE_CLIENT_H */
