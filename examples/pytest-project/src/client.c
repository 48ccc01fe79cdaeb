// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * client - fetches an exporter's handle, imports the region, checks the pattern.
 *
 *   client HOST [PORT]         (default 7000)
 *
 * GETs "region" from HOST:PORT (examples/c/obmm_exchange.h), decodes the handle
 * (examples/c/obmm_handle.h), finds the emulator's decoder window onto the exporter's node,
 * imports, reads every word against PATTERN ^ i, unimports.  Exit 0 only if all matched.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <ub/obmm.h>

#include "obmm_exchange.h"
#include "obmm_handle.h"

#define PATTERN 0xc0de0000u
#define NAME "region"
#define UBA_NODE_SHIFT 40
#define UBA_PA_MASK ((1ULL << 40) - 1)

static unsigned long long env_num(const char *name)
{
	const char *v = getenv(name);

	return v ? strtoull(v, NULL, 0) : 0;
}

static unsigned long long window_base(unsigned int node)
{
	unsigned long long base = 0;
	char path[96];
	FILE *f;

	/* the emulator's fabric files, or the real obmm.ko's compat layer's */
	snprintf(path, sizeof(path), "%s/windows/%u/base",
		 access("/sys/kernel/obmm_emu", F_OK) ? "/sys/kernel/ub_compat" : "/sys/kernel/obmm_emu",
		 node);
	f = fopen(path, "r");
	if (!f || fscanf(f, "%lli", &base) != 1)
		perror(path);
	if (f)
		fclose(f);
	return base;
}

/* GET "region" from host:port into h; 0 on success. */
static int fetch(const char *host, int port, struct obmm_handle *h)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	uint8_t req[4 + OBMM_EXCHANGE_HEAD + sizeof(NAME)], lenbuf[4], resp[256];
	enum obmm_handle_status st;
	uint32_t len;
	int fd;

	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
	    connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		perror("client: connect");
		return -1;
	}
	obmm_exchange_head(req, strlen(NAME), OBMM_EXCHANGE_OP_GET);
	memcpy(req + 4 + OBMM_EXCHANGE_HEAD, NAME, strlen(NAME));
	if (obmm_send_all(fd, req, 4 + OBMM_EXCHANGE_HEAD + strlen(NAME)) ||
	    obmm_io_all(fd, lenbuf, 4, 0) || (len = (uint32_t)obmm_get_le(lenbuf, 4)) > sizeof(resp) ||
	    obmm_io_all(fd, resp, len, 0) || !obmm_exchange_head_ok(resp, len)) {
		fprintf(stderr, "client: bad exchange with %s:%d\n", host, port);
		close(fd);
		return -1;
	}
	close(fd);
	if (resp[5] != OBMM_EXCHANGE_ST_OK) {
		fprintf(stderr, "client: %s:%d answered status %u\n", host, port, resp[5]);
		return -1;
	}
	st = obmm_handle_decode(resp + OBMM_EXCHANGE_HEAD, len - OBMM_EXCHANGE_HEAD, h);
	if (st != OBMM_HANDLE_OK) {
		fprintf(stderr, "client: bad handle: %s\n", obmm_handle_strerror(st));
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct obmm_cmd_import imp = { 0 };
	struct obmm_cmd_unimport unimp = { 0 };
	uint32_t eid = (uint32_t)env_num("OBMM_NODE_EID"), *p;
	struct obmm_handle h;
	size_t i, bad = 0;
	int dev, shm, rc = 1;
	char path[64];

	if (argc < 2) {
		fprintf(stderr, "usage: client HOST [PORT]\n");
		return 2;
	}
	if (fetch(argv[1], argc > 2 ? atoi(argv[2]) : 7000, &h))
		return 1;
	printf("client: handle '%s' from %s: node %u mem_id %llu length %llu\n", NAME, argv[1],
	       h.node_id, (unsigned long long)h.mem_id, (unsigned long long)h.length);

	dev = open("/dev/obmm", O_RDWR);
	if (dev < 0) {
		perror("client: /dev/obmm");
		return 1;
	}
	imp.flags = OBMM_IMPORT_FLAG_ALLOW_MMAP;
	imp.addr = window_base((h.uba >> UBA_NODE_SHIFT) & 0xff) + (h.uba & UBA_PA_MASK);
	imp.length = h.length;
	imp.tokenid = h.tokenid;
	imp.scna = (uint32_t)env_num("OBMM_NODE_CNA");
	imp.dcna = h.scna;
	imp.numa_id = -1;
	memcpy(imp.seid, &eid, sizeof(eid));
	memcpy(imp.deid, h.seid, sizeof(imp.deid));
	if (ioctl(dev, OBMM_CMD_IMPORT, &imp)) {
		perror("client: OBMM_CMD_IMPORT");
		return 1;
	}
	snprintf(path, sizeof(path), "/dev/obmm_shmdev%llu", (unsigned long long)imp.mem_id);
	shm = open(path, O_RDWR);
	p = shm < 0 ? MAP_FAILED : mmap(NULL, h.length, PROT_READ, MAP_SHARED, shm, 0);
	if (p == MAP_FAILED) {
		perror(path);
		goto out;
	}
	for (i = 0; i < h.length / sizeof(*p); i++)
		bad += p[i] != (PATTERN ^ (uint32_t)i);
	printf("client: read node %u's pattern: %zu words, %zu wrong\n", h.node_id, i, bad);
	rc = bad ? 1 : 0;
	munmap(p, h.length);
	close(shm);
out:
	unimp.mem_id = imp.mem_id;
	if (ioctl(dev, OBMM_CMD_UNIMPORT, &unimp)) {
		perror("client: OBMM_CMD_UNIMPORT");
		rc = 1;
	}
	return rc;
}
