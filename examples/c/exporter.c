// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * exporter - export memory, fill it with a float pattern, serve its handle over TCP.
 *
 *   exporter [--bind ADDR] [--port PORT] [--size MIB] [--name NAME]
 *
 * The seed's cross-node flow (scheme 7 server.c), written against
 * uapi/ub/obmm.h, examples/c/obmm_handle.h and obmm_exchange.h only:
 *
 *   1. OBMM_CMD_EXPORT (size[0] = size, length = 1, ALLOW_MMAP)
 *   2. mmap /dev/obmm_shmdev<mem_id>, float element i = i * 0.001
 *   3. serve the 88-byte handle with the obmm.exchange protocol (version 1):
 *      request and response are each one frame "u32 LE length | payload";
 *      request payload "OBMX" 1 op name (op 1 = GET, 2 = LIST),
 *      response payload "OBMX" 1 status body (0 OK: handle / names,
 *      1 NOT_FOUND, 2 BAD_REQUEST), then the connection is closed.
 *   4. on SIGINT/SIGTERM: OBMM_CMD_UNEXPORT and exit.
 *
 * The node id, CNA and EID that go into the handle come from the emulator's
 * /sys/kernel/obmm_emu or, under the real obmm.ko, /sys/kernel/ub_compat (on
 * hardware: give --node-id, --cna, --eid).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <ub/obmm.h>

#include "obmm_exchange.h"
#include "obmm_handle.h"

#define DEFAULT_SIZE_MIB 16
#define MIB (1024UL * 1024UL)
#define GRANULE (2 * MIB)
#define READ_TIMEOUT_S 5
#define EMU_SYSFS "/sys/kernel/obmm_emu"
/* The real obmm.ko's compat layer publishes the same fabric files here. */
#define COMPAT_SYSFS "/sys/kernel/ub_compat"

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static long long read_sysfs(const char *path, long long fallback)
{
	FILE *f = fopen(path, "r");
	long long v = fallback;

	if (!f)
		return fallback;
	if (fscanf(f, "%lli", &v) != 1)
		v = fallback;
	fclose(f);
	return v;
}

static void reply(int fd, uint8_t status, const void *body, size_t len)
{
	uint8_t head[4 + OBMM_EXCHANGE_HEAD];

	obmm_exchange_head(head, len, status);
	if (obmm_send_all(fd, head, sizeof(head)) == 0 && len)
		obmm_send_all(fd, body, len);
}

/* One connection: one request, one response. */
static void serve_one(int fd, const char *name, const uint8_t wire[OBMM_HANDLE_SIZE])
{
	struct timeval tv = { .tv_sec = READ_TIMEOUT_S };
	uint8_t lenbuf[4], req[OBMM_EXCHANGE_MAX_FRAME];
	uint32_t len;
	size_t name_len = strlen(name);

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (obmm_io_all(fd, lenbuf, sizeof(lenbuf), 0))
		return;
	len = (uint32_t)obmm_get_le(lenbuf, 4);
	if (len > OBMM_EXCHANGE_MAX_FRAME) {
		reply(fd, OBMM_EXCHANGE_ST_BAD_REQUEST, "frame too large", 15);
		return;
	}
	if (obmm_io_all(fd, req, len, 0))
		return;
	if (!obmm_exchange_head_ok(req, len)) {
		reply(fd, OBMM_EXCHANGE_ST_BAD_REQUEST, "bad request header", 18);
		return;
	}
	if (req[5] == OBMM_EXCHANGE_OP_LIST && len == OBMM_EXCHANGE_HEAD) {
		reply(fd, OBMM_EXCHANGE_ST_OK, name, name_len);
	} else if (req[5] == OBMM_EXCHANGE_OP_GET) {
		if (len - OBMM_EXCHANGE_HEAD == name_len &&
		    !memcmp(req + OBMM_EXCHANGE_HEAD, name, name_len))
			reply(fd, OBMM_EXCHANGE_ST_OK, wire, OBMM_HANDLE_SIZE);
		else
			reply(fd, OBMM_EXCHANGE_ST_NOT_FOUND, "no such handle", 14);
	} else {
		reply(fd, OBMM_EXCHANGE_ST_BAD_REQUEST, "unknown op", 10);
	}
}

/* One integer of the testbed's fabric files (0 when absent: then give it as an option). */
static long long read_fabric(const char *fabric, const char *name)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/%s", fabric, name);
	return read_sysfs(path, 0);
}

static void usage(void)
{
	fprintf(stderr, "usage: exporter [--bind ADDR] [--port PORT] [--size MIB] [--name NAME]\n"
			"                [--node-id N] [--cna CNA] [--eid EID]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *bind_addr = "0.0.0.0", *name = "region";
	unsigned long size = DEFAULT_SIZE_MIB * MIB;
	int port = OBMM_EXCHANGE_DEFAULT_PORT, dev, shm = -1, srv = -1, one = 1, rc = 1;
	const char *fabric = access(EMU_SYSFS, F_OK) && !access(COMPAT_SYSFS, F_OK) ?
			     COMPAT_SYSFS : EMU_SYSFS;
	long long node_id = read_fabric(fabric, "node_id");
	long long cna = read_fabric(fabric, "cna");
	uint32_t eid = (uint32_t)read_fabric(fabric, "eid");
	struct obmm_cmd_export exp = { 0 };
	struct obmm_cmd_unexport unexp = { 0 };
	struct obmm_handle h = { 0 };
	uint8_t wire[OBMM_HANDLE_SIZE];
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct sigaction act = { .sa_handler = on_signal };
	char path[64];
	float *p;
	size_t i, n;

	for (int a = 1; a < argc; a++) {
		if (a + 1 >= argc)
			usage();
		if (!strcmp(argv[a], "--bind"))
			bind_addr = argv[++a];
		else if (!strcmp(argv[a], "--port"))
			port = atoi(argv[++a]);
		else if (!strcmp(argv[a], "--size"))
			size = strtoul(argv[++a], NULL, 0) * MIB;
		else if (!strcmp(argv[a], "--name"))
			name = argv[++a];
		else if (!strcmp(argv[a], "--node-id"))
			node_id = strtoll(argv[++a], NULL, 0);
		else if (!strcmp(argv[a], "--cna"))
			cna = strtoll(argv[++a], NULL, 0);
		else if (!strcmp(argv[a], "--eid"))
			eid = (uint32_t)strtoul(argv[++a], NULL, 0);
		else
			usage();
	}
	size = (size + GRANULE - 1) / GRANULE * GRANULE;
	if (!size || strlen(name) > 255 || inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1)
		usage();
	sa.sin_port = htons((uint16_t)port);

	dev = open("/dev/obmm", O_RDWR | O_CLOEXEC);
	if (dev < 0) {
		perror("open /dev/obmm");
		return 1;
	}
	exp.size[0] = size;
	exp.length = 1; /* the count of size[] entries */
	exp.flags = OBMM_EXPORT_FLAG_ALLOW_MMAP;
	if (ioctl(dev, OBMM_CMD_EXPORT, &exp)) {
		perror("OBMM_CMD_EXPORT");
		goto out_dev;
	}
	printf("exported mem_id=%llu tokenid=%#x uba=%#llx size=%lu\n",
	       (unsigned long long)exp.mem_id, exp.tokenid, (unsigned long long)exp.uba, size);

	snprintf(path, sizeof(path), "/dev/obmm_shmdev%llu", (unsigned long long)exp.mem_id);
	shm = open(path, O_RDWR | O_CLOEXEC);
	if (shm < 0) {
		perror(path);
		goto out_unexport;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		goto out_shm;
	}
	n = size / sizeof(float);
	for (i = 0; i < n; i++)
		p[i] = (float)((double)i * 0.001);
	/* Before the handle is published: on UB the unmap writes the stores back. */
	munmap(p, size);

	h.mem_id = exp.mem_id;
	h.length = size;
	h.uba = exp.uba;
	h.tokenid = exp.tokenid;
	h.scna = (uint32_t)cna;
	h.pxm_numa = -1;
	memcpy(h.seid, &eid, sizeof(eid)); /* EID as libobmm builds it: first 32 bits */
	h.node_id = (uint16_t)node_id;
	obmm_handle_encode(&h, wire);

	srv = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (srv < 0 || setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(srv, (struct sockaddr *)&sa, sizeof(sa)) || listen(srv, 16)) {
		perror("listen");
		goto out_shm;
	}
	sigaction(SIGINT, &act, NULL);
	sigaction(SIGTERM, &act, NULL);
	printf("serving handle '%s' on %s:%d (node %lld, %zu floats, element i = i * 0.001)\n",
	       name, bind_addr, port, node_id, n);
	fflush(stdout);
	while (!stop) {
		int c = accept(srv, NULL, NULL);

		if (c < 0)
			continue; /* EINTR on a signal: the loop condition ends it */
		serve_one(c, name, wire);
		close(c);
	}
	printf("stopping\n");
	rc = 0;
out_shm:
	if (srv >= 0)
		close(srv);
	if (shm >= 0)
		close(shm);
out_unexport:
	unexp.mem_id = exp.mem_id;
	if (ioctl(dev, OBMM_CMD_UNEXPORT, &unexp)) {
		perror("OBMM_CMD_UNEXPORT");
		rc = 1;
	}
out_dev:
	close(dev);
	return rc;
}
