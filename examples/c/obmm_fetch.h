/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * obmm_fetch.h - what both example clients (client.c, borrower.c) do first:
 * GET a handle from an obmm.exchange server, and resolve the decoder
 * address of the exported memory on the emulated fabric.  Define PROG (the
 * program name for messages) before including it.
 */
#ifndef OBMM_FETCH_H
#define OBMM_FETCH_H

#include <errno.h>
#include <glob.h>
#include <libgen.h>
#include <limits.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "obmm_exchange.h"
#include "obmm_handle.h"

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)
#define TIMEOUT_S 10
#define EMU_SYSFS "/sys/kernel/obmm_emu"
/* The real obmm.ko's compat layer publishes the same fabric files here. */
#define COMPAT_SYSFS "/sys/kernel/ub_compat"
#define UBA_VALID (1ULL << 48)
#define UBA_NODE_SHIFT 40
#define UBA_PA_MASK ((1ULL << 40) - 1)

static int read_u64(const char *path, unsigned long long *out)
{
	FILE *f = fopen(path, "r");
	int ok;

	if (!f)
		return -1;
	ok = fscanf(f, "%lli", (long long *)out) == 1;
	fclose(f);
	return ok ? 0 : -1;
}

/*
 * An attribute of this node's first UB controller, found as libobmm finds it:
 * the directory of the first /sys/devices/ub_bus_controller<i>/(*)/ubc.
 */
static int read_controller(const char *attr, unsigned long long *out)
{
	char pattern[64], path[PATH_MAX];
	glob_t g;
	int i, ret;

	for (i = 0; i < 8; i++) {
		snprintf(pattern, sizeof(pattern), "/sys/devices/ub_bus_controller%d/*/ubc", i);
		if (glob(pattern, 0, NULL, &g) || !g.gl_pathc) {
			globfree(&g);
			continue;
		}
		snprintf(path, sizeof(path), "%s/%s", dirname(g.gl_pathv[0]), attr);
		globfree(&g);
		ret = read_u64(path, out);
		if (!ret)
			return 0;
	}
	return -1;
}

static int fetch_handle(const char *host, const char *port, const char *name,
			struct obmm_handle *h)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai;
	struct timeval tv = { .tv_sec = TIMEOUT_S };
	uint8_t req[4 + OBMM_EXCHANGE_HEAD + 256], lenbuf[4], resp[OBMM_EXCHANGE_MAX_FRAME];
	size_t name_len = strlen(name);
	enum obmm_handle_status st;
	uint32_t len;
	int fd, err;

	if (name_len > 255)
		return -1;
	err = getaddrinfo(host, port, &hints, &ai);
	if (err) {
		fprintf(stderr, PROG ": %s: %s\n", host, gai_strerror(err));
		return -1;
	}
	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) ||
	    connect(fd, ai->ai_addr, ai->ai_addrlen)) {
		fprintf(stderr, PROG ": connect %s:%s: %s\n", host, port, strerror(errno));
		freeaddrinfo(ai);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	freeaddrinfo(ai);
	obmm_exchange_head(req, name_len, OBMM_EXCHANGE_OP_GET);
	memcpy(req + 4 + OBMM_EXCHANGE_HEAD, name, name_len);
	if (obmm_io_all(fd, req, 4 + OBMM_EXCHANGE_HEAD + name_len, 1) ||
	    obmm_io_all(fd, lenbuf, 4, 0))
		goto io_err;
	len = (uint32_t)obmm_get_le(lenbuf, 4);
	if (len < OBMM_EXCHANGE_HEAD || len > OBMM_EXCHANGE_MAX_FRAME ||
	    obmm_io_all(fd, resp, len, 0))
		goto io_err;
	close(fd);
	if (!obmm_exchange_head_ok(resp, len)) {
		fprintf(stderr, PROG ": %s:%s is not an obmm exchange server\n", host, port);
		return -1;
	}
	if (resp[5] != OBMM_EXCHANGE_ST_OK) {
		fprintf(stderr, PROG ": server answered status %u: %.*s\n", resp[5],
			(int)(len - OBMM_EXCHANGE_HEAD), (const char *)resp + OBMM_EXCHANGE_HEAD);
		return -1;
	}
	st = obmm_handle_decode(resp + OBMM_EXCHANGE_HEAD, len - OBMM_EXCHANGE_HEAD, h);
	if (st != OBMM_HANDLE_OK) {
		fprintf(stderr, PROG ": bad handle: %s\n", obmm_handle_strerror(st));
		return -1;
	}
	return 0;
io_err:
	fprintf(stderr, PROG ": exchange with %s:%s failed: %s\n", host, port,
		errno ? strerror(errno) : "connection closed");
	close(fd);
	return -1;
}

/* The testbed's fabric files: the emulator's, or the real driver's compat layer's. */
static const char *fabric_sysfs(void)
{
	if (access(EMU_SYSFS, F_OK) && !access(COMPAT_SYSFS, F_OK))
		return COMPAT_SYSFS;
	return EMU_SYSFS;
}

/* One integer of the fabric's files (name relative to fabric_sysfs()). */
static int read_fabric(const char *name, unsigned long long *out)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/%s", fabric_sysfs(), name);
	return read_u64(path, out);
}

/*
 * The testbed's decoder: window onto the exporter's node + the exporter PA
 * past the node's RAM base (windows/<node>/remote_base: 0 on x86, 1 GiB on
 * arm64's virt machine; absent in older modules).
 */
static int resolve_emulator(const struct obmm_handle *h, unsigned long long *addr)
{
	unsigned long long node, pa, base, size, wnode, rbase = 0;
	char path[128];

	if (!(h->uba & UBA_VALID) || h->uba >> 49) {
		fprintf(stderr, PROG ": UBA %#llx is not a testbed UBA; pass --addr\n",
			(unsigned long long)h->uba);
		return -1;
	}
	node = (h->uba >> UBA_NODE_SHIFT) & 0xff;
	pa = h->uba & UBA_PA_MASK;
	snprintf(path, sizeof(path), "%s/windows/%llu/node", fabric_sysfs(), node);
	if (read_u64(path, &wnode) || wnode != node)
		goto no_window;
	snprintf(path, sizeof(path), "%s/windows/%llu/base", fabric_sysfs(), node);
	if (read_u64(path, &base))
		goto no_window;
	snprintf(path, sizeof(path), "%s/windows/%llu/remote_base", fabric_sysfs(), node);
	if (access(path, F_OK) == 0 && read_u64(path, &rbase))
		goto no_window;
	snprintf(path, sizeof(path), "%s/windows/%llu/size", fabric_sysfs(), node);
	if (read_u64(path, &size) || pa < rbase || pa - rbase + h->length > size) {
		fprintf(stderr, PROG ": export is outside the window onto node %llu\n", node);
		return -1;
	}
	*addr = base + pa - rbase;
	return 0;
no_window:
	fprintf(stderr, PROG ": no decoder window onto node %llu (%s); pass --addr\n",
		node, path);
	return -1;
}

#endif /* OBMM_FETCH_H */
