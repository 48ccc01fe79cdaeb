// SPDX-License-Identifier: MIT
/*
 * libubse-client.so.1, ours (see ubse_client.h): each call checks its arguments as UBSE's
 * client does, then asks this node's service (python -m obmm.ubse serve) over a Unix socket.
 *
 * The protocol is obmm.ubse.wire's: one request line of space-separated tokens, answered by
 * "status CODE" and record lines; the service closes the connection after answering.
 */
#define _GNU_SOURCE
#include "ubse_client.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* keep equal to obmm.envvars.UBSE_SOCKET's default */
#define UBSE_DEFAULT_SOCKET "/run/obmm-ubse.sock"
#define UBSE_SOCKET_ENV "OBMM_UBSE_SOCKET"
#define UBSE_SOCKET_PATH_LEN 107 /* sun_path less its NUL: ubs_engine_client_initialize's limit */
#define NODE_FIELDS 12
#define MAX_TOKENS 32
#define REQ_MAX 1024

/* ubsmd logs level + 1 as its own level: 0 debug, 1 info, 2 warn, 3 error */
enum { LOG_INFO_LEVEL = 1, LOG_ERROR_LEVEL = 3 };

static char g_socket[UBSE_SOCKET_PATH_LEN + 1];
static ubs_engine_log_handler g_log;

static void say(uint32_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(uint32_t level, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!g_log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	g_log(level, msg);
}

int32_t ubs_engine_client_initialize(const char *ubs_engine_uds_path)
{
	if (ubs_engine_uds_path && strlen(ubs_engine_uds_path) > UBSE_SOCKET_PATH_LEN)
		return UBS_ENGINE_ERR_OUT_OF_RANGE;
	/* NULL or "" goes back to the default, as UBSE's ubse_socket_path_set */
	snprintf(g_socket, sizeof(g_socket), "%s", ubs_engine_uds_path ? ubs_engine_uds_path : "");
	return UBS_SUCCESS;
}

void ubs_engine_client_finalize(void)
{
}

void ubs_engine_log_callback_register(ubs_engine_log_handler handler)
{
	g_log = handler;
}

static const char *socket_path(void)
{
	const char *env = getenv(UBSE_SOCKET_ENV);

	if (g_socket[0])
		return g_socket;
	return env && env[0] ? env : UBSE_DEFAULT_SOCKET;
}

/* ---- the request ---- */

static int send_all(int fd, const char *buf, size_t len)
{
	while (len) {
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

/* The service's whole answer, NUL-terminated, in *out (NULL on failure). */
static int recv_all(int fd, char **out)
{
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);

	*out = NULL;
	if (!buf)
		return -1;
	for (;;) {
		ssize_t n;

		if (len + 1 == cap) {
			char *bigger = realloc(buf, cap * 2);

			if (!bigger) {
				free(buf);
				return -1;
			}
			buf = bigger;
			cap *= 2;
		}
		n = recv(fd, buf + len, cap - len - 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			free(buf);
			return -1;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

/*
 * Send `line`; the status is returned, the record lines (after the status line) left in
 * *body, which the caller frees.
 */
static int32_t call(const char *line, char **body)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *path = socket_path();
	char *answer, *nl;
	int fd, status;

	*body = NULL;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return UBS_ENGINE_ERR_CONNECTION_FAILED;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		say(LOG_ERROR_LEVEL, "ubse: cannot reach the service at %s: %s", path,
		    strerror(errno));
		close(fd);
		return UBS_ENGINE_ERR_CONNECTION_FAILED;
	}
	if (send_all(fd, line, strlen(line)) < 0 || send_all(fd, "\n", 1) < 0 ||
	    recv_all(fd, &answer) < 0) {
		close(fd);
		return UBS_ENGINE_ERR_CONNECTION_FAILED;
	}
	close(fd);
	if (sscanf(answer, "status %d", &status) != 1) {
		say(LOG_ERROR_LEVEL, "ubse: malformed answer to '%s'", line);
		free(answer);
		return UBS_ENGINE_ERR_INTERNAL;
	}
	nl = strchr(answer, '\n');
	memmove(answer, nl ? nl + 1 : answer + strlen(answer), strlen(nl ? nl + 1 : "") + 1);
	*body = answer;
	if (status)
		say(LOG_INFO_LEVEL, "ubse: '%s' answered %d", line, status);
	return status;
}

/* A request whose answer carries no records. */
static int32_t call_plain(const char *line)
{
	char *body;
	int32_t ret = call(line, &body);

	free(body);
	return ret;
}

/* ---- parsing the records ---- */

static int split(char *line, char **tok, int max)
{
	int n = 0;
	char *save = NULL;

	for (char *t = strtok_r(line, " ", &save); t && n < max; t = strtok_r(NULL, " ", &save))
		tok[n++] = t;
	return n;
}

/* The next line of *cursor (NUL-terminated in place), or NULL at the end. */
static char *next_line(char **cursor)
{
	char *line = *cursor, *nl;

	if (!line || !*line)
		return NULL;
	nl = strchr(line, '\n');
	if (nl) {
		*nl = '\0';
		*cursor = nl + 1;
	} else {
		*cursor = line + strlen(line);
	}
	return line;
}

static uint32_t u32(const char *s)
{
	return (uint32_t)strtoul(s, NULL, 0);
}

static void parse_node(char **f, ubs_topo_node_t *node)
{
	memset(node, 0, sizeof(*node));
	node->slot_id = u32(f[0]);
	if (strcmp(f[1], "-"))
		snprintf(node->host_name, sizeof(node->host_name), "%s", f[1]);
	for (int s = 0; s < UBS_TOPO_SOCKET_NUM; s++)
		node->socket_id[s] = u32(f[2 + s]);
	for (int s = 0; s < UBS_TOPO_SOCKET_NUM; s++)
		for (int n = 0; n < UBS_TOPO_NUMA_NUM; n++)
			node->numa_ids[s][n] = u32(f[4 + s * UBS_TOPO_NUMA_NUM + n]);
}

static size_t count_records(const char *body, const char *kind)
{
	size_t n = 0, klen = strlen(kind);

	for (const char *p = body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (!strncmp(p, kind, klen) && p[klen] == ' ')
			n++;
	return n;
}

static int parse_hex(const char *hex, uint8_t *out, size_t len)
{
	memset(out, 0, len);
	if (!strcmp(hex, "-"))
		return 0;
	for (size_t i = 0; i < len && hex[2 * i] && hex[2 * i + 1]; i++) {
		unsigned int byte;

		if (sscanf(hex + 2 * i, "%2x", &byte) != 1)
			return -1;
		out[i] = (uint8_t)byte;
	}
	return 0;
}

static int parse_ids(char *csv, uint64_t *ids, uint32_t *cnt)
{
	char *save = NULL;

	*cnt = 0;
	if (!strcmp(csv, "-"))
		return 0;
	for (char *t = strtok_r(csv, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (*cnt == UBS_MEM_MAX_MEMID_NUM)
			return -1;
		ids[(*cnt)++] = strtoull(t, NULL, 0);
	}
	return 0;
}

/*
 * The shm and imp records of `body` as descriptors in one allocation: the descriptors first,
 * then every import descriptor, each descriptor's import_desc pointing at its own.
 */
static int32_t parse_shms(char *body, ubs_mem_shm_desc_t **out, uint32_t *cnt)
{
	size_t nshm = count_records(body, "shm"), nimp = count_records(body, "imp");
	ubs_mem_shm_desc_t *descs, *cur = NULL;
	ubs_mem_shm_import_desc_t *imps;
	char *cursor = body, *line, *tok[MAX_TOKENS];

	*out = NULL;
	*cnt = 0;
	descs = calloc(1, nshm * sizeof(*descs) + nimp * sizeof(*imps) + 1);
	if (!descs)
		return UBS_ERR_OUT_OF_MEMORY;
	imps = (ubs_mem_shm_import_desc_t *)(descs + nshm);
	while ((line = next_line(&cursor))) {
		int n = split(line, tok, MAX_TOKENS);

		if (n == 6 + NODE_FIELDS && !strcmp(tok[0], "shm")) {
			cur = &descs[(*cnt)++];
			snprintf(cur->name, sizeof(cur->name), "%s", tok[1]);
			cur->mem_size = strtoull(tok[2], NULL, 0);
			cur->unit_size = strtoull(tok[3], NULL, 0);
			cur->mem_stage = (ubs_mem_stage)u32(tok[4]);
			if (parse_hex(tok[5], cur->usr_info, sizeof(cur->usr_info)))
				goto bad;
			parse_node(tok + 6, &cur->export_node);
			cur->import_desc = imps;
		} else if (n == 3 + NODE_FIELDS && !strcmp(tok[0], "imp") && cur) {
			ubs_mem_shm_import_desc_t *imp = &cur->import_desc[cur->import_desc_cnt++];

			imp->mem_stage = (ubs_mem_stage)u32(tok[1]);
			if (parse_ids(tok[2], imp->memids, &imp->memid_cnt))
				goto bad;
			parse_node(tok + 3, &imp->import_node);
			imps++;
		} else {
			goto bad;
		}
	}
	*out = descs;
	return UBS_SUCCESS;
bad:
	say(LOG_ERROR_LEVEL, "ubse: malformed shared-memory record from the service");
	free(descs);
	*cnt = 0;
	return UBS_ENGINE_ERR_INTERNAL;
}

/* ---- argument checks, as UBSE's client makes them (libubse_helper.cpp) ---- */

static int32_t check_name(const char *name)
{
	size_t len;

	if (!name)
		return UBS_ERR_NULL_POINTER;
	len = strlen(name);
	if (len == 0 || len > UBS_MEM_MAX_NAME_LENGTH - 1)
		return UBS_ERR_INVALID_ARG;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)name[i];

		if (!isalnum(c) && c != '_' && c != '-' && c != '.' && c != ':')
			return UBS_ERR_INVALID_ARG;
	}
	return UBS_SUCCESS;
}

static int32_t check_nodes(const ubs_mem_nodes_t *nodes)
{
	if (nodes && (nodes->node_cnt == 0 || nodes->node_cnt > UBS_MEM_MAX_SLOT_NUM))
		return UBS_ENGINE_ERR_OUT_OF_RANGE;
	return UBS_SUCCESS;
}

static int32_t check_shm_create(const char *name, uint64_t size, const ubs_mem_nodes_t *region,
				const ubs_mem_nodes_t *provider)
{
	int32_t ret = check_name(name);

	if (ret)
		return ret;
	if (size < UBS_MEM_MIN_SIZE || size % UBS_MEM_SHM_ALIGNMENT)
		return UBS_ENGINE_ERR_OUT_OF_RANGE;
	ret = check_nodes(region);
	return ret ? ret : check_nodes(provider);
}

/* "1,2,3", or "-" for no list, into buf */
static const char *nodes_csv(const ubs_mem_nodes_t *nodes, char *buf, size_t len)
{
	size_t off = 0;

	if (!nodes)
		return "-";
	buf[0] = '\0';
	for (uint32_t i = 0; i < nodes->node_cnt && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%u", i ? "," : "",
					nodes->slot_ids[i]);
	return buf;
}

static const char *usr_hex(const uint8_t *usr, char *buf)
{
	if (!usr)
		return "-";
	for (int i = 0; i < UBS_MEM_MAX_USR_INFO_LEN; i++)
		sprintf(buf + 2 * i, "%02x", usr[i]);
	return buf;
}

/* ---- topology ---- */

static int32_t nodes_request(const char *line, ubs_topo_node_t **nodes, uint32_t *cnt)
{
	char *body, *cursor, *l, *tok[MAX_TOKENS];
	int32_t ret = call(line, &body);
	size_t n;

	if (ret) {
		free(body);
		return ret;
	}
	n = count_records(body, "node");
	*nodes = calloc(n ? n : 1, sizeof(**nodes));
	if (!*nodes) {
		free(body);
		return UBS_ERR_OUT_OF_MEMORY;
	}
	*cnt = 0;
	cursor = body;
	while ((l = next_line(&cursor)))
		if (split(l, tok, MAX_TOKENS) == 1 + NODE_FIELDS && !strcmp(tok[0], "node"))
			parse_node(tok + 1, &(*nodes)[(*cnt)++]);
	free(body);
	return UBS_SUCCESS;
}

int32_t ubs_topo_node_list(ubs_topo_node_t **node_list, uint32_t *node_cnt)
{
	if (!node_list || !node_cnt)
		return UBS_ERR_NULL_POINTER;
	return nodes_request("node_list", node_list, node_cnt);
}

int32_t ubs_topo_node_local_get(ubs_topo_node_t *node)
{
	ubs_topo_node_t *one;
	uint32_t cnt;
	int32_t ret;

	if (!node)
		return UBS_ERR_NULL_POINTER;
	ret = nodes_request("node_local", &one, &cnt);
	if (ret)
		return ret;
	if (cnt != 1) {
		free(one);
		return UBS_ENGINE_ERR_INTERNAL;
	}
	*node = *one;
	free(one);
	return UBS_SUCCESS;
}

int32_t ubs_topo_link_list(ubs_topo_link_t **cpu_links, uint32_t *cpu_link_cnt)
{
	char *body, *cursor, *l;
	int32_t ret;
	size_t n;

	if (!cpu_links || !cpu_link_cnt)
		return UBS_ERR_NULL_POINTER;
	ret = call("link_list", &body);
	if (ret) {
		free(body);
		return ret;
	}
	n = count_records(body, "link");
	*cpu_links = calloc(n ? n : 1, sizeof(**cpu_links));
	if (!*cpu_links) {
		free(body);
		return UBS_ERR_OUT_OF_MEMORY;
	}
	*cpu_link_cnt = 0;
	cursor = body;
	while ((l = next_line(&cursor))) {
		ubs_topo_link_t *k = &(*cpu_links)[*cpu_link_cnt];

		if (sscanf(l, "link %u %u %u %u %u %u", &k->slot_id, &k->socket_id, &k->port_id,
			   &k->peer_slot_id, &k->peer_socket_id, &k->peer_port_id) == 6)
			(*cpu_link_cnt)++;
	}
	free(body);
	return UBS_SUCCESS;
}

int32_t ubs_mem_numastat_get(uint32_t slot_id, ubs_mem_numastat_t **numa_mems,
			     uint32_t *numa_mem_cnt)
{
	char line[64], *body, *cursor, *l;
	int32_t ret;
	size_t n;

	if (!numa_mems || !numa_mem_cnt)
		return UBS_ERR_NULL_POINTER;
	snprintf(line, sizeof(line), "numastat %u", slot_id);
	ret = call(line, &body);
	if (ret) {
		free(body);
		return ret;
	}
	n = count_records(body, "numa");
	*numa_mems = calloc(n ? n : 1, sizeof(**numa_mems));
	if (!*numa_mems) {
		free(body);
		return UBS_ERR_OUT_OF_MEMORY;
	}
	*numa_mem_cnt = 0;
	cursor = body;
	while ((l = next_line(&cursor)) && *numa_mem_cnt < UBS_TOPO_NUMA_NUM) {
		ubs_mem_numastat_t *s = &(*numa_mems)[*numa_mem_cnt];
		unsigned long long total, free_b, borrow, lend;

		if (sscanf(l, "numa %u %u %u %u %llu %llu %llu %llu", &s->slot_id, &s->socket_id,
			   &s->numa_id, &s->mem_lend_ratio, &total, &free_b, &borrow, &lend) != 8)
			continue;
		s->numa_type = NUMA_LOCAL;
		s->mem_total = total;
		s->mem_free = free_b;
		s->mem_borrow = borrow;
		s->mem_lend = lend;
		(*numa_mem_cnt)++;
	}
	free(body);
	return UBS_SUCCESS;
}

/* ---- fd and NUMA borrowing: checked as UBSE does, then not ours (docs/ubs-mem.md) ---- */

static int32_t not_ours(const char *what, const char *name, int32_t checked)
{
	if (checked)
		return checked;
	say(LOG_ERROR_LEVEL, "ubse: %s(%s): not supported by the testbed's UBSE", what, name);
	return UBS_ERR_NOT_SUPPORTED;
}

static int32_t check_size_name(const char *name, uint64_t size)
{
	return size < UBS_MEM_MIN_SIZE ? UBS_ENGINE_ERR_OUT_OF_RANGE : check_name(name);
}

int32_t ubs_mem_fd_create(const char *name, uint64_t size, const ubs_mem_fd_owner_t *owner,
			  mode_t mode, ubs_mem_distance_t distance, ubs_mem_fd_desc_t *fd_desc)
{
	(void)owner, (void)mode, (void)distance;
	if (!check_size_name(name, size) && !fd_desc)
		return UBS_ERR_NULL_POINTER;
	return not_ours(__func__, name, check_size_name(name, size));
}

int32_t ubs_mem_fd_create_with_lender(const char *name, const ubs_mem_fd_owner_t *owner,
				      mode_t mode, const ubs_mem_lender_t *lender,
				      uint32_t lender_cnt, ubs_mem_fd_desc_t *fd_desc)
{
	(void)owner, (void)mode, (void)fd_desc, (void)lender_cnt;
	if (!lender)
		return UBS_ERR_NULL_POINTER;
	return not_ours(__func__, name, check_name(name));
}

int32_t ubs_mem_fd_create_with_candidate(const char *name, uint64_t size,
					 const ubs_mem_fd_owner_t *owner, mode_t mode,
					 const uint32_t *slot_ids, uint32_t slot_cnt,
					 ubs_mem_fd_desc_t *fd_desc)
{
	(void)owner, (void)mode, (void)slot_ids, (void)slot_cnt, (void)fd_desc;
	return not_ours(__func__, name, check_size_name(name, size));
}

int32_t ubs_mem_fd_permission(const char *name, const ubs_mem_fd_owner_t *owner, mode_t mode)
{
	(void)owner, (void)mode;
	return not_ours(__func__, name, check_name(name));
}

int32_t ubs_mem_fd_get(const char *name, ubs_mem_fd_desc_t *fd_desc)
{
	(void)fd_desc;
	return not_ours(__func__, name, check_name(name));
}

int32_t ubs_mem_fd_delete(const char *name)
{
	return not_ours(__func__, name, check_name(name));
}

int32_t ubs_mem_numa_create(const char *name, uint64_t size, ubs_mem_distance_t distance,
			    ubs_mem_numa_desc_t *numa_desc)
{
	(void)distance, (void)numa_desc;
	return not_ours(__func__, name, check_size_name(name, size));
}

int32_t ubs_mem_numa_create_with_lender(const char *name, const ubs_mem_lender_t *lender,
					uint32_t lender_cnt, ubs_mem_numa_desc_t *numa_desc)
{
	(void)lender_cnt, (void)numa_desc;
	if (!lender)
		return UBS_ERR_NULL_POINTER;
	return not_ours(__func__, name, check_name(name));
}

int32_t ubs_mem_numa_create_with_candidate(const char *name, uint64_t size,
					   const uint32_t *slot_ids, uint32_t slot_cnt,
					   ubs_mem_numa_desc_t *numa_desc)
{
	(void)slot_ids, (void)slot_cnt, (void)numa_desc;
	return not_ours(__func__, name, check_size_name(name, size));
}

int32_t ubs_mem_numa_get(const char *name, ubs_mem_numa_desc_t *numa_desc)
{
	(void)numa_desc;
	return not_ours(__func__, name, check_name(name));
}

int32_t ubs_mem_numa_delete(const char *name)
{
	return not_ours(__func__, name, check_name(name));
}

/* ---- shared memory ---- */

int32_t ubs_mem_shm_create(const char *name, uint64_t size,
			   uint8_t usr_info[UBS_MEM_MAX_USR_INFO_LEN], uint64_t flag,
			   const ubs_mem_nodes_t *region, const ubs_mem_nodes_t *provider)
{
	char line[REQ_MAX], rbuf[256], pbuf[256], hex[2 * UBS_MEM_MAX_USR_INFO_LEN + 1];
	int32_t ret = check_shm_create(name, size, region, provider);

	if (ret)
		return ret;
	snprintf(line, sizeof(line), "shm_create %s %llu %llu %s %s %s", name,
		 (unsigned long long)size, (unsigned long long)flag, usr_hex(usr_info, hex),
		 nodes_csv(region, rbuf, sizeof(rbuf)), nodes_csv(provider, pbuf, sizeof(pbuf)));
	return call_plain(line);
}

int32_t ubs_mem_shm_create_with_affinity(const char *name, uint64_t size,
					 uint32_t affinity_socket_id,
					 uint8_t usr_info[UBS_MEM_MAX_USR_INFO_LEN], uint64_t flag,
					 const ubs_mem_nodes_t *region,
					 const ubs_mem_nodes_t *provider)
{
	/* every testbed node is one socket: the affinity cannot narrow the choice */
	(void)affinity_socket_id;
	return ubs_mem_shm_create(name, size, usr_info, flag, region, provider);
}

int32_t ubs_mem_shm_create_with_lender(const char *name,
				       uint8_t usr_info[UBS_MEM_MAX_USR_INFO_LEN], uint64_t flag,
				       const ubs_mem_nodes_t *region,
				       const ubs_mem_lender_t *lender)
{
	char line[REQ_MAX], rbuf[256], hex[2 * UBS_MEM_MAX_USR_INFO_LEN + 1];
	int32_t ret = check_name(name);

	if (!ret)
		ret = check_nodes(region);
	if (ret)
		return ret;
	if (!lender || lender->lender_size < UBS_MEM_MIN_SIZE)
		return UBS_ENGINE_ERR_OUT_OF_RANGE;
	snprintf(line, sizeof(line), "shm_create_lender %s %llu %s %s %llu %u", name,
		 (unsigned long long)flag, usr_hex(usr_info, hex),
		 nodes_csv(region, rbuf, sizeof(rbuf)), (unsigned long long)lender->lender_size,
		 lender->slot_id);
	return call_plain(line);
}

/* A request answered with shared-memory records: `one` expects exactly one descriptor. */
static int32_t shm_request(const char *line, ubs_mem_shm_desc_t **descs, uint32_t *cnt)
{
	char *body;
	int32_t ret = call(line, &body), parsed;

	*descs = NULL;
	*cnt = 0;
	/* a repeated attach is refused with the descriptor all the same */
	if (ret && ret != UBS_ENGINE_ERR_EXISTED) {
		free(body);
		return ret;
	}
	parsed = parse_shms(body, descs, cnt);
	free(body);
	return parsed ? parsed : ret;
}

static int32_t shm_one(const char *line, ubs_mem_shm_desc_t **shm_desc)
{
	uint32_t cnt;
	int32_t ret = shm_request(line, shm_desc, &cnt);

	if (*shm_desc && cnt != 1) {
		free(*shm_desc);
		*shm_desc = NULL;
		return UBS_ENGINE_ERR_INTERNAL;
	}
	return ret;
}

int32_t ubs_mem_shm_attach(const char *name, const ubs_mem_fd_owner_t *owner, mode_t mode,
			   ubs_mem_shm_desc_t **shm_desc)
{
	char line[REQ_MAX];
	int32_t ret = check_name(name);

	/* the owner and mode are the shmdev's in UBSE; who may attach is the caller's uid */
	(void)owner, (void)mode;
	if (ret)
		return ret;
	if (!shm_desc)
		return UBS_ERR_NULL_POINTER;
	snprintf(line, sizeof(line), "shm_attach %s", name);
	return shm_one(line, shm_desc);
}

int32_t ubs_mem_shm_get(const char *name, ubs_mem_shm_desc_t **shm_desc)
{
	char line[REQ_MAX];
	int32_t ret = check_name(name);

	if (ret)
		return ret;
	if (!shm_desc)
		return UBS_ERR_NULL_POINTER;
	snprintf(line, sizeof(line), "shm_get %s", name);
	return shm_one(line, shm_desc);
}

int32_t ubs_mem_shm_list(ubs_mem_shm_desc_t **shm_descs, uint32_t *shm_desc_cnt)
{
	if (!shm_descs || !shm_desc_cnt)
		return UBS_ERR_NULL_POINTER;
	return shm_request("shm_list", shm_descs, shm_desc_cnt);
}

int32_t ubs_mem_shm_detach(const char *name)
{
	char line[REQ_MAX];
	int32_t ret = check_name(name);

	if (ret)
		return ret;
	snprintf(line, sizeof(line), "shm_detach %s", name);
	return call_plain(line);
}

int32_t ubs_mem_shm_delete(const char *name)
{
	char line[REQ_MAX];
	int32_t ret = check_name(name);

	if (ret)
		return ret;
	snprintf(line, sizeof(line), "shm_delete %s", name);
	return call_plain(line);
}
