// SPDX-License-Identifier: GPL-2.0
/*
 * Errno check of every OBMM ioctl and shmdev rule, one line per case.
 * Runs on one node against obmm_emu (loopback imports go through the
 * node's own window).  Exit status = number of failed cases.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ub/obmm.h>

#include "obmm_test_util.h"

#ifndef MAP_HUGETLB
#define MAP_HUGETLB 0x40000
#endif
#define SZ_4K 4096UL
#define SZ_128M (128UL << 20)
#define BAD_PTR ((void *)16)

static int obmm_fd;
static int failures, cases;
static unsigned int cna;
static unsigned long long win_base, win_size;
/* The decoder address of this node's PA 0 (win_base past its RAM base). */
static unsigned long long pa_base;

static void check(const char *name, int ret, int want)
{
	int got = ret ? errno : 0;

	cases++;
	if (got == want) {
		printf("ok   %-58s %s\n", name, want ? strerror(want) : "0");
		return;
	}
	failures++;
	printf("FAIL %-58s want %s got %s\n", name,
	       want ? strerror(want) : "0", got ? strerror(got) : "0");
}

static int do_export(struct obmm_cmd_export *c)
{
	return ioctl(obmm_fd, OBMM_CMD_EXPORT, c);
}

static void export_init(struct obmm_cmd_export *c, unsigned long size)
{
	memset(c, 0, sizeof(*c));
	c->size[0] = size;
	c->length = 1;
	c->flags = OBMM_EXPORT_FLAG_ALLOW_MMAP;
}

static unsigned long long export_ok(unsigned long size, unsigned long flags)
{
	struct obmm_cmd_export c;

	export_init(&c, size);
	c.flags = flags;
	if (do_export(&c)) {
		perror("export");
		return 0;
	}
	return c.mem_id;
}

static int unexport(unsigned long long id)
{
	struct obmm_cmd_unexport c = { .mem_id = id };

	return ioctl(obmm_fd, OBMM_CMD_UNEXPORT, &c);
}

static int unimport(unsigned long long id)
{
	struct obmm_cmd_unimport c = { .mem_id = id };

	return ioctl(obmm_fd, OBMM_CMD_UNIMPORT, &c);
}

static unsigned long long pa_of(unsigned long long id)
{
	struct obmm_cmd_addr_query q = { .key_type = OBMM_QUERY_BY_ID_OFFSET,
					 .mem_id = id };

	if (ioctl(obmm_fd, OBMM_CMD_ADDR_QUERY, &q))
		return 0;
	return q.pa;
}

/* tokenid of export id (sysfs), for the emulated UMMU check at IMPORT */
static unsigned int token_of(unsigned long long id)
{
	char path[128];

	snprintf(path, sizeof(path),
		 "/sys/devices/obmm/obmm_shmdev%llu/export_info/tokenid", id);
	return (unsigned int)obmm_read_sysfs_ull(path);
}

static void import_init(struct obmm_cmd_import *c, unsigned long long addr,
			unsigned long len, unsigned int tokenid)
{
	memset(c, 0, sizeof(*c));
	c->flags = OBMM_IMPORT_FLAG_ALLOW_MMAP;
	c->addr = addr;
	c->length = len;
	c->scna = cna;
	c->numa_id = -1;
	c->tokenid = tokenid;
}

static int do_import(struct obmm_cmd_import *c)
{
	return ioctl(obmm_fd, OBMM_CMD_IMPORT, c);
}

static int shm_open_id(unsigned long long id, int flags)
{
	char path[64];

	snprintf(path, sizeof(path), "/dev/obmm_shmdev%llu", id);
	return open(path, flags);
}

static void test_export(void)
{
	struct obmm_cmd_export c;
	unsigned long long id, id2;
	char priv[OBMM_MAX_PRIV_LEN + 1] = { 0 };

	export_init(&c, OBMM_SZ_2M);
	c.length = OBMM_MAX_LOCAL_NUMA_NODES + 1;
	check("EXPORT length 17", do_export(&c), E2BIG);
	export_init(&c, OBMM_SZ_2M);
	c.pxm_numa = -1;
	check("EXPORT pxm_numa -1", do_export(&c), EINVAL);
	c.pxm_numa = OBMM_MAX_LOCAL_NUMA_NODES + 1;
	check("EXPORT pxm_numa 17", do_export(&c), EINVAL);
	export_init(&c, SZ_4K);
	check("EXPORT size not memseg multiple", do_export(&c), EINVAL);
	export_init(&c, OBMM_SZ_2M);
	c.length = 2;
	c.size[1] = OBMM_SZ_2M;
	check("EXPORT size on offline node 1", do_export(&c), ENODEV);
	export_init(&c, 0);
	check("EXPORT total 0", do_export(&c), EINVAL);
	export_init(&c, OBMM_SZ_2M);
	c.pxm_numa = OBMM_MAX_LOCAL_NUMA_NODES;
	check("EXPORT pxm_numa 16 (no such node)", do_export(&c), EINVAL);
	export_init(&c, OBMM_SZ_2M);
	c.flags = 0x4;
	check("EXPORT flags 0x4", do_export(&c), EINVAL);
	export_init(&c, OBMM_SZ_2M);
	c.priv_len = OBMM_MAX_PRIV_LEN + 1;
	c.priv = priv;
	check("EXPORT priv_len 513", do_export(&c), EINVAL);
	c.priv_len = 8;
	c.priv = BAD_PTR;
	check("EXPORT priv fault", do_export(&c), EFAULT);
	export_init(&c, OBMM_SZ_2M);
	c.vendor_len = OBMM_MAX_VENDOR_LEN + 1;
	c.vendor_info = priv;
	check("EXPORT vendor_len 129", do_export(&c), EINVAL);
	c.vendor_len = 8;
	c.vendor_info = BAD_PTR;
	check("EXPORT vendor_info fault", do_export(&c), EFAULT);
	export_init(&c, 1UL << 40);
	check("EXPORT larger than pool", do_export(&c), ENOMEM);
	check("EXPORT bad struct pointer",
	      ioctl(obmm_fd, OBMM_CMD_EXPORT, BAD_PTR), EFAULT);

	export_init(&c, OBMM_SZ_2M);
	c.length = OBMM_MAX_LOCAL_NUMA_NODES;
	c.priv = "hello";
	c.priv_len = 5;
	check("EXPORT 2M ok", do_export(&c), 0);
	id = c.mem_id;
	if (!c.tokenid || !c.uba)
		check("EXPORT tokenid/uba non-zero", -1, 0);
	id2 = export_ok(OBMM_SZ_2M, OBMM_EXPORT_FLAG_ALLOW_MMAP |
			OBMM_EXPORT_FLAG_FAST);
	check("EXPORT FAST ok, next id", id2 == id + 1 ? 0 : (errno = EIO, -1),
	      0);
	check("UNEXPORT first", unexport(id), 0);
	id = export_ok(OBMM_SZ_2M, 0);
	check("EXPORT reuses lowest free id", id == id2 - 1 ? 0 :
	      (errno = EIO, -1), 0);
	unexport(id);
	unexport(id2);
}

/*
 * obmm_emu keeps unexported memory out of the pool for quarantine_ms
 * (revocation of importers); wait until it is all back (the real driver
 * has no quarantine).
 */
static void wait_quarantine(void)
{
	int i;

	if (access(OBMM_EMU_SYSFS "/quarantined", F_OK))
		return;
	for (i = 0; i < 200; i++) {
		if (!obmm_read_sysfs_ull(OBMM_EMU_SYSFS "/quarantined"))
			return;
		usleep(50000);
	}
}

static void test_zeroed(void)
{
	unsigned long long id, id2, pa;
	int fd, bad = 0;
	unsigned char *p;
	size_t i;

	wait_quarantine();
	id = export_ok(OBMM_SZ_2M, OBMM_EXPORT_FLAG_ALLOW_MMAP);
	pa = pa_of(id);
	fd = shm_open_id(id, O_RDWR);

	p = mmap(NULL, OBMM_SZ_2M, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	memset(p, 0xa5, OBMM_SZ_2M);
	munmap(p, OBMM_SZ_2M);
	close(fd);
	unexport(id);
	wait_quarantine();
	id2 = export_ok(OBMM_SZ_2M, OBMM_EXPORT_FLAG_ALLOW_MMAP);
	fd = shm_open_id(id2, O_RDWR);
	p = mmap(NULL, OBMM_SZ_2M, PROT_READ, MAP_SHARED, fd, 0);
	for (i = 0; i < OBMM_SZ_2M; i++)
		bad |= p[i];
	munmap(p, OBMM_SZ_2M);
	close(fd);
	check("EXPORT re-uses PA and memory is zeroed",
	      pa_of(id2) == pa && !bad ? 0 : (errno = EIO, -1), 0);
	unexport(id2);
}

static void test_export_pid(void)
{
	struct obmm_cmd_export_pid c;
	char priv[OBMM_MAX_PRIV_LEN + 1] = { 0 };
	void *anon, *huge;
	int fd;

	anon = mmap(NULL, 2 * OBMM_SZ_2M, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	anon = (void *)(((uintptr_t)anon + OBMM_SZ_2M - 1) &
			~(OBMM_SZ_2M - 1));
	memset(anon, 1, OBMM_SZ_2M);

#define PID_INIT() do { memset(&c, 0, sizeof(c)); c.va = anon; \
		c.length = OBMM_SZ_2M; } while (0)
	PID_INIT();
	c.flags = OBMM_EXPORT_FLAG_ALLOW_MMAP;
	check("EXPORT_PID flags ALLOW_MMAP",
	      ioctl(obmm_fd, OBMM_CMD_EXPORT_PID, &c), EINVAL);
	c.flags = OBMM_EXPORT_FLAG_FAST;
	check("EXPORT_PID flags FAST",
	      ioctl(obmm_fd, OBMM_CMD_EXPORT_PID, &c), EINVAL);
	c.flags = 0x8;
	check("EXPORT_PID flags 0x8",
	      ioctl(obmm_fd, OBMM_CMD_EXPORT_PID, &c), EINVAL);
	PID_INIT();
	c.length = 0;
	check("EXPORT_PID length 0",
	      ioctl(obmm_fd, OBMM_CMD_EXPORT_PID, &c), EINVAL);
	c.length = SZ_4K;
	check("EXPORT_PID length not PMD multiple",
	      ioctl(obmm_fd, OBMM_CMD_EXPORT_PID, &c), EINVAL);
	PID_INIT();
	c.priv_len = OBMM_MAX_PRIV_LEN + 1;
	c.priv = priv;
	check("EXPORT_PID priv_len 513",
	      ioctl(obmm_fd, OBMM_CMD_EXPORT_PID, &c), EINVAL);
	PID_INIT();
	c.vendor_len = OBMM_MAX_VENDOR_LEN + 1;
	c.vendor_info = priv;
	check("EXPORT_PID vendor_len 129",
	      ioctl(obmm_fd, OBMM_CMD_EXPORT_PID, &c), EINVAL);
	PID_INIT();
	c.pid = 0x3ffffff0;
	check("EXPORT_PID unknown pid",
	      ioctl(obmm_fd, OBMM_CMD_EXPORT_PID, &c), ESRCH);
	PID_INIT();
	check("EXPORT_PID anonymous (not hugetlbfs)",
	      ioctl(obmm_fd, OBMM_CMD_EXPORT_PID, &c), EOPNOTSUPP);

	huge = mmap(NULL, OBMM_SZ_2M, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	if (huge == MAP_FAILED) {
		printf("skip EXPORT_PID hugetlb cases: %s\n", strerror(errno));
		return;
	}
	memset(huge, 2, OBMM_SZ_2M);
	PID_INIT();
	c.va = huge;
	c.pid = getpid();
	check("EXPORT_PID hugetlbfs ok",
	      ioctl(obmm_fd, OBMM_CMD_EXPORT_PID, &c), 0);
	fd = shm_open_id(c.mem_id, O_RDWR);
	check("EXPORT_PID shmdev open cacheable", fd < 0 ? -1 : 0, EPERM);
	fd = shm_open_id(c.mem_id, O_RDWR | O_SYNC);
	check("EXPORT_PID shmdev open O_SYNC", fd < 0 ? -1 : 0, EPERM);
	check("EXPORT_PID unexport", unexport(c.mem_id), 0);
	munmap(huge, OBMM_SZ_2M);
}

static void test_unexport_unimport(void)
{
	struct obmm_cmd_unexport ue = { 0 };
	struct obmm_cmd_import ic;
	unsigned long long id = export_ok(OBMM_SZ_2M,
					  OBMM_EXPORT_FLAG_ALLOW_MMAP);
	void *p;
	int fd;

	check("UNEXPORT mem_id 0", unexport(0), ENOENT);
	check("UNEXPORT mem_id 2^20", unexport(1ULL << 20), ENOENT);
	ue.mem_id = id;
	ue.flags = 1;
	check("UNEXPORT flags 1", ioctl(obmm_fd, OBMM_CMD_UNEXPORT, &ue),
	      EINVAL);
	check("UNEXPORT unknown id", unexport(id + 100), ENOENT);
	fd = shm_open_id(id, O_RDWR);
	check("UNEXPORT with open shmdev", unexport(id), EBUSY);
	p = mmap(NULL, OBMM_SZ_2M, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	check("UNEXPORT with live mmap", unexport(id), EBUSY);
	munmap(p, OBMM_SZ_2M);
	check("UNIMPORT of an export", unimport(id), EINVAL);

	import_init(&ic, pa_base + pa_of(id), OBMM_SZ_2M, 0);
	check("IMPORT tokenid 0 (not checked, as by the real driver)",
	      do_import(&ic), 0);
	check("UNIMPORT of it", unimport(ic.mem_id), 0);
	import_init(&ic, pa_base + pa_of(id), OBMM_SZ_2M, token_of(id));
	check("IMPORT loopback ok", do_import(&ic), 0);
	check("UNEXPORT of an import", unexport(ic.mem_id), EINVAL);
	check("UNIMPORT mem_id 0", unimport(0), ENOENT);
	{
		struct obmm_cmd_unimport ui = { .mem_id = ic.mem_id,
						.flags = 1 };
		check("UNIMPORT flags 1",
		      ioctl(obmm_fd, OBMM_CMD_UNIMPORT, &ui), EINVAL);
	}
	fd = shm_open_id(ic.mem_id, O_RDWR | O_SYNC);
	check("UNIMPORT with open shmdev", unimport(ic.mem_id), EBUSY);
	close(fd);
	check("UNIMPORT ok", unimport(ic.mem_id), 0);
	check("UNIMPORT again", unimport(ic.mem_id), ENOENT);
	check("UNEXPORT ok", unexport(id), 0);
	check("UNEXPORT again", unexport(id), ENOENT);
}

static void test_import(void)
{
	struct obmm_cmd_import c, c2;
	char priv[OBMM_MAX_PRIV_LEN + 1] = { 0 };
	void *p;
	int fd;
	unsigned long long id = export_ok(4 * OBMM_SZ_2M,
					  OBMM_EXPORT_FLAG_ALLOW_MMAP);
	unsigned long long addr = pa_base + pa_of(id);
	unsigned int tok = token_of(id);

	import_init(&c, addr, OBMM_SZ_2M, tok);
	c.flags = 0x8;
	check("IMPORT flags 0x8", do_import(&c), EINVAL);
	c.flags = 0;
	check("IMPORT flags 0", do_import(&c), EINVAL);
	c.flags = OBMM_IMPORT_FLAG_ALLOW_MMAP | OBMM_IMPORT_FLAG_NUMA_REMOTE;
	check("IMPORT ALLOW_MMAP|NUMA_REMOTE", do_import(&c), EINVAL);
	c.flags = OBMM_IMPORT_FLAG_ALLOW_MMAP | OBMM_IMPORT_FLAG_PREIMPORT;
	check("IMPORT PREIMPORT without NUMA_REMOTE", do_import(&c), EINVAL);
	import_init(&c, addr, OBMM_SZ_2M, tok);
	c.priv_len = OBMM_MAX_PRIV_LEN + 1;
	c.priv = priv;
	check("IMPORT priv_len 513", do_import(&c), EINVAL);
	import_init(&c, addr, 0, tok);
	check("IMPORT length 0", do_import(&c), EINVAL);
	import_init(&c, addr + SZ_4K, OBMM_SZ_2M, tok);
	check("IMPORT addr unaligned", do_import(&c), EINVAL);
	import_init(&c, addr, OBMM_SZ_2M + SZ_4K, tok);
	check("IMPORT length unaligned", do_import(&c), EINVAL);
	import_init(&c, 0, OBMM_SZ_2M, tok);
	check("IMPORT addr 0", do_import(&c), EINVAL);
	import_init(&c, -OBMM_SZ_2M, 2 * OBMM_SZ_2M, tok);
	check("IMPORT addr+length overflow", do_import(&c), EINVAL);
	import_init(&c, addr, OBMM_SZ_2M, tok);
	c.flags = OBMM_IMPORT_FLAG_NUMA_REMOTE;
	c.base_dist = 5;
	check("IMPORT NUMA_REMOTE base_dist 5", do_import(&c), EINVAL);
	import_init(&c, addr, OBMM_SZ_2M, tok);
	c.scna = cna + 1;
	check("IMPORT unknown scna", do_import(&c), ENODEV);
	import_init(&c, OBMM_SZ_2M, OBMM_SZ_2M, tok);
	check("IMPORT non-UB memory (guest RAM)", do_import(&c), EINVAL);
	import_init(&c, addr, OBMM_SZ_2M, tok);
	c.flags = OBMM_IMPORT_FLAG_NUMA_REMOTE;
	check("IMPORT NUMA_REMOTE of less than a memory block", do_import(&c),
	      EPERM);
	c.flags = OBMM_IMPORT_FLAG_NUMA_REMOTE | OBMM_IMPORT_FLAG_PREIMPORT;
	check("IMPORT PREIMPORT without declaration", do_import(&c), EFAULT);
	import_init(&c, win_base + SZ_128M, OBMM_SZ_2M, tok);
	check("IMPORT range not exported (made, as by the real driver)",
	      do_import(&c), 0);
	fd = shm_open_id(c.mem_id, O_RDWR);
	p = mmap(NULL, OBMM_SZ_2M, PROT_READ, MAP_SHARED, fd, 0);
	check("mmap of it (emulated UMMU: no access)",
	      p == MAP_FAILED ? -1 : 0, ENXIO);
	if (p != MAP_FAILED)
		munmap(p, OBMM_SZ_2M);
	close(fd);
	check("UNIMPORT of it", unimport(c.mem_id), 0);

	import_init(&c, addr, 2 * OBMM_SZ_2M, tok);
	check("IMPORT 4M ok", do_import(&c), 0);
	check("IMPORT numa_id out = -1", c.numa_id == -1 ? 0 :
	      (errno = EIO, -1), 0);
	import_init(&c2, addr + OBMM_SZ_2M, 2 * OBMM_SZ_2M, tok);
	check("IMPORT overlapping", do_import(&c2), EEXIST);
	import_init(&c2, addr + 2 * OBMM_SZ_2M, 2 * OBMM_SZ_2M, tok);
	check("IMPORT adjacent ok", do_import(&c2), 0);
	unimport(c2.mem_id);
	unimport(c.mem_id);
	unexport(id);
}

static int query(int key, unsigned long long id, unsigned long long off,
		 unsigned long long pa, struct obmm_cmd_addr_query *q)
{
	memset(q, 0, sizeof(*q));
	q->key_type = key;
	q->mem_id = id;
	q->offset = off;
	q->pa = pa;
	return ioctl(obmm_fd, OBMM_CMD_ADDR_QUERY, q);
}

static void test_addr_query(void)
{
	unsigned long long id = export_ok(2 * OBMM_SZ_2M,
					  OBMM_EXPORT_FLAG_ALLOW_MMAP);
	struct obmm_cmd_addr_query q;
	struct obmm_cmd_import ic;
	unsigned long long pa;

	check("ADDR_QUERY BY_ID_OFFSET export", query(1, id, 0x1234, 0, &q), 0);
	pa = q.pa;
	check("ADDR_QUERY BY_PA export", query(0, 0, 0, pa, &q), 0);
	check("ADDR_QUERY BY_PA export round trip",
	      q.mem_id == id && q.offset == 0x1234 ? 0 : (errno = EIO, -1), 0);
	check("ADDR_QUERY offset >= size",
	      query(1, id, 2 * OBMM_SZ_2M, 0, &q), EINVAL);
	check("ADDR_QUERY mem_id 0", query(1, 0, 0, 0, &q), ENOENT);
	check("ADDR_QUERY unknown mem_id", query(1, id + 100, 0, 0, &q),
	      ENOENT);
	check("ADDR_QUERY BY_PA unknown", query(0, 0, 0, OBMM_SZ_2M, &q),
	      ENOENT);
	check("ADDR_QUERY key_type 2", query(2, id, 0, 0, &q), EINVAL);
	import_init(&ic, pa_base + pa - 0x1234, 2 * OBMM_SZ_2M, token_of(id));
	do_import(&ic);
	check("ADDR_QUERY BY_PA import",
	      query(0, 0, 0, ic.addr + 0x10, &q), 0);
	check("ADDR_QUERY BY_PA import result",
	      q.mem_id == ic.mem_id && q.offset == 0x10 ? 0 :
	      (errno = EIO, -1), 0);
	check("ADDR_QUERY BY_ID_OFFSET import",
	      query(1, ic.mem_id, 0x20, 0, &q), 0);
	check("ADDR_QUERY BY_ID_OFFSET import result",
	      q.pa == ic.addr + 0x20 ? 0 : (errno = EIO, -1), 0);
	unimport(ic.mem_id);
	unexport(id);
}

static int preimport(unsigned long cmd, unsigned long long pa,
		     unsigned long long len, unsigned long flags,
		     unsigned int scna, unsigned char dist)
{
	struct obmm_cmd_preimport c;

	memset(&c, 0, sizeof(c));
	c.pa = pa;
	c.length = len;
	c.flags = flags;
	c.scna = scna;
	c.base_dist = dist;
	c.numa_id = -1;
	return ioctl(obmm_fd, cmd, &c);
}

static void test_preimport(void)
{
	unsigned long long pa = win_base + SZ_128M;
	unsigned long long id = export_ok(OBMM_SZ_2M, OBMM_EXPORT_FLAG_ALLOW_MMAP);
	unsigned long long xpa = pa_base + pa_of(id);
	struct obmm_cmd_import ic;

	check("DECLARE pa unaligned",
	      preimport(OBMM_CMD_DECLARE_PREIMPORT, pa + OBMM_SZ_2M, SZ_128M,
			0, cna, 0), EINVAL);
	check("DECLARE length 0",
	      preimport(OBMM_CMD_DECLARE_PREIMPORT, pa, 0, 0, cna, 0),
	      EINVAL);
	check("DECLARE flags 1",
	      preimport(OBMM_CMD_DECLARE_PREIMPORT, pa, SZ_128M, 1, cna, 0),
	      EINVAL);
	check("DECLARE unknown scna",
	      preimport(OBMM_CMD_DECLARE_PREIMPORT, pa, SZ_128M, 0, cna + 1,
			0), ENODEV);
	check("DECLARE base_dist 5",
	      preimport(OBMM_CMD_DECLARE_PREIMPORT, pa, SZ_128M, 0, cna, 5),
	      EINVAL);
	check("DECLARE pa 0",
	      preimport(OBMM_CMD_DECLARE_PREIMPORT, 0, SZ_128M, 0, cna, 0),
	      EINVAL);
	check("DECLARE non-UB memory",
	      preimport(OBMM_CMD_DECLARE_PREIMPORT, SZ_128M, SZ_128M, 0, cna,
			0), EINVAL);
	/* the direct import needs a live export (emulated UMMU check) */
	import_init(&ic, xpa, OBMM_SZ_2M, token_of(id));
	do_import(&ic);
	check("DECLARE overlapping a direct import",
	      preimport(OBMM_CMD_DECLARE_PREIMPORT, xpa & ~(SZ_128M - 1),
			SZ_128M, 0, cna, 0), EEXIST);
	unimport(ic.mem_id);
	unexport(id);
	check("UNDECLARE flags 1",
	      preimport(OBMM_CMD_UNDECLARE_PREIMPORT, pa, SZ_128M, 1, cna, 0),
	      EINVAL);
	check("UNDECLARE not registered",
	      preimport(OBMM_CMD_UNDECLARE_PREIMPORT, pa, SZ_128M, 0, cna, 0),
	      EFAULT);
	check("DECLARE valid",
	      preimport(OBMM_CMD_DECLARE_PREIMPORT, pa, SZ_128M, 0, cna, 0), 0);
	check("DECLARE overlapping a declaration",
	      preimport(OBMM_CMD_DECLARE_PREIMPORT, pa, SZ_128M, 0, cna, 0),
	      EEXIST);
	check("UNDECLARE not the exact range",
	      preimport(OBMM_CMD_UNDECLARE_PREIMPORT, pa, 2 * SZ_128M, 0, cna,
			0), EINVAL);
	check("UNDECLARE valid",
	      preimport(OBMM_CMD_UNDECLARE_PREIMPORT, pa, SZ_128M, 0, cna, 0),
	      0);
}

static int map_errno(int fd, size_t len, int prot, int flags, off_t off,
		     void **out)
{
	void *p = mmap(NULL, len, prot, flags, fd, off);

	if (p == MAP_FAILED)
		return -1;
	if (out)
		*out = p;
	else
		munmap(p, len);
	return 0;
}

static int child_faults(void *p)
{
	pid_t pid = fork();
	int status;

	if (!pid) {
		__atomic_store_n((char *)p, 1, __ATOMIC_RELAXED);
		_exit(0);
	}
	waitpid(pid, &status, 0);
	return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

static void test_shmdev(void)
{
	unsigned long long id = export_ok(4 * OBMM_SZ_2M,
					  OBMM_EXPORT_FLAG_ALLOW_MMAP);
	unsigned long long noid = export_ok(OBMM_SZ_2M, 0);
	const int rw = PROT_READ | PROT_WRITE;
	struct obmm_cmd_update_range ur;
	int fd, nfd, rofd;
	void *p, *q;

	fd = shm_open_id(id, O_RDWR);
	nfd = shm_open_id(id, O_RDWR | O_SYNC);
	check("shmdev open cacheable", fd < 0 ? -1 : 0, 0);
	check("shmdev open O_SYNC", nfd < 0 ? -1 : 0, 0);
	check("mmap MAP_PRIVATE",
	      map_errno(fd, OBMM_SZ_2M, rw, MAP_PRIVATE, 0, NULL), EINVAL);
	rofd = shm_open_id(noid, O_RDWR);
	check("mmap without ALLOW_MMAP",
	      map_errno(rofd, OBMM_SZ_2M, rw, MAP_SHARED, 0, NULL), EPERM);
	close(rofd);
	check("mmap offset >= size",
	      map_errno(fd, OBMM_SZ_2M, rw, MAP_SHARED, 4 * OBMM_SZ_2M, NULL),
	      EINVAL);
	check("mmap length > size - offset",
	      map_errno(fd, 2 * OBMM_SZ_2M, rw, MAP_SHARED, 3 * OBMM_SZ_2M,
			NULL), EINVAL);
	check("mmap PMD flag, unaligned offset",
	      map_errno(fd, OBMM_SZ_2M, rw, MAP_SHARED,
			(off_t)(OBMM_MMAP_FLAG_HUGETLB_PMD | SZ_4K), NULL),
	      EINVAL);

	ur.start = 0;
	check("UPDATE_RANGE before any mmap",
	      ioctl(fd, OBMM_SHMDEV_UPDATE_RANGE, &ur), EINVAL);
	check("mmap PMD ok",
	      map_errno(fd, OBMM_SZ_2M, rw, MAP_SHARED,
			(off_t)OBMM_MMAP_FLAG_HUGETLB_PMD, &p), 0);
	check("mmap page after PMD (granule fixed)",
	      map_errno(fd, OBMM_SZ_2M, rw, MAP_SHARED, 0, NULL), EPERM);
	check("mmap O_SYNC while cacheable mapped",
	      map_errno(nfd, OBMM_SZ_2M, rw, MAP_SHARED,
			(off_t)OBMM_MMAP_FLAG_HUGETLB_PMD, NULL), EPERM);
	check("mprotect refused", mprotect(p, OBMM_SZ_2M, PROT_READ),
	      EOPNOTSUPP);
	q = mmap(NULL, OBMM_SZ_2M, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		 0);
	check("mremap move refused",
	      mremap(p, OBMM_SZ_2M, OBMM_SZ_2M, MREMAP_MAYMOVE | MREMAP_FIXED,
		     q) == MAP_FAILED ? -1 : 0, EOPNOTSUPP);
	munmap(q, OBMM_SZ_2M);

	memset(&ur, 0, sizeof(ur));
	ur.start = (uintptr_t)p;
	ur.end = (uintptr_t)p + OBMM_SZ_2M;
	ur.mem_state = OBMM_SHM_MEM_NORMAL | OBMM_SHM_MEM_READWRITE;
	ur.cache_ops = OBMM_SHM_CACHE_INFER;
	check("UPDATE_RANGE O_SYNC fd",
	      ioctl(nfd, OBMM_SHMDEV_UPDATE_RANGE, &ur), EINVAL);
	check("UPDATE_RANGE ok", ioctl(fd, OBMM_SHMDEV_UPDATE_RANGE, &ur), 0);
	ur.end = ur.start;
	check("UPDATE_RANGE start >= end",
	      ioctl(fd, OBMM_SHMDEV_UPDATE_RANGE, &ur), EINVAL);
	ur.end = ur.start + SZ_4K;
	check("UPDATE_RANGE unaligned (PMD granule)",
	      ioctl(fd, OBMM_SHMDEV_UPDATE_RANGE, &ur), EINVAL);
	ur.end = ur.start + OBMM_SZ_2M;
	ur.mem_state = 0x10 | OBMM_SHM_MEM_NORMAL;
	check("UPDATE_RANGE mem_state bit 4",
	      ioctl(fd, OBMM_SHMDEV_UPDATE_RANGE, &ur), EINVAL);
	ur.mem_state = OBMM_SHM_MEM_CACHE_RESV | OBMM_SHM_MEM_READONLY;
	check("UPDATE_RANGE cache RESV",
	      ioctl(fd, OBMM_SHMDEV_UPDATE_RANGE, &ur), EINVAL);
	ur.mem_state = OBMM_SHM_MEM_NORMAL_NC | OBMM_SHM_MEM_READWRITE;
	check("UPDATE_RANGE NC with access",
	      ioctl(fd, OBMM_SHMDEV_UPDATE_RANGE, &ur), EINVAL);
	ur.mem_state = OBMM_SHM_MEM_DEVICE | OBMM_SHM_MEM_READEXEC;
	check("UPDATE_RANGE READEXEC with DEVICE",
	      ioctl(fd, OBMM_SHMDEV_UPDATE_RANGE, &ur), EINVAL);
	ur.mem_state = OBMM_SHM_MEM_NORMAL | OBMM_SHM_MEM_READONLY;
	ur.cache_ops = 5;
	check("UPDATE_RANGE cache_ops 5",
	      ioctl(fd, OBMM_SHMDEV_UPDATE_RANGE, &ur), EINVAL);
	ur.cache_ops = OBMM_SHM_CACHE_NONE;
	ur.end = ur.start + 2 * OBMM_SZ_2M;
	check("UPDATE_RANGE past the mapping",
	      ioctl(fd, OBMM_SHMDEV_UPDATE_RANGE, &ur), EFAULT);
	rofd = shm_open_id(id, O_RDONLY);
	ur.end = ur.start + OBMM_SZ_2M;
	ur.mem_state = OBMM_SHM_MEM_NORMAL | OBMM_SHM_MEM_READWRITE;
	check("UPDATE_RANGE write on O_RDONLY fd",
	      ioctl(rofd, OBMM_SHMDEV_UPDATE_RANGE, &ur), EPERM);
	close(rofd);
	check("shmdev unknown ioctl", ioctl(fd, _IO('X', 1), 0), ENOTTY);
	check("access through a fork (VM_DONTCOPY)",
	      child_faults(p) == SIGSEGV ? 0 : (errno = EIO, -1), 0);
	munmap(p, OBMM_SZ_2M);
	check("mmap O_SYNC after cacheable unmapped",
	      map_errno(nfd, OBMM_SZ_2M, rw, MAP_SHARED,
			(off_t)OBMM_MMAP_FLAG_HUGETLB_PMD, NULL), 0);
	close(fd);
	close(nfd);
	unexport(noid);
	unexport(id);
}

int main(void)
{
	obmm_fd = open("/dev/obmm", O_RDWR);
	if (obmm_fd < 0) {
		perror("/dev/obmm");
		return 1;
	}
	cna = obmm_cna();
	win_base = obmm_window_base(obmm_node_id());
	pa_base = obmm_window_addr(obmm_node_id(), 0);
	win_size = obmm_window_size(obmm_node_id());

	check("/dev/obmm unknown ioctl", ioctl(obmm_fd, _IO('x', 8), 0),
	      ENOTTY);
	test_export();
	test_zeroed();
	test_export_pid();
	test_unexport_unimport();
	test_import();
	test_addr_query();
	test_preimport();
	test_shmdev();
	printf("%d cases, %d failed\n", cases, failures);
	return failures;
}
