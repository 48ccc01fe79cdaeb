// SPDX-License-Identifier: GPL-2.0
/*
 * OBMM smoke test: plain C against uapi/ub/obmm.h, no other library.
 * Export 2 MiB, write a 1 KiB pattern through the export's shmdev, import
 * the same memory back through this node's own fabric window (loopback),
 * read the pattern there, time a dependent-load loop, tear down.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <ub/obmm.h>

#include "obmm_test_util.h"

#define REGION_SIZE OBMM_SZ_2M
#define PATTERN_LEN 1024
#define CACHE_LINE 64
#define LOAD_ROUNDS 16

static int fail(const char *what)
{
	fprintf(stderr, "smoke: %s failed: %s\n", what, strerror(errno));
	return 1;
}

static void *map_shmdev(unsigned long long mem_id, int *fd_out)
{
	char path[64];
	void *p;
	int fd;

	snprintf(path, sizeof(path), "/dev/obmm_shmdev%llu", mem_id);
	fd = open(path, O_RDWR);
	if (fd < 0)
		return MAP_FAILED;
	p = mmap(NULL, REGION_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		return MAP_FAILED;
	}
	*fd_out = fd;
	return p;
}

/* Dependent loads, one per cache line: each load's address is the value. */
static double load_latency_ns(__u64 *base)
{
	size_t n = REGION_SIZE / CACHE_LINE, stride = CACHE_LINE / sizeof(*base);
	struct timespec t0, t1;
	__u64 idx = 0;
	size_t i;
	int r;

	for (i = 0; i < n; i++)
		base[i * stride] = ((i + 1) % n) * stride;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (r = 0; r < LOAD_ROUNDS; r++)
		for (i = 0; i < n; i++)
			idx = __atomic_load_n(&base[idx], __ATOMIC_RELAXED);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (idx != 0)
		fprintf(stderr, "smoke: chase ended at %llu\n",
			(unsigned long long)idx);
	return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) /
	       ((double)n * LOAD_ROUNDS);
}

int main(void)
{
	struct obmm_cmd_export exp = { 0 };
	struct obmm_cmd_import imp = { 0 };
	struct obmm_cmd_addr_query q = { 0 };
	struct obmm_cmd_unexport unexp = { 0 };
	struct obmm_cmd_unimport unimp = { 0 };
	unsigned char pattern[PATTERN_LEN];
	int obmm, efd, ifd, i;
	unsigned char *emap, *imap;

	obmm = open("/dev/obmm", O_RDWR);
	if (obmm < 0)
		return fail("open /dev/obmm");

	exp.size[0] = REGION_SIZE;
	exp.length = OBMM_MAX_LOCAL_NUMA_NODES;
	exp.flags = OBMM_EXPORT_FLAG_ALLOW_MMAP;
	if (ioctl(obmm, OBMM_CMD_EXPORT, &exp))
		return fail("OBMM_CMD_EXPORT");
	printf("export: mem_id %llu tokenid %#x uba %#llx\n",
	       (unsigned long long)exp.mem_id, exp.tokenid,
	       (unsigned long long)exp.uba);

	emap = map_shmdev(exp.mem_id, &efd);
	if (emap == MAP_FAILED)
		return fail("mmap export");
	for (i = 0; i < PATTERN_LEN; i++) {
		if (emap[i])
			return fail("exported memory not zeroed");
		pattern[i] = (unsigned char)(i * 7 + 3);
	}
	memcpy(emap, pattern, PATTERN_LEN);

	/* Loopback decoder address: own window + exporter PA. */
	q.key_type = OBMM_QUERY_BY_ID_OFFSET;
	q.mem_id = exp.mem_id;
	if (ioctl(obmm, OBMM_CMD_ADDR_QUERY, &q))
		return fail("OBMM_CMD_ADDR_QUERY");
	imp.flags = OBMM_IMPORT_FLAG_ALLOW_MMAP;
	imp.addr = obmm_window_addr(obmm_node_id(), q.pa);
	imp.length = REGION_SIZE;
	imp.scna = obmm_cna();
	imp.tokenid = exp.tokenid;
	imp.numa_id = -1;
	if (ioctl(obmm, OBMM_CMD_IMPORT, &imp))
		return fail("OBMM_CMD_IMPORT");
	printf("import: mem_id %llu addr %#llx\n",
	       (unsigned long long)imp.mem_id, (unsigned long long)imp.addr);

	imap = map_shmdev(imp.mem_id, &ifd);
	if (imap == MAP_FAILED)
		return fail("mmap import");
	if (memcmp(imap, pattern, PATTERN_LEN)) {
		errno = EIO;
		return fail("pattern compare through the import");
	}
	printf("pattern: %d bytes read back through the loopback window\n",
	       PATTERN_LEN);
	printf("load latency: export %.1f ns, import %.1f ns\n",
	       load_latency_ns((__u64 *)emap),
	       load_latency_ns((__u64 *)imap));

	munmap(imap, REGION_SIZE);
	close(ifd);
	unimp.mem_id = imp.mem_id;
	if (ioctl(obmm, OBMM_CMD_UNIMPORT, &unimp))
		return fail("OBMM_CMD_UNIMPORT");
	munmap(emap, REGION_SIZE);
	close(efd);
	unexp.mem_id = exp.mem_id;
	if (ioctl(obmm, OBMM_CMD_UNEXPORT, &unexp))
		return fail("OBMM_CMD_UNEXPORT");
	close(obmm);
	printf("smoke: PASS\n");
	return 0;
}
