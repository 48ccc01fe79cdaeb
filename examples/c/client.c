// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * client - fetch a handle over TCP, import the memory, verify it, time reads.
 *
 *   client HOST [--port PORT] [--name NAME] [--addr DECODER_ADDR]
 *               [--dim D] [--iters N]
 *
 * The seed's cross-node flow (scheme 7 client.c), against uapi/ub/obmm.h and
 * examples/c/obmm_handle.h and obmm_exchange.h only:
 *
 *   1. GET the handle NAME from HOST:PORT (obmm.exchange protocol version 1)
 *   2. resolve the decoder address: on the emulator, the window onto the
 *      exporter's node, /sys/kernel/obmm_emu/windows/<node>/base, plus the
 *      exporter PA carried in the UBA (bits 0..39); on hardware pass the
 *      address your decoder programming gives with --addr
 *   3. OBMM_CMD_IMPORT (ALLOW_MMAP, tokenid from the handle, scna = this
 *      node's CNA, dcna = the exporter's), mmap /dev/obmm_shmdev<mem_id>
 *   4. verify float element i == i * 0.001 (sampled, plus row 42)
 *   5. time random row reads (rows of D floats, 1364 bytes for D = 341)
 *      and single 4-byte loads; print the latencies
 *   6. munmap, OBMM_CMD_UNIMPORT
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <netdb.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <ub/obmm.h>

#define PROG "client"
#include "obmm_exchange.h"
#include "obmm_fetch.h"
#include "obmm_handle.h"

#define DEFAULT_DIM 341
#define DEFAULT_ITERS 2000
#define WARMUP 10
#define SAMPLE_STRIDE 1021
#define CHECK_ROW 42

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int check(const float *p, size_t i)
{
	float want = (float)((double)i * 0.001);

	if (memcmp(&p[i], &want, sizeof(want))) {
		fprintf(stderr, "client: element %zu is %g, expected %g\n", i, (double)p[i],
			(double)want);
		return -1;
	}
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: client HOST [--port PORT] [--name NAME] [--addr DECODER_ADDR]\n"
			"              [--dim D] [--iters N]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *host, *port = STRINGIFY(OBMM_EXCHANGE_DEFAULT_PORT), *name = "region";
	unsigned long long addr = 0, cna = 0, eid = 0;
	unsigned long dim = DEFAULT_DIM, iters = DEFAULT_ITERS;
	struct obmm_cmd_import imp = { 0 };
	struct obmm_cmd_unimport unimp = { 0 };
	struct obmm_handle h;
	int dev, shm, rc = 1, have_addr = 0;
	size_t n, rows, row_bytes, i, checked = 0;
	double t0, row_ns = 0, load_ns;
	volatile float sink = 0;
	char path[64];
	uint32_t eid32;
	float *p, *buf;

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
		else if (!strcmp(argv[a], "--dim"))
			dim = strtoul(argv[++a], NULL, 0);
		else if (!strcmp(argv[a], "--iters"))
			iters = strtoul(argv[++a], NULL, 0);
		else
			usage();
	}
	if (!dim || !iters)
		usage();
	if (fetch_handle(host, port, name, &h))
		return 1;
	printf("handle '%s': node %u mem_id %llu length %llu uba %#llx tokenid %#x\n", name,
	       h.node_id, (unsigned long long)h.mem_id, (unsigned long long)h.length,
	       (unsigned long long)h.uba, h.tokenid);
	if (!have_addr && resolve_emulator(&h, &addr))
		return 1;
	printf("decoder address %#llx\n", addr);

	/* This node's UB controller, where libobmm finds it. */
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
	imp.flags = OBMM_IMPORT_FLAG_ALLOW_MMAP;
	imp.addr = addr;
	imp.length = h.length;
	imp.tokenid = h.tokenid;
	imp.scna = (uint32_t)cna;
	imp.dcna = h.scna;
	imp.numa_id = -1;
	memcpy(imp.seid, &eid32, sizeof(eid32));
	memcpy(imp.deid, h.seid, sizeof(imp.deid));
	if (ioctl(dev, OBMM_CMD_IMPORT, &imp)) {
		perror("OBMM_CMD_IMPORT");
		goto out_dev;
	}
	printf("imported as mem_id %llu\n", (unsigned long long)imp.mem_id);

	snprintf(path, sizeof(path), "/dev/obmm_shmdev%llu", (unsigned long long)imp.mem_id);
	shm = open(path, O_RDWR | O_CLOEXEC);
	if (shm < 0) {
		perror(path);
		goto out_unimport;
	}
	p = mmap(NULL, h.length, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		close(shm);
		goto out_unimport;
	}

	n = h.length / sizeof(float);
	row_bytes = dim * sizeof(float);
	rows = h.length / row_bytes;
	for (i = 0; i < n; i += SAMPLE_STRIDE, checked++)
		if (check(p, i))
			goto out_unmap;
	for (i = 0; rows > CHECK_ROW && i < 4; i++, checked++)
		if (check(p, CHECK_ROW * dim + i))
			goto out_unmap;
	if (check(p, n - 1))
		goto out_unmap;
	printf("verified %zu sampled floats of %zu: OK\n", checked + 1, n);

	buf = malloc(row_bytes);
	if (!buf || !rows)
		goto out_unmap;
	srand(42);
	for (i = 0; i < WARMUP + iters; i++) {
		size_t r = (size_t)rand() % rows;

		t0 = now_ns();
		memcpy(buf, (const char *)p + r * row_bytes, row_bytes);
		if (i >= WARMUP)
			row_ns += now_ns() - t0;
		sink += buf[0];
	}
	row_ns /= (double)iters;
	t0 = now_ns();
	for (i = 0; i < iters; i++)
		sink += p[((size_t)rand() % rows) * dim];
	load_ns = (now_ns() - t0) / (double)iters;
	free(buf);
	printf("random row read (%zu B, %zu rows): avg %.0f ns, %.1f MB/s\n", row_bytes, rows,
	       row_ns, (double)row_bytes / row_ns * 1e3);
	printf("random 4-byte load: avg %.0f ns\n", load_ns);
	rc = 0;
out_unmap:
	munmap(p, h.length);
	close(shm);
out_unimport:
	unimp.mem_id = imp.mem_id;
	if (ioctl(dev, OBMM_CMD_UNIMPORT, &unimp)) {
		perror("OBMM_CMD_UNIMPORT");
		rc = 1;
	}
out_dev:
	close(dev);
	return rc;
}
