// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * borrower - the borrow model: import an export as memory of a remote NUMA
 * node, use it through mbind(), give it back.
 *
 *   borrower HOST [--port PORT] [--name NAME] [--addr DECODER_ADDR]
 *                 [--node NUMA_ID] [--fill MIB]
 *
 * Against uapi/ub/obmm.h, obmm_handle.h and obmm_exchange.h only:
 *
 *   1. GET the handle NAME from HOST:PORT and resolve the decoder address
 *      (as client.c); the export must be whole memory blocks (128 MiB on
 *      x86_64): run the exporter with --size 128
 *   2. OBMM_CMD_IMPORT with OBMM_IMPORT_FLAG_NUMA_REMOTE: the kernel hot-adds
 *      the range as memory of a remote NUMA node, numa_id comes back
 *   3. bind an anonymous buffer of MIB MiB to that node (mbind MPOL_BIND),
 *      fill it, check where its pages are (move_pages) and verify it: the
 *      bytes live in the exporter's memory
 *   4. free the buffer, OBMM_CMD_UNIMPORT: the node's memory is removed
 *
 * Any other program can use the node the same way: numactl --membind=N.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include <ub/obmm.h>

#define PROG "borrower"
#include "obmm_exchange.h"
#include "obmm_fetch.h"
#include "obmm_handle.h"

#define DEFAULT_FILL_MIB 64
#define PAGE 4096
#define MPOL_BIND 2
#define PATTERN(i) (0x0b0e0b0e00000000ULL ^ (uint64_t)(i))

static long node_mem_kb(int node)
{
	char path[96], line[128];
	long kb = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/meminfo", node);
	f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "MemTotal:"))
			sscanf(strstr(line, "MemTotal:") + 9, "%ld", &kb);
	fclose(f);
	return kb;
}

/* glibc has no mbind()/move_pages() wrappers (they are libnuma's). */
static long bind_to(void *p, size_t len, int node)
{
	unsigned long mask[(1024 + 63) / 64] = { 0 };

	mask[node / 64] = 1UL << (node % 64);
	return syscall(SYS_mbind, p, len, MPOL_BIND, mask, 1024 + 1, 0);
}

static size_t pages_on(void *p, size_t len, int node)
{
	size_t n = len / PAGE, on = 0, i;
	void **pages = calloc(n, sizeof(*pages));
	int *status = calloc(n, sizeof(*status));

	if (!pages || !status)
		goto out;
	for (i = 0; i < n; i++)
		pages[i] = (char *)p + i * PAGE;
	if (syscall(SYS_move_pages, 0, n, pages, NULL, status, 0))
		goto out;
	for (i = 0; i < n; i++)
		on += status[i] == node;
out:
	free(pages);
	free(status);
	return on;
}

static void usage(void)
{
	fprintf(stderr, "usage: borrower HOST [--port PORT] [--name NAME] [--addr ADDR] "
		"[--node NUMA_ID] [--fill MIB]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *host, *port = STRINGIFY(OBMM_EXCHANGE_DEFAULT_PORT), *name = "region";
	unsigned long long addr = 0, cna = 0, eid = 0;
	struct obmm_cmd_import imp = { 0 };
	struct obmm_cmd_unimport unimp = { 0 };
	unsigned long fill_mib = DEFAULT_FILL_MIB;
	int dev, rc = 1, have_addr = 0, node = -1;
	struct obmm_handle h;
	size_t len, i, on;
	uint64_t *buf;
	uint32_t eid32;

	if (argc < 2 || argv[1][0] == '-')
		usage();
	host = argv[1];
	for (int a = 2; a < argc; a++) {
		if (a + 1 >= argc)
			usage();
		if (!strcmp(argv[a], "--port"))
			port = argv[++a];
		else if (!strcmp(argv[a], "--name"))
			name = argv[++a];
		else if (!strcmp(argv[a], "--addr"))
			addr = strtoull(argv[++a], NULL, 0), have_addr = 1;
		else if (!strcmp(argv[a], "--node"))
			node = atoi(argv[++a]);
		else if (!strcmp(argv[a], "--fill"))
			fill_mib = strtoul(argv[++a], NULL, 0);
		else
			usage();
	}
	if (!fill_mib)
		usage();
	if (fetch_handle(host, port, name, &h))
		return 1;
	printf("handle '%s': node %u mem_id %llu length %llu\n", name, h.node_id,
	       (unsigned long long)h.mem_id, (unsigned long long)h.length);
	if (!have_addr && resolve_emulator(&h, &addr))
		return 1;
	if (read_controller("primary_cna", &cna))
		read_fabric("cna", &cna);
	if (read_controller("eid", &eid))
		read_fabric("eid", &eid);
	eid32 = (uint32_t)eid;

	dev = open("/dev/obmm", O_RDWR | O_CLOEXEC);
	if (dev < 0) {
		perror("open /dev/obmm");
		return 1;
	}
	imp.flags = OBMM_IMPORT_FLAG_NUMA_REMOTE;
	imp.addr = addr;
	imp.length = h.length;
	imp.tokenid = h.tokenid;
	imp.scna = (uint32_t)cna;
	imp.dcna = h.scna;
	imp.numa_id = node;
	memcpy(imp.seid, &eid32, sizeof(eid32));
	memcpy(imp.deid, h.seid, sizeof(imp.deid));
	if (ioctl(dev, OBMM_CMD_IMPORT, &imp)) {
		/* EPERM: not whole memory blocks, or no remote NUMA node left */
		perror("OBMM_CMD_IMPORT (NUMA_REMOTE)");
		goto out_dev;
	}
	printf("borrowed as mem_id %llu on NUMA node %d (%ld MiB)\n",
	       (unsigned long long)imp.mem_id, imp.numa_id, node_mem_kb(imp.numa_id) >> 10);

	len = (size_t)fill_mib << 20;
	buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		perror("mmap");
		goto out_unimport;
	}
	if (bind_to(buf, len, imp.numa_id)) {
		perror("mbind");
		goto out_unmap;
	}
	for (i = 0; i < len / sizeof(*buf); i++)
		buf[i] = PATTERN(i);
	on = pages_on(buf, len, imp.numa_id);
	for (i = 0; i < len / sizeof(*buf); i++)
		if (buf[i] != PATTERN(i)) {
			fprintf(stderr, "word %zu reads %#llx\n", i, (unsigned long long)buf[i]);
			goto out_unmap;
		}
	printf("filled and verified %lu MiB; %zu of %zu pages on node %d\n", fill_mib, on,
	       len / PAGE, imp.numa_id);
	rc = on == len / PAGE ? 0 : 1;
out_unmap:
	munmap(buf, len);
out_unimport:
	unimp.mem_id = imp.mem_id;
	if (ioctl(dev, OBMM_CMD_UNIMPORT, &unimp)) {
		/* EBUSY / EINTR: pages of the node could not be moved away yet */
		perror("OBMM_CMD_UNIMPORT");
		rc = 1;
	} else {
		printf("unimported; node %d has %ld MiB\n", imp.numa_id,
		       node_mem_kb(imp.numa_id) >> 10);
	}
out_dev:
	close(dev);
	return rc;
}
