// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * client - the smallest OBMM importer, for `obmm-testbed run` (tests/qemu/test_run_cli.py).
 *
 * Fetches the exporter's handle from the first address of OBMM_NODE_ADDRS (node 0), port
 * 7000, decodes it (examples/c/obmm_handle.h), finds the emulator's decoder window onto the
 * exporter's node, imports the region, reads every word and checks the exporter's pattern,
 * unimports.  Exit 0 only if every word matched.
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

#include "obmm_handle.h"

#define PORT 7000
#define PATTERN 0xc0de0000u
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

	snprintf(path, sizeof(path), "/sys/kernel/obmm_emu/windows/%u/base", node);
	f = fopen(path, "r");
	if (!f || fscanf(f, "%lli", &base) != 1)
		perror(path);
	if (f)
		fclose(f);
	return base;
}

int main(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(PORT) };
	struct obmm_cmd_import imp = { 0 };
	struct obmm_cmd_unimport unimp = { 0 };
	const char *addrs = getenv("OBMM_NODE_ADDRS");
	uint32_t eid = (uint32_t)env_num("OBMM_NODE_EID"), *p;
	uint8_t wire[OBMM_HANDLE_SIZE];
	enum obmm_handle_status st;
	struct obmm_handle h;
	size_t got = 0, i, bad = 0;
	int fd, dev, shm, rc = 1;
	char host[64] = "", path[64];
	ssize_t n;

	if (!addrs || sscanf(addrs, "%63s", host) != 1 || inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		fprintf(stderr, "client: no node 0 address in OBMM_NODE_ADDRS\n");
		return 1;
	}
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		perror("client: connect");
		return 1;
	}
	while (got < sizeof(wire) && (n = read(fd, wire + got, sizeof(wire) - got)) > 0)
		got += (size_t)n;
	close(fd);
	st = obmm_handle_decode(wire, got, &h);
	if (st != OBMM_HANDLE_OK) {
		fprintf(stderr, "client: bad handle: %s\n", obmm_handle_strerror(st));
		return 1;
	}
	printf("client: handle from %s: node %u mem_id %llu length %llu\n", host, h.node_id,
	       (unsigned long long)h.mem_id, (unsigned long long)h.length);

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
	printf("client: read node %u's pattern through the fabric: %zu words, %zu wrong, "
	       "first %#x last %#x\n", h.node_id, i, bad, p[0], p[i - 1]);
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
