// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * handoff - a cross-node hand-off written as code for a Kunpeng (arm64) UB host writes it:
 * bus fences (dmb osh, dmb ishst) and user-level cache maintenance (dc civac) around every
 * hand-over of a buffer between two nodes that share memory through OBMM.
 *
 *   handoff export [PORT]            node 0: export 2 MiB, serve its handle, answer rounds
 *   handoff import [HOST [PORT]]     node 1: import it (HOST: node 0, from OBMM_NODE_ADDRS)
 *
 * Built and run on arm64 nodes with one line (examples/README.md, "arm64"):
 *
 *   obmm-testbed run --arch arm64 --dir examples/arm64 \
 *       --node 0='make && exec ./handoff export' --node 1='make && ./handoff import' \
 *       --service 0 --ready-line 'serving handle'
 *
 * The region: two flags (one per direction, each on a page of its own) and two payload areas
 * (one per direction: every cache line has one writer).  For ROUNDS rounds the importer
 * publishes a payload and raises its flag, the exporter waits for the flag, checks every word
 * and publishes its answer the same way; the importer checks the answer.  Then the importer
 * raises its flag once more (done), the exporter answers with its count of wrong words, the
 * importer unimports and exits; the exporter unexports when stopped (SIGTERM: `run` stops a
 * service once the others have ended), never before: unexporting revokes the importer's
 * mapping.  Publishing:
 *
 *   write the payload words; dmb ishst; write its header (round, words, checksum)
 *   dc civac over header and payload       the lines to the point of coherency
 *   dmb osh                                ... before the flag, for the other node
 *   flag = round; dc civac flag; dmb osh
 *
 * Receiving: dc civac flag; dmb osh; read flag (until it says this round); dmb osh; dc civac
 * over header and payload (EL0 has no dc ivac: civac drops the stale line too); dmb osh; read.
 *
 * The node's identity (OBMM_NODE_ID, OBMM_NODE_CNA, OBMM_NODE_EID, OBMM_NODE_ADDR) comes
 * from the environment `obmm-testbed run` gives every command (else the UB controller's or
 * the fabric's files), the decoder address from the testbed's fabric files (obmm_fetch.h).  Exit 0 only if every
 * word of every round matched, both ends unexported / unimported.
 */
#ifndef __aarch64__
#error "handoff uses arm64 instructions (dmb, dc civac): build it on an arm64 node (obmm-testbed run --arch arm64)"
#endif

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/utsname.h>

#include <ub/obmm.h>

#define PROG "handoff"
#include "obmm_exchange.h"
#include "obmm_fetch.h"
#include "obmm_handle.h"

#define SIZE (2UL << 20)
#define NAME "handoff"
#define ROUNDS 8
#define WORDS (64 * 1024 / 8) /* 64 KiB a payload */
#define FLAG_TO_EXPORTER 0x0000 /* written by the importer */
#define FLAG_TO_IMPORTER 0x1000 /* written by the exporter */
#define AREA_TO_EXPORTER 0x10000
#define AREA_TO_IMPORTER 0x80000
#define DONE (ROUNDS + 1UL) /* the importer's last flag: the exporter may unexport */
#ifndef WAIT_S
#define WAIT_S 120
#endif

struct payload {
	uint64_t round, words, sum;
	uint64_t pad[5]; /* the header fills a 64-byte line; the words start on the next */
	uint64_t word[WORDS];
};

static size_t line; /* the smallest data cache line, from CTR_EL0 */
static volatile sig_atomic_t stop; /* SIGTERM/SIGINT: stop waiting, clean up */

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

#define DMB_OSH() __asm__ volatile("dmb osh" ::: "memory")
#define DMB_ISHST() __asm__ volatile("dmb ishst" ::: "memory")

/* CTR_EL0.DminLine: log2 of the line in words (Linux lets EL0 read CTR_EL0). */
static size_t dcache_line(void)
{
	uint64_t ctr;

	__asm__ volatile("mrs %0, ctr_el0" : "=r"(ctr));
	return 4UL << ((ctr >> 16) & 0xf);
}

/* dc civac over [p, p + len): clean to the point of coherency and invalidate. */
static void civac(const volatile void *p, size_t len)
{
#ifdef HANDOFF_NO_DC /* make NO_DC=1: the bug strict coherence shows (docs/coherence.md) */
	(void)p;
	(void)len;
#else
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)(line - 1), end = (uintptr_t)p + len;

	for (; a < end; a += line)
		__asm__ volatile("dc civac, %0" ::"r"(a) : "memory");
#endif
}

static uint64_t word_of(uint64_t round, unsigned int writer, size_t i)
{
	return (round << 48) ^ ((uint64_t)writer << 40) ^ (i * 0x9e3779b97f4a7c15ULL);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void publish(volatile uint64_t *flag, struct payload *out, uint64_t round,
		    unsigned int writer)
{
	uint64_t sum = 0;
	size_t i;

	for (i = 0; i < WORDS; i++) {
		out->word[i] = word_of(round, writer, i);
		sum += out->word[i];
	}
	/* A reader on this node that sees the header sees the words (a store-store order,
	 * inner shareable: the other node is ordered by the dmb osh below). */
	DMB_ISHST();
	out->words = WORDS;
	out->sum = sum;
	out->round = round;
	civac(out, sizeof(*out));
	DMB_OSH(); /* the cleaned payload before the flag */
	*flag = round;
	civac(flag, sizeof(*flag));
	DMB_OSH();
}

/* Wait for the flag to reach `round`; 0, or -1 after WAIT_S or on a signal. */
static int wait_flag(volatile uint64_t *flag, uint64_t round)
{
	double deadline = now_s() + WAIT_S;

	for (;;) {
		civac(flag, sizeof(*flag));
		DMB_OSH();
		if (*flag >= round)
			break;
		if (now_s() > deadline || stop)
			return -1;
		usleep(20);
	}
	DMB_OSH(); /* the flag's read before the payload's */
	return 0;
}

/* The words of a received payload that are not what `writer` wrote in `round`. */
static size_t receive(struct payload *in, uint64_t round, unsigned int writer)
{
	uint64_t sum = 0;
	size_t i, bad = 0;

	civac(in, sizeof(*in)); /* no stale line of an earlier round stays */
	DMB_OSH();
	if (in->round != round || in->words != WORDS) {
		fprintf(stderr, PROG ": round %llu: header says round %llu, %llu words\n",
			(unsigned long long)round, (unsigned long long)in->round,
			(unsigned long long)in->words);
		return WORDS;
	}
	for (i = 0; i < WORDS; i++) {
		sum += in->word[i];
		bad += in->word[i] != word_of(round, writer, i);
	}
	if (sum != in->sum && !bad)
		bad = 1;
	return bad;
}

/* The node's identity: as `obmm-testbed run` gives it, else from this node's UB controller
 * (ctl, as libobmm reads it) or the testbed's fabric files, as examples/c/client.c does. */
static unsigned long long identity(const char *env, const char *ctl, const char *fabric)
{
	const char *v = getenv(env);
	unsigned long long out = 0;

	if (v)
		return strtoull(v, NULL, 0);
	if (!ctl || read_controller(ctl, &out))
		read_fabric(fabric, &out);
	return out;
}

static void *map(unsigned long long mem_id, size_t len)
{
	char path[64];
	void *p;
	int fd;

	snprintf(path, sizeof(path), "/dev/obmm_shmdev%llu", mem_id);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		perror(path);
		return NULL;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		perror("mmap");
		return NULL;
	}
	return p;
}

/* Serve the handle to one GET (obmm.exchange version 1), waiting up to WAIT_S. */
static int serve_once(int srv, const uint8_t wire[OBMM_HANDLE_SIZE])
{
	struct pollfd pfd = { .fd = srv, .events = POLLIN };
	uint8_t lenbuf[4], req[4 + OBMM_EXCHANGE_HEAD + 256], head[4 + OBMM_EXCHANGE_HEAD];
	uint32_t len;
	int c, rc = -1;

	if (poll(&pfd, 1, WAIT_S * 1000) != 1)
		return -1;
	c = accept(srv, NULL, NULL);
	if (c < 0)
		return -1;
	if (obmm_io_all(c, lenbuf, 4, 0) == 0) {
		len = (uint32_t)obmm_get_le(lenbuf, 4);
		if (len <= sizeof(req) && obmm_io_all(c, req, len, 0) == 0 &&
		    obmm_exchange_head_ok(req, len) && req[5] == OBMM_EXCHANGE_OP_GET &&
		    len - OBMM_EXCHANGE_HEAD == strlen(NAME) &&
		    !memcmp(req + OBMM_EXCHANGE_HEAD, NAME, strlen(NAME))) {
			obmm_exchange_head(head, OBMM_HANDLE_SIZE, OBMM_EXCHANGE_ST_OK);
			rc = obmm_send_all(c, head, sizeof(head)) ||
			     obmm_send_all(c, wire, OBMM_HANDLE_SIZE);
		}
	}
	close(c);
	return rc;
}

static int exporter(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct obmm_cmd_export exp = { 0 };
	struct obmm_cmd_unexport unexp = { 0 };
	struct obmm_handle h = { 0 };
	const char *addr = getenv("OBMM_NODE_ADDR");
	uint32_t eid = (uint32_t)identity("OBMM_NODE_EID", "eid", "eid");
	uint8_t wire[OBMM_HANDLE_SIZE];
	int dev, srv = -1, one = 1, rc = 1;
	size_t bad = 0;
	char *base = NULL;
	uint64_t r;

	dev = open("/dev/obmm", O_RDWR | O_CLOEXEC);
	if (dev < 0 || !addr || inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
		perror(PROG ": /dev/obmm or OBMM_NODE_ADDR");
		return 1;
	}
	exp.size[0] = SIZE;
	exp.length = 1;
	exp.flags = OBMM_EXPORT_FLAG_ALLOW_MMAP;
	if (ioctl(dev, OBMM_CMD_EXPORT, &exp)) {
		perror(PROG ": OBMM_CMD_EXPORT");
		return 1;
	}
	base = map(exp.mem_id, SIZE);
	if (!base)
		goto out;
	memset(base, 0, SIZE); /* no flag or payload of an earlier user */
	civac(base, SIZE);
	DMB_OSH();

	h.mem_id = exp.mem_id;
	h.length = SIZE;
	h.uba = exp.uba;
	h.tokenid = exp.tokenid;
	h.scna = (uint32_t)identity("OBMM_NODE_CNA", "primary_cna", "cna");
	h.pxm_numa = -1;
	memcpy(h.seid, &eid, sizeof(eid));
	h.node_id = (uint16_t)identity("OBMM_NODE_ID", NULL, "node_id");
	obmm_handle_encode(&h, wire);
	srv = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (srv < 0 || setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(srv, (struct sockaddr *)&sa, sizeof(sa)) || listen(srv, 1)) {
		perror(PROG ": listen");
		goto out;
	}
	printf(PROG ": exported mem_id %llu (%lu bytes), serving handle '%s' on %s:%d\n",
	       (unsigned long long)exp.mem_id, SIZE, NAME, addr, port);
	fflush(stdout);
	if (serve_once(srv, wire)) {
		fprintf(stderr, PROG ": no importer fetched the handle\n");
		goto out;
	}
	for (r = 1; r <= ROUNDS; r++) {
		if (wait_flag((uint64_t *)(base + FLAG_TO_EXPORTER), r)) {
			fprintf(stderr, PROG ": round %llu never came\n", (unsigned long long)r);
			goto out;
		}
		bad += receive((struct payload *)(base + AREA_TO_EXPORTER), r, 1);
		publish((uint64_t *)(base + FLAG_TO_IMPORTER),
			(struct payload *)(base + AREA_TO_IMPORTER), r, 0);
	}
	if (wait_flag((uint64_t *)(base + FLAG_TO_EXPORTER), DONE)) {
		fprintf(stderr, PROG ": the importer never said done\n");
		goto out;
	}
	printf(PROG ": answered %d rounds, %zu wrong words received\n", ROUNDS, bad);
	rc = bad ? 1 : 0;
	/* Our verdict, then the acknowledgment the importer leaves on. */
	((struct payload *)(base + AREA_TO_IMPORTER))->sum = bad;
	civac(base + AREA_TO_IMPORTER, sizeof(uint64_t) * 3);
	DMB_OSH();
	*(volatile uint64_t *)(base + FLAG_TO_IMPORTER) = DONE;
	civac(base + FLAG_TO_IMPORTER, sizeof(uint64_t));
	DMB_OSH();
	/* Unexporting revokes the importer's mapping (its next access faults): keep the region
	 * until we are stopped, which `run` does once the importer has unimported and ended. */
	while (!stop)
		pause();
out:
	if (srv >= 0)
		close(srv);
	if (base)
		munmap(base, SIZE);
	unexp.mem_id = exp.mem_id;
	if (ioctl(dev, OBMM_CMD_UNEXPORT, &unexp)) {
		perror(PROG ": OBMM_CMD_UNEXPORT");
		rc = 1;
	}
	printf(PROG ": unexported\n");
	return rc;
}

static int importer(const char *host, const char *port)
{
	struct obmm_cmd_import imp = { 0 };
	struct obmm_cmd_unimport unimp = { 0 };
	uint32_t eid = (uint32_t)identity("OBMM_NODE_EID", "eid", "eid");
	unsigned long long addr;
	struct obmm_handle h;
	struct utsname u;
	size_t bad = 0;
	char *base = NULL;
	double t0;
	int dev, rc = 1;
	uint64_t r;

	if (fetch_handle(host, port, NAME, &h) || resolve_emulator(&h, &addr))
		return 1;
	dev = open("/dev/obmm", O_RDWR | O_CLOEXEC);
	if (dev < 0) {
		perror(PROG ": /dev/obmm");
		return 1;
	}
	imp.flags = OBMM_IMPORT_FLAG_ALLOW_MMAP;
	imp.addr = addr;
	imp.length = h.length;
	imp.tokenid = h.tokenid;
	imp.scna = (uint32_t)identity("OBMM_NODE_CNA", "primary_cna", "cna");
	imp.dcna = h.scna;
	imp.numa_id = -1;
	memcpy(imp.seid, &eid, sizeof(eid));
	memcpy(imp.deid, h.seid, sizeof(imp.deid));
	if (ioctl(dev, OBMM_CMD_IMPORT, &imp)) {
		perror(PROG ": OBMM_CMD_IMPORT");
		return 1;
	}
	uname(&u);
	printf(PROG ": %s, %zu-byte lines; node %u's mem_id %llu imported at %#llx as mem_id %llu\n",
	       u.machine, line, h.node_id, (unsigned long long)h.mem_id, addr,
	       (unsigned long long)imp.mem_id);
	base = map(imp.mem_id, h.length);
	if (!base)
		goto out;
	t0 = now_s();
	for (r = 1; r <= ROUNDS; r++) {
		publish((uint64_t *)(base + FLAG_TO_EXPORTER),
			(struct payload *)(base + AREA_TO_EXPORTER), r, 1);
		if (wait_flag((uint64_t *)(base + FLAG_TO_IMPORTER), r)) {
			fprintf(stderr, PROG ": no answer to round %llu\n", (unsigned long long)r);
			goto out;
		}
		bad += receive((struct payload *)(base + AREA_TO_IMPORTER), r, 0);
	}
	*(volatile uint64_t *)(base + FLAG_TO_EXPORTER) = DONE;
	civac(base + FLAG_TO_EXPORTER, sizeof(uint64_t));
	DMB_OSH();
	if (wait_flag((uint64_t *)(base + FLAG_TO_IMPORTER), DONE)) {
		fprintf(stderr, PROG ": the exporter never acknowledged done\n");
		bad++;
	} else {
		civac(base + AREA_TO_IMPORTER, sizeof(uint64_t) * 3);
		DMB_OSH();
		bad += ((struct payload *)(base + AREA_TO_IMPORTER))->sum; /* the exporter's */
	}
	printf(PROG ": %d rounds of %zu bytes each way (dmb osh, dmb ishst, dc civac), "
	       "%zu wrong words, %.0f us a round trip\n",
	       ROUNDS, sizeof(struct payload), bad, (now_s() - t0) / ROUNDS * 1e6);
	rc = bad ? 1 : 0;
out:
	if (base)
		munmap(base, h.length);
	unimp.mem_id = imp.mem_id;
	if (ioctl(dev, OBMM_CMD_UNIMPORT, &unimp)) {
		perror(PROG ": OBMM_CMD_UNIMPORT");
		rc = 1;
	}
	return rc;
}

int main(int argc, char **argv)
{
	struct sigaction act = { .sa_handler = on_signal }; /* no SA_RESTART: waits end */
	const char *addrs = getenv("OBMM_NODE_ADDRS");
	char host[64] = "", port[16];

	line = dcache_line();
	setvbuf(stdout, NULL, _IOLBF, 0);
	sigaction(SIGTERM, &act, NULL);
	sigaction(SIGINT, &act, NULL);
	if (argc >= 2 && !strcmp(argv[1], "export") && argc <= 3)
		return exporter(argc == 3 ? atoi(argv[2]) : OBMM_EXCHANGE_DEFAULT_PORT);
	if (argc >= 2 && !strcmp(argv[1], "import") && argc <= 4) {
		if (argc >= 3)
			snprintf(host, sizeof(host), "%s", argv[2]);
		else if (!addrs || sscanf(addrs, "%63s", host) != 1)
			fprintf(stderr, PROG ": no HOST and no OBMM_NODE_ADDRS\n");
		snprintf(port, sizeof(port), "%s", argc == 4 ? argv[3] : STRINGIFY(OBMM_EXCHANGE_DEFAULT_PORT));
		return host[0] ? importer(host, port) : 1;
	}
	fprintf(stderr, "usage: handoff export [PORT] | handoff import [HOST [PORT]]\n");
	return 2;
}
