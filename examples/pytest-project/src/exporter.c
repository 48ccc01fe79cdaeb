// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * exporter - exports memory, fills it, serves its handle with the obmm.exchange protocol.
 *
 *   exporter [PORT [MIB]]      (default 7000, 2 MiB)
 *
 * Word i of the region is PATTERN ^ i.  The handle (examples/c/obmm_handle.h) is published
 * as "region" on OBMM_NODE_ADDR:PORT (GET and LIST of examples/c/obmm_exchange.h); its
 * source fields come from the environment obmm-testbed gives every command.  SIGTERM:
 * unexport, print "exporter: unexported", exit 0.
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

#include "obmm_exchange.h"
#include "obmm_handle.h"

#define MIB (1UL << 20)
#define PATTERN 0xc0de0000u
#define NAME "region"

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

static void reply(int fd, uint8_t status, const void *body, size_t len)
{
	uint8_t head[4 + OBMM_EXCHANGE_HEAD];

	obmm_exchange_head(head, len, status);
	if (!obmm_send_all(fd, head, sizeof(head)) && len)
		obmm_send_all(fd, body, len);
}

/* One connection: one request ("OBMX" 1 op [name]), one response. */
static void serve_one(int fd, const uint8_t wire[OBMM_HANDLE_SIZE])
{
	uint8_t lenbuf[4], req[64];
	uint32_t len;

	if (obmm_io_all(fd, lenbuf, sizeof(lenbuf), 0))
		return;
	len = (uint32_t)obmm_get_le(lenbuf, 4);
	if (len > sizeof(req) || obmm_io_all(fd, req, len, 0) || !obmm_exchange_head_ok(req, len)) {
		reply(fd, OBMM_EXCHANGE_ST_BAD_REQUEST, "bad request", 11);
		return;
	}
	if (req[5] == OBMM_EXCHANGE_OP_LIST)
		reply(fd, OBMM_EXCHANGE_ST_OK, NAME, strlen(NAME));
	else if (req[5] == OBMM_EXCHANGE_OP_GET && len - OBMM_EXCHANGE_HEAD == strlen(NAME) &&
		 !memcmp(req + OBMM_EXCHANGE_HEAD, NAME, strlen(NAME)))
		reply(fd, OBMM_EXCHANGE_ST_OK, wire, OBMM_HANDLE_SIZE);
	else
		reply(fd, OBMM_EXCHANGE_ST_NOT_FOUND, "no such handle", 14);
}

int main(int argc, char **argv)
{
	int port = argc > 1 ? atoi(argv[1]) : 7000;
	unsigned long size = (argc > 2 ? strtoul(argv[2], NULL, 0) : 2) * MIB;
	struct obmm_cmd_export exp = { 0 };
	struct obmm_cmd_unexport unexp = { 0 };
	struct obmm_handle h = { 0 };
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
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
	exp.size[0] = size;
	exp.length = 1;
	exp.flags = OBMM_EXPORT_FLAG_ALLOW_MMAP;
	if (ioctl(dev, OBMM_CMD_EXPORT, &exp)) {
		perror("exporter: OBMM_CMD_EXPORT");
		return 1;
	}
	snprintf(path, sizeof(path), "/dev/obmm_shmdev%llu", (unsigned long long)exp.mem_id);
	shm = open(path, O_RDWR);
	p = shm < 0 ? MAP_FAILED : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
	if (p == MAP_FAILED) {
		perror(path);
		goto out;
	}
	for (i = 0; i < size / sizeof(*p); i++)
		p[i] = PATTERN ^ (uint32_t)i;
	/* Before the handle is published: on UB the unmap writes the stores back. */
	munmap(p, size);
	close(shm);

	h.mem_id = exp.mem_id;
	h.length = size;
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
	printf("exporter: mem_id %llu, %lu bytes, serving '%s' on %s:%d\n",
	       (unsigned long long)exp.mem_id, size, NAME, addr, port);
	fflush(stdout);
	while (!stop) {
		int c = accept(srv, NULL, NULL);

		if (c < 0)
			continue;
		serve_one(c, wire);
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
