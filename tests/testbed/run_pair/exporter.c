// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * exporter - the smallest OBMM exporter, for `obmm-testbed run` (tests/qemu/test_run_cli.py).
 *
 * Exports 2 MiB, writes word i = PATTERN ^ i through /dev/obmm_shmdev<id>, and hands its
 * 88-byte handle (examples/c/obmm_handle.h) to every TCP client on OBMM_NODE_ADDR:7000.
 * The handle's source fields come from the environment `run` gives every command.
 * SIGTERM (run stops the service when the client is done): unexport and exit.
 */
#include <fcntl.h>
#include <signal.h>
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

#define SIZE (2UL << 20)
#define PORT 7000
#define PATTERN 0xc0de0000u

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

static unsigned long long env_num(const char *name)
{
	const char *v = getenv(name);

	return v ? strtoull(v, NULL, 0) : 0;
}

int main(void)
{
	struct obmm_cmd_export exp = { 0 };
	struct obmm_cmd_unexport unexp = { 0 };
	struct obmm_handle h = { 0 };
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(PORT) };
	struct sigaction act = { .sa_handler = on_term }; /* no SA_RESTART: accept() returns */
	const char *addr = getenv("OBMM_NODE_ADDR");
	uint32_t eid = (uint32_t)env_num("OBMM_NODE_EID"), *p;
	uint8_t wire[OBMM_HANDLE_SIZE];
	int dev, shm, srv, one = 1, rc = 1;
	char path[64];
	size_t i;

	dev = open("/dev/obmm", O_RDWR);
	if (dev < 0 || !addr || inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
		perror("exporter: /dev/obmm or OBMM_NODE_ADDR");
		return 1;
	}
	exp.size[0] = SIZE;
	exp.length = 1;
	exp.flags = OBMM_EXPORT_FLAG_ALLOW_MMAP;
	if (ioctl(dev, OBMM_CMD_EXPORT, &exp)) {
		perror("exporter: OBMM_CMD_EXPORT");
		return 1;
	}
	snprintf(path, sizeof(path), "/dev/obmm_shmdev%llu", (unsigned long long)exp.mem_id);
	shm = open(path, O_RDWR);
	p = shm < 0 ? MAP_FAILED : mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
	if (p == MAP_FAILED) {
		perror(path);
		goto out;
	}
	for (i = 0; i < SIZE / sizeof(*p); i++)
		p[i] = PATTERN ^ (uint32_t)i;
	munmap(p, SIZE);
	close(shm);

	h.mem_id = exp.mem_id;
	h.length = SIZE;
	h.uba = exp.uba;
	h.tokenid = exp.tokenid;
	h.scna = (uint32_t)env_num("OBMM_NODE_CNA");
	h.pxm_numa = -1;
	memcpy(h.seid, &eid, sizeof(eid));
	h.node_id = (uint16_t)env_num("OBMM_NODE_ID");
	obmm_handle_encode(&h, wire);

	srv = socket(AF_INET, SOCK_STREAM, 0);
	if (srv < 0 || setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(srv, (struct sockaddr *)&sa, sizeof(sa)) || listen(srv, 4)) {
		perror("exporter: listen");
		goto out;
	}
	sigaction(SIGTERM, &act, NULL);
	printf("exporter: mem_id %llu, %lu bytes of pattern %#x ^ i, listening on %s:%d\n",
	       (unsigned long long)exp.mem_id, SIZE, PATTERN, addr, PORT);
	fflush(stdout);
	while (!stop) {
		int c = accept(srv, NULL, NULL);

		if (c < 0)
			continue;
		if (write(c, wire, sizeof(wire)) != (ssize_t)sizeof(wire))
			perror("exporter: write");
		close(c);
	}
	close(srv);
	rc = 0;
out:
	unexp.mem_id = exp.mem_id;
	if (ioctl(dev, OBMM_CMD_UNEXPORT, &unexp)) {
		perror("exporter: OBMM_CMD_UNEXPORT");
		rc = 1;
	}
	printf("exporter: unexported\n");
	return rc;
}
