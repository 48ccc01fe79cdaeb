// SPDX-License-Identifier: GPL-2.0
/*
 * Drives stock libobmm across two nodes (tests/cluster/test_libobmm_xnode.py).
 * Linked against a libobmm.so built from a libobmm source tree (an input,
 * not part of this project); only its public header is used.
 *
 *   libobmm_xnode export EID SEED          exporter: export, fill, query
 *   libobmm_xnode useraddr EID             exporter: export a process's memory
 *   libobmm_xnode unexport MEM_ID          exporter: unexport and its refusals
 *   libobmm_xnode import PA LEN TOKENID SEID SCNA DEID DCNA SEED
 *                                          importer: import, read, ownership,
 *                                          query, unimport
 *   libobmm_xnode preimport PA LEN SEID SCNA DEID DCNA
 *                                          importer: declare and undeclare
 *
 * EIDs are the controller's sysfs eid (a number), made into 16 bytes as
 * libobmm compares them.  Every call prints one JSON line: the step's
 * name, the return value and errno (0 on success), plus what it found.
 * The host compares the errno with the driver's (docs/obmm-driver.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <libobmm.h>

#define SZ_2M		(2UL << 20)
#define PAGE		4096UL
#define MARK_LEN	16
#define HEAD_LEN	16
#define BAD_EID_STEP	0x7777
#define NO_SUCH_ID	1000000

/* errno read after the call (argument evaluation order is unspecified). */
#define step(name, call) do {		\
	long ret_ = (call);			\
	report(name, ret_, errno);		\
} while (0)
#define step_id(name, call) do {	\
	mem_id id_ = (call);			\
	report_id(name, id_, errno);		\
} while (0)

static void report(const char *name, long ret, int err)
{
	printf("{\"step\": \"%s\", \"ret\": %ld, \"errno\": %d}\n", name, ret,
	       ret < 0 ? err : 0);
	fflush(stdout);
}

/* An id-returning call: OBMM_INVALID_MEMID is its failure. */
static void report_id(const char *name, mem_id id, int err)
{
	printf("{\"step\": \"%s\", \"ret\": %" PRIu64 ", \"errno\": %d}\n", name,
	       id, id == OBMM_INVALID_MEMID ? err : 0);
	fflush(stdout);
}

static void eid_bytes(uint8_t out[16], unsigned long eid)
{
	uint32_t word = (uint32_t)eid;

	memset(out, 0, 16);
	memcpy(out, &word, sizeof(word));
}

static uint8_t pattern_byte(uint64_t *state)
{
	*state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint8_t)(*state >> 56);
}

static void hex(char *out, const volatile uint8_t *p, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", p[i]);
}

static void *map_shmdev(mem_id id, int prot, int *fdp)
{
	char path[64];
	void *p;
	int fd;

	snprintf(path, sizeof(path), "/dev/obmm_shmdev%" PRIu64, id);
	fd = open(path, O_RDWR);
	if (fd < 0)
		return NULL;
	p = mmap(NULL, SZ_2M, prot, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		return NULL;
	}
	*fdp = fd;
	return p;
}

static sigjmp_buf probe_env;

static void probe_fault(int sig)
{
	siglongjmp(probe_env, sig);
}

/*
 * Touch @p here (the shmdev's VMA is VM_DONTCOPY: a forked child would not
 * have it): the signal the access raised, 0 if none.
 */
static int probe(volatile uint8_t *p, int write)
{
	struct sigaction sa = { .sa_handler = probe_fault }, old_segv, old_bus;
	int sig;

	sigaction(SIGSEGV, &sa, &old_segv);
	sigaction(SIGBUS, &sa, &old_bus);
	sig = sigsetjmp(probe_env, 1);
	if (!sig) {
		if (write)
			*p = *p;
		else
			(void)*p;
	}
	sigaction(SIGSEGV, &old_segv, NULL);
	sigaction(SIGBUS, &old_bus, NULL);
	return sig;
}

static void report_probe(const char *name, volatile uint8_t *p, int write)
{
	printf("{\"step\": \"%s\", \"signal\": %d}\n", name, probe(p, write));
	fflush(stdout);
}

static int cmd_export(unsigned long eid, uint64_t seed)
{
	size_t len[OBMM_MAX_LOCAL_NUMA_NODES] = { 0 };
	struct obmm_mem_desc desc = { 0 };
	unsigned long pa = 0, off = 0;
	char head[2 * HEAD_LEN + 1];
	uint64_t state = seed;
	mem_id id, found = 0;
	uint8_t *p;
	size_t i;
	int fd;

	step_id("export_null_length", obmm_export(NULL, 0, &desc));
	len[0] = SZ_2M;
	step_id("export_zero_deid", obmm_export(len, OBMM_EXPORT_FLAG_ALLOW_MMAP, &desc));
	eid_bytes(desc.deid, eid + BAD_EID_STEP);
	step_id("export_unknown_deid",
		obmm_export(len, OBMM_EXPORT_FLAG_ALLOW_MMAP, &desc));
	eid_bytes(desc.deid, eid);
	len[0] = PAGE;
	step_id("export_unaligned_size",
		obmm_export(len, OBMM_EXPORT_FLAG_ALLOW_MMAP, &desc));
	len[0] = 0;
	step_id("export_zero_size", obmm_export(len, OBMM_EXPORT_FLAG_ALLOW_MMAP, &desc));
	len[0] = SZ_2M;
	step_id("export_bad_flags", obmm_export(len, 0x4, &desc));

	id = obmm_export(len, OBMM_EXPORT_FLAG_ALLOW_MMAP, &desc);
	step_id("export", id);
	if (id == OBMM_INVALID_MEMID)
		return 1;
	p = map_shmdev(id, PROT_READ | PROT_WRITE, &fd);
	if (!p) {
		perror("map export");
		return 1;
	}
	for (i = 0; i < SZ_2M; i++)
		p[i] = pattern_byte(&state);
	hex(head, p, HEAD_LEN);
	munmap(p, SZ_2M);
	close(fd);

	step("query_pa_by_memid", obmm_query_pa_by_memid(id, PAGE, &pa));
	step("query_memid_by_pa", obmm_query_memid_by_pa(pa, &found, &off));
	step("query_pa_offset_past_end", obmm_query_pa_by_memid(id, SZ_2M, &pa));
	step("query_pa_unknown_id", obmm_query_pa_by_memid(NO_SUCH_ID, 0, &pa));
	step("query_memid_pa_zero", obmm_query_memid_by_pa(0, &found, &off));

	printf("{\"step\": \"result\", \"mem_id\": %" PRIu64 ", \"uba\": %" PRIu64
	       ", \"length\": %" PRIu64 ", \"tokenid\": %u, \"scna\": %u, \"dcna\": %u"
	       ", \"pa\": %lu, \"found\": %" PRIu64 ", \"offset\": %lu, \"head\": \"%s\"}\n",
	       id, desc.addr, desc.length, desc.tokenid, desc.scna, desc.dcna, pa,
	       found, off, head);
	return 0;
}

static int cmd_useraddr(unsigned long eid)
{
	struct obmm_mem_desc desc = { 0 };
	char path[64];
	uint8_t *huge, *anon;
	mem_id id;
	int fd;

	eid_bytes(desc.deid, eid);
	step_id("useraddr_null_desc", obmm_export_useraddr(0, NULL, SZ_2M, 0, NULL));
	anon = mmap(NULL, 2 * SZ_2M, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (anon == MAP_FAILED)
		return 1;
	anon = (uint8_t *)(((uintptr_t)anon + SZ_2M - 1) & ~(SZ_2M - 1));
	madvise(anon, SZ_2M, MADV_NOHUGEPAGE);
	memset(anon, 1, SZ_2M);
	step_id("useraddr_mmap_flag",
		obmm_export_useraddr(0, anon, SZ_2M, OBMM_EXPORT_FLAG_ALLOW_MMAP, &desc));
	step_id("useraddr_unaligned_length", obmm_export_useraddr(0, anon, PAGE, 0, &desc));
	step_id("useraddr_not_hugetlb", obmm_export_useraddr(0, anon, SZ_2M, 0, &desc));

	huge = mmap(NULL, SZ_2M, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	if (huge == MAP_FAILED) {
		perror("MAP_HUGETLB");
		return 1;
	}
	memset(huge, 2, SZ_2M);
	id = obmm_export_useraddr(0, huge, SZ_2M, 0, &desc);
	step_id("useraddr", id);
	if (id == OBMM_INVALID_MEMID)
		return 1;
	/* Process memory has no mapping capability: its shmdev refuses open. */
	snprintf(path, sizeof(path), "/dev/obmm_shmdev%" PRIu64, id);
	fd = open(path, O_RDWR);
	step("useraddr_open_shmdev", fd < 0 ? -1 : 0);
	if (fd >= 0)
		close(fd);
	step("useraddr_unexport", obmm_unexport(id, 0));
	return 0;
}

static int cmd_unexport(mem_id id)
{
	int fd;
	void *p;

	step("unexport_zero_id", obmm_unexport(OBMM_INVALID_MEMID, 0));
	step("unexport_flags", obmm_unexport(id, 1));
	step("unexport_unknown_id", obmm_unexport(NO_SUCH_ID, 0));
	p = map_shmdev(id, PROT_READ, &fd);
	if (!p)
		return 1;
	step("unexport_mapped", obmm_unexport(id, 0));
	munmap(p, SZ_2M);
	close(fd);
	step("unimport_of_export", obmm_unimport(id, 0));
	step("unexport", obmm_unexport(id, 0));
	step("unexport_again", obmm_unexport(id, 0));
	return 0;
}

static void fill_import(struct obmm_mem_desc *d, char **argv)
{
	d->addr = strtoull(argv[0], NULL, 0);
	d->length = strtoull(argv[1], NULL, 0);
	d->tokenid = strtoul(argv[2], NULL, 0);
	eid_bytes(d->seid, strtoul(argv[3], NULL, 0));
	d->scna = strtoul(argv[4], NULL, 0);
	eid_bytes(d->deid, strtoul(argv[5], NULL, 0));
	d->dcna = strtoul(argv[6], NULL, 0);
}

static int cmd_import(char **argv)
{
	struct obmm_mem_desc desc = { 0 }, bad;
	char head[2 * HEAD_LEN + 1];
	uint64_t state = strtoull(argv[7], NULL, 0);
	unsigned long pa = 0, off = 0;
	size_t i, mismatches = 0;
	mem_id id, found = 0;
	uint8_t *p, *end;
	int fd, numa = -1;

	fill_import(&desc, argv);
	step_id("import_null_desc", obmm_import(NULL, OBMM_IMPORT_FLAG_ALLOW_MMAP, 0, NULL));
	step_id("import_remote_base_dist",
		obmm_import(&desc, OBMM_IMPORT_FLAG_NUMA_REMOTE, 256, &numa));
	bad = desc;
	bad.scna = desc.scna + 1;
	step_id("import_scna_not_seid", obmm_import(&bad, OBMM_IMPORT_FLAG_ALLOW_MMAP, 0, NULL));
	bad = desc;
	eid_bytes(bad.seid, strtoul(argv[3], NULL, 0) + BAD_EID_STEP);
	step_id("import_unknown_seid", obmm_import(&bad, OBMM_IMPORT_FLAG_ALLOW_MMAP, 0, NULL));
	step_id("import_no_mode_flag", obmm_import(&desc, 0, 0, NULL));
	bad = desc;
	bad.length = PAGE;
	step_id("import_unaligned_length",
		obmm_import(&bad, OBMM_IMPORT_FLAG_ALLOW_MMAP, 0, NULL));
	step_id("import_preimport_undeclared",
		obmm_import(&desc, OBMM_IMPORT_FLAG_NUMA_REMOTE | OBMM_IMPORT_FLAG_PREIMPORT, 0,
			    &numa));

	id = obmm_import(&desc, OBMM_IMPORT_FLAG_ALLOW_MMAP, 0, NULL);
	step_id("import", id);
	if (id == OBMM_INVALID_MEMID)
		return 1;
	step_id("import_again", obmm_import(&desc, OBMM_IMPORT_FLAG_ALLOW_MMAP, 0, NULL));

	p = map_shmdev(id, PROT_NONE, &fd);
	if (!p) {
		perror("map import");
		return 1;
	}
	end = p + SZ_2M;
	report_probe("read_before_ownership", p, 0);
	step("set_ownership_read", obmm_set_ownership(fd, p, end, PROT_READ));
	for (i = 0; i < SZ_2M; i++)
		if (p[i] != pattern_byte(&state))
			mismatches++;
	hex(head, p, HEAD_LEN);
	printf("{\"step\": \"read\", \"mismatches\": %zu, \"head\": \"%s\"}\n", mismatches, head);
	report_probe("write_while_reader", p, 1);
	step("set_ownership_write", obmm_set_ownership(fd, p, end, PROT_READ | PROT_WRITE));
	memcpy(p, "written-by-node1", MARK_LEN);
	report_probe("write_while_writer", p + PAGE, 1);
	step("set_ownership_none", obmm_set_ownership(fd, p, end, PROT_NONE));
	report_probe("read_after_none", p, 0);
	step("set_ownership_exec", obmm_set_ownership(fd, p, end, PROT_EXEC));
	step("set_ownership_unaligned", obmm_set_ownership(fd, p + 1, end, PROT_READ));
	step("set_ownership_empty", obmm_set_ownership(fd, end, p, PROT_READ));
	step("set_ownership_past_mapping",
	     obmm_set_ownership(fd, p, end + SZ_2M, PROT_READ));

	step("query_memid_by_pa", obmm_query_memid_by_pa(desc.addr + PAGE, &found, &off));
	step("query_pa_by_memid", obmm_query_pa_by_memid(id, PAGE, &pa));

	step("unimport_mapped", obmm_unimport(id, 0));
	munmap(p, SZ_2M);
	close(fd);
	step("unimport_zero_id", obmm_unimport(OBMM_INVALID_MEMID, 0));
	step("unimport_flags", obmm_unimport(id, 1));
	step("unexport_of_import", obmm_unexport(id, 0));
	step("unimport", obmm_unimport(id, 0));
	step("unimport_again", obmm_unimport(id, 0));
	printf("{\"step\": \"result\", \"mem_id\": %" PRIu64 ", \"found\": %" PRIu64
	       ", \"offset\": %lu, \"pa\": %lu}\n", id, found, off, pa);
	return 0;
}

static int cmd_preimport(char **argv)
{
	struct obmm_preimport_info info = { 0 }, bad;

	info.pa = strtoull(argv[0], NULL, 0);
	info.length = strtoull(argv[1], NULL, 0);
	eid_bytes(info.seid, strtoul(argv[2], NULL, 0));
	info.scna = strtoul(argv[3], NULL, 0);
	eid_bytes(info.deid, strtoul(argv[4], NULL, 0));
	info.dcna = strtoul(argv[5], NULL, 0);
	info.numa_id = -1;

	step("preimport_null", obmm_preimport(NULL, 0));
	step("unpreimport_null", obmm_unpreimport(NULL, 0));
	bad = info;
	bad.base_dist = -1;
	step("preimport_base_dist", obmm_preimport(&bad, 0));
	bad = info;
	bad.scna = info.scna + 1;
	step("preimport_scna_not_seid", obmm_preimport(&bad, 0));
	bad = info;
	bad.length = info.length + SZ_2M;
	step("preimport_unaligned_length", obmm_preimport(&bad, 0));
	step("preimport_flags", obmm_preimport(&info, 1));
	step("unpreimport_undeclared", obmm_unpreimport(&info, 0));

	step("preimport", obmm_preimport(&info, 0));
	printf("{\"step\": \"preimport_numa\", \"numa_id\": %d}\n", info.numa_id);
	bad = info;
	bad.numa_id = -1;
	step("preimport_again", obmm_preimport(&bad, 0));
	bad = info;
	bad.length = info.length * 2;
	step("unpreimport_wrong_length", obmm_unpreimport(&bad, 0));
	step("unpreimport_flags", obmm_unpreimport(&info, 1));
	step("unpreimport", obmm_unpreimport(&info, 0));
	step("unpreimport_again", obmm_unpreimport(&info, 0));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "export"))
		return cmd_export(strtoul(argv[2], NULL, 0), strtoull(argv[3], NULL, 0));
	if (argc == 3 && !strcmp(argv[1], "useraddr"))
		return cmd_useraddr(strtoul(argv[2], NULL, 0));
	if (argc == 3 && !strcmp(argv[1], "unexport"))
		return cmd_unexport(strtoull(argv[2], NULL, 0));
	if (argc == 10 && !strcmp(argv[1], "import"))
		return cmd_import(argv + 2);
	if (argc == 8 && !strcmp(argv[1], "preimport"))
		return cmd_preimport(argv + 2);
	fprintf(stderr, "usage: see the comment at the top of libobmm_xnode.c\n");
	return 2;
}
