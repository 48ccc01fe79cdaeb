// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * memprobe: data-path and Engram measurements on one memory source.
 *
 * Sources: --local SIZE (anonymous memory, the local baseline),
 * --shmdev PATH (an OBMM region, MAP_SHARED; --sync opens it O_SYNC) and
 * --file PATH (a regular file mapped MAP_SHARED, for host tests).
 *
 * --interleave LABEL=KIND[:PATH],... maps several sources of --length bytes
 * in this one process, each at a 2 MiB boundary, and runs the Engram, load
 * and chase tests on them in turn, sample by sample, rotating which goes
 * first: every source is measured under the same conditions (what else runs
 * on the host then), so their ratios are not skewed by when each ran.  KIND:
 * anon (4 KiB pages), anon-thp (2 MiB pages), shmdev, shmdev-pmd (the PMD
 * mmap flag), shmdev-sync and shmdev-pmd-sync (O_SYNC whatever --sync says),
 * file.  Samples then carry "source":LABEL.
 *
 * Output: one JSON object per line.  Every timed sample is printed:
 *   {"kind":"sample","test":T,"param":P,"unit":U,"value":V}
 * plus "env", "info", "skip", "verify" and a final "done" line.
 *
 * Only libc is used so it builds in any guest with gcc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CACHELINE		64
#define ENGRAM_ROW_BYTES	1364	/* 341 fp32 */
#define ENGRAM_ROW_FLOATS	(ENGRAM_ROW_BYTES / 4)
#define ENGRAM_TABLES		12
#define ENGRAM_ROWS		10000
#define ENGRAM_WARMUP		10
#define ENGRAM_ITERS		100
#define ENGRAM_PROBE_ROW	42
#define MAX_LIST		16
#define DEF_SAMPLES		10
#define DEF_LOAD_SAMPLES	1000
#define DEF_CHASE_LOADS		(1UL << 20)
#define DEF_BW_BYTES		(64UL << 20)
#define DEF_MAX_SECONDS		30.0
#define CLOCK_PAIRS		1000
#define NSEC_PER_SEC		1000000000.0
#define NSEC_PER_MSEC		1000000.0
#define ARRAY_SIZE(a)		(sizeof(a) / sizeof((a)[0]))
#define BIT(n)			(1U << (n))
#define MAX_SOURCES		6
#define WARM_PASSES		1	/* interleaved chase: warm-up loads / timed loads */
#define SZ_2M			(2UL << 20)
#define MMAP_FLAG_PMD		(1ULL << 63)	/* OBMM_MMAP_FLAG_HUGETLB_PMD */

#define EXIT_USAGE		1
#define EXIT_SETUP		2
#define EXIT_VERIFY		3

enum test_bit {
	T_VERIFY = BIT(0),
	T_ENGRAM = BIT(1),
	T_LOAD   = BIT(2),
	T_CHASE  = BIT(3),
	T_READ   = BIT(4),
	T_WRITE  = BIT(5),
	T_CLOCK  = BIT(6),
};

#define T_ALL (T_VERIFY | T_ENGRAM | T_LOAD | T_CHASE | T_READ | T_WRITE | T_CLOCK)

static const struct {
	const char *name;
	unsigned int bit;
} test_names[] = {
	{ "verify", T_VERIFY }, { "engram", T_ENGRAM }, { "load", T_LOAD },
	{ "chase", T_CHASE },   { "read", T_READ },     { "write", T_WRITE },
	{ "clock", T_CLOCK },   { "all", T_ALL },       { "none", 0 },
};

struct opts {
	const char *kind;	/* "local", "shmdev" or "file" */
	const char *path;
	size_t length;
	off_t offset;
	int sync;
	int fill;
	unsigned int tests;
	size_t chase_sizes[MAX_LIST];
	int nr_chase;
	size_t chase_loads;
	size_t engram_tokens[MAX_LIST];
	int nr_tokens;
	size_t engram_rows;
	int engram_iters;
	size_t bw_bytes;
	int samples;
	int load_samples;
	double max_seconds;
	uint64_t seed;
	char *interleave;	/* --interleave list, parsed into sources */
	int best_of;		/* interleaved chase, Engram: a sample is the fastest of this many */
	size_t engram_small_rows;	/* interleaved: Engram again from this many rows (0: no) */
};

struct region {
	unsigned char *base;
	size_t length;
	int fd;
};

static uint64_t rng_state;

/* xorshift64*: cheap, good enough to pick rows and build permutations. */
static uint64_t rng_next(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static uint64_t rng_below(uint64_t n)
{
	return rng_next() % n;
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * NSEC_PER_SEC + (double)ts.tv_nsec;
}

static inline void sink_u64(uint64_t v)
{
	__asm__ volatile("" : : "r"(v) : "memory");
}

static inline void barrier_mem(void)
{
	__asm__ volatile("" : : : "memory");
}

static void emit_sample(const char *test, size_t param, const char *unit,
			double value)
{
	printf("{\"kind\":\"sample\",\"test\":\"%s\",\"param\":%zu,\"unit\":\"%s\",\"value\":%.9g}\n", test, param, unit, value);
}

static void emit_source_sample(const char *source, const char *test,
			       size_t param, const char *unit, double value)
{
	printf("{\"kind\":\"sample\",\"source\":\"%s\",\"test\":\"%s\",\"param\":%zu,\"unit\":\"%s\",\"value\":%.9g}\n", source, test, param, unit, value);
}

static void emit_skip(const char *test, size_t param, const char *reason)
{
	printf("{\"kind\":\"skip\",\"test\":\"%s\",\"param\":%zu,\"reason\":\"%s\"}\n", test, param, reason);
}

static void emit_truncated(const char *test, size_t param, int done, int wanted)
{
	printf("{\"kind\":\"truncated\",\"test\":\"%s\",\"param\":%zu,\"samples\":%d,\"wanted\":%d,\"reason\":\"max-seconds\"}\n",
	       test, param, done, wanted);
}

/* Per-block time budget: --max-seconds shared by the blocks to run. */
struct budget {
	double end_ns;
};

static void budget_start(struct budget *b, double seconds)
{
	b->end_ns = now_ns() + seconds * NSEC_PER_SEC;
}

static int budget_over(const struct budget *b)
{
	return now_ns() > b->end_ns;
}

static int parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s)
		return -1;
	switch (*end) {
	case 'k': case 'K':
		v <<= 10;
		end++;
		break;
	case 'm': case 'M':
		v <<= 20;
		end++;
		break;
	case 'g': case 'G':
		v <<= 30;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'i' && end[1] == 'B')
		end += 2;
	else if (*end == 'B')
		end++;
	if (*end)
		return -1;
	*out = (size_t)v;
	return 0;
}

static int parse_size_list(const char *s, size_t *out, int max)
{
	char buf[256];
	char *tok, *save = NULL;
	int n = 0;

	if (strlen(s) >= sizeof(buf))
		return -1;
	strcpy(buf, s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n >= max || parse_size(tok, &out[n]) || !out[n])
			return -1;
		n++;
	}
	return n ? n : -1;
}

static int parse_tests(const char *s, unsigned int *out)
{
	char buf[256];
	char *tok, *save = NULL;
	unsigned int bits = 0;
	size_t i;

	if (strlen(s) >= sizeof(buf))
		return -1;
	strcpy(buf, s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		for (i = 0; i < ARRAY_SIZE(test_names); i++)
			if (!strcmp(tok, test_names[i].name))
				break;
		if (i == ARRAY_SIZE(test_names))
			return -1;
		bits |= test_names[i].bit;
	}
	*out = bits;
	return 0;
}

static void print_usage(FILE *f)
{
	fprintf(f,
		"usage: memprobe (--local SIZE | --shmdev PATH | --file PATH) [options]\n"
		"  --length N        bytes to map (shmdev: required; file: default its size)\n"
		"  --offset N        mmap offset (shmdev, file)\n"
		"  --sync            open with O_SYNC (non-cacheable mapping on OBMM)\n"
		"  --fill            write the Engram pattern (float i = i * 0.001) first\n"
		"  --tests LIST      verify,engram,load,chase,read,write,clock,all,none (all)\n"
		"  --chase-sizes L   working sets, e.g. 16K,256K,4M,64M\n"
		"  --chase-loads N   dependent loads per chase sample (%lu)\n"
		"  --bw-size N       bytes per bandwidth pass (min(length, 64M))\n"
		"  --samples N       samples per chase size and bandwidth test (%d)\n"
		"  --load-samples N  single 4-byte load samples (%d)\n"
		"  --engram-rows N   rows per table (%d, or as many as fit)\n"
		"  --engram-tokens L tokens per prefetch, e.g. 32,128 (128)\n"
		"  --engram-iters N  timed prefetches after %d warm-up ones (%d)\n"
		"  --max-seconds S   time budget shared by the tests (%.0f)\n"
		"  --interleave L    LABEL=KIND[:PATH],... Engram, load and chase on each in turn\n"
		"                    (KIND anon, anon-thp, shmdev, shmdev-pmd, shmdev-sync,\n"
		"                    shmdev-pmd-sync, file)\n"
		"  --best-of N       interleaved chase and Engram: a sample is the fastest of N\n"
		"                    timed runs (1)\n"
		"  --engram-small-rows N  interleaved: Engram again from the first N rows of\n"
		"                    each table (test engram-small; 0, the default: not)\n"
		"  --seed N          random seed (1)\n",
		DEF_CHASE_LOADS, DEF_SAMPLES, DEF_LOAD_SAMPLES, ENGRAM_ROWS,
		ENGRAM_WARMUP, ENGRAM_ITERS, DEF_MAX_SECONDS);
}

enum {
	OPT_LOCAL = 256, OPT_SHMDEV, OPT_FILE, OPT_LENGTH, OPT_OFFSET, OPT_SYNC,
	OPT_FILL, OPT_TESTS, OPT_CHASE_SIZES, OPT_CHASE_LOADS, OPT_BW_SIZE,
	OPT_SAMPLES, OPT_LOAD_SAMPLES, OPT_ENGRAM_ROWS, OPT_ENGRAM_TOKENS,
	OPT_ENGRAM_ITERS, OPT_MAX_SECONDS, OPT_SEED, OPT_INTERLEAVE, OPT_BEST_OF,
	OPT_ENGRAM_SMALL_ROWS, OPT_HELP,
};

static const struct option long_opts[] = {
	{ "local", required_argument, NULL, OPT_LOCAL },
	{ "shmdev", required_argument, NULL, OPT_SHMDEV },
	{ "file", required_argument, NULL, OPT_FILE },
	{ "length", required_argument, NULL, OPT_LENGTH },
	{ "offset", required_argument, NULL, OPT_OFFSET },
	{ "sync", no_argument, NULL, OPT_SYNC },
	{ "fill", no_argument, NULL, OPT_FILL },
	{ "tests", required_argument, NULL, OPT_TESTS },
	{ "chase-sizes", required_argument, NULL, OPT_CHASE_SIZES },
	{ "chase-loads", required_argument, NULL, OPT_CHASE_LOADS },
	{ "bw-size", required_argument, NULL, OPT_BW_SIZE },
	{ "samples", required_argument, NULL, OPT_SAMPLES },
	{ "load-samples", required_argument, NULL, OPT_LOAD_SAMPLES },
	{ "engram-rows", required_argument, NULL, OPT_ENGRAM_ROWS },
	{ "engram-tokens", required_argument, NULL, OPT_ENGRAM_TOKENS },
	{ "engram-iters", required_argument, NULL, OPT_ENGRAM_ITERS },
	{ "max-seconds", required_argument, NULL, OPT_MAX_SECONDS },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "interleave", required_argument, NULL, OPT_INTERLEAVE },
	{ "best-of", required_argument, NULL, OPT_BEST_OF },
	{ "engram-small-rows", required_argument, NULL, OPT_ENGRAM_SMALL_ROWS },
	{ "help", no_argument, NULL, OPT_HELP },
	{ NULL, 0, NULL, 0 },
};

static int parse_int(const char *s, int *out)
{
	size_t v;

	if (parse_size(s, &v) || v > 0x7fffffff)
		return -1;
	*out = (int)v;
	return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	size_t v;
	char *end;
	int c;

	while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		int bad = 0;

		switch (c) {
		case OPT_LOCAL:
			o->kind = "local";
			bad = parse_size(optarg, &o->length);
			break;
		case OPT_SHMDEV:
			o->kind = "shmdev";
			o->path = optarg;
			break;
		case OPT_FILE:
			o->kind = "file";
			o->path = optarg;
			break;
		case OPT_LENGTH:
			bad = parse_size(optarg, &o->length);
			break;
		case OPT_OFFSET:
			bad = parse_size(optarg, &v);
			o->offset = (off_t)v;
			break;
		case OPT_SYNC:
			o->sync = 1;
			break;
		case OPT_FILL:
			o->fill = 1;
			break;
		case OPT_TESTS:
			bad = parse_tests(optarg, &o->tests);
			break;
		case OPT_CHASE_SIZES:
			o->nr_chase = parse_size_list(optarg, o->chase_sizes, MAX_LIST);
			bad = o->nr_chase < 0;
			break;
		case OPT_CHASE_LOADS:
			bad = parse_size(optarg, &o->chase_loads) || !o->chase_loads;
			break;
		case OPT_BW_SIZE:
			bad = parse_size(optarg, &o->bw_bytes) || !o->bw_bytes;
			break;
		case OPT_SAMPLES:
			bad = parse_int(optarg, &o->samples) || o->samples < 1;
			break;
		case OPT_LOAD_SAMPLES:
			bad = parse_int(optarg, &o->load_samples) || o->load_samples < 1;
			break;
		case OPT_ENGRAM_ROWS:
			bad = parse_size(optarg, &o->engram_rows) || !o->engram_rows;
			break;
		case OPT_ENGRAM_TOKENS:
			o->nr_tokens = parse_size_list(optarg, o->engram_tokens, MAX_LIST);
			bad = o->nr_tokens < 0;
			break;
		case OPT_ENGRAM_ITERS:
			bad = parse_int(optarg, &o->engram_iters) || o->engram_iters < 1;
			break;
		case OPT_MAX_SECONDS:
			o->max_seconds = strtod(optarg, &end);
			bad = *end || o->max_seconds <= 0;
			break;
		case OPT_SEED:
			bad = parse_size(optarg, &v);
			o->seed = v ? v : 1;
			break;
		case OPT_INTERLEAVE:
			o->kind = "interleave";
			o->interleave = optarg;
			break;
		case OPT_BEST_OF:
			bad = parse_int(optarg, &o->best_of) || o->best_of < 1;
			break;
		case OPT_ENGRAM_SMALL_ROWS:
			bad = parse_size(optarg, &o->engram_small_rows);
			break;
		case 'h':
		case OPT_HELP:
			print_usage(stdout);
			exit(0);
		default:
			return -1;
		}
		if (bad) {
			fprintf(stderr, "memprobe: bad value for %s: %s\n",
				argv[optind - 1], optarg ? optarg : "");
			return -1;
		}
	}
	if (optind != argc || !o->kind) {
		fprintf(stderr, "memprobe: give exactly one of --local, --shmdev, --file\n");
		return -1;
	}
	if ((!strcmp(o->kind, "shmdev") || !strcmp(o->kind, "interleave")) &&
	    !o->length) {
		fprintf(stderr, "memprobe: --%s needs --length\n", o->kind);
		return -1;
	}
	if (!strcmp(o->kind, "local") && !o->length) {
		fprintf(stderr, "memprobe: --local needs a non-zero size\n");
		return -1;
	}
	return 0;
}

static int map_region(const struct opts *o, struct region *r)
{
	int flags = O_RDWR | O_CLOEXEC;
	struct stat st;

	r->fd = -1;
	r->length = o->length;
	if (!strcmp(o->kind, "local")) {
		r->base = mmap(NULL, r->length, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (r->base == MAP_FAILED) {
			perror("memprobe: mmap anonymous");
			return -1;
		}
		/* Fault every page in: the baseline measures memory, not faults. */
		memset(r->base, 0, r->length);
		return 0;
	}
	if (o->sync)
		flags |= O_SYNC;
	if (!strcmp(o->kind, "file"))
		flags |= O_CREAT;
	r->fd = open(o->path, flags, 0600);
	if (r->fd < 0) {
		fprintf(stderr, "memprobe: open %s: %s\n", o->path, strerror(errno));
		return -1;
	}
	if (!strcmp(o->kind, "file")) {
		if (fstat(r->fd, &st)) {
			perror("memprobe: fstat");
			goto err_close;
		}
		if (!r->length)
			r->length = (size_t)st.st_size - (size_t)o->offset;
		if ((size_t)st.st_size < (size_t)o->offset + r->length &&
		    ftruncate(r->fd, o->offset + (off_t)r->length)) {
			perror("memprobe: ftruncate");
			goto err_close;
		}
		if (!r->length) {
			fprintf(stderr, "memprobe: %s is empty; give --length\n", o->path);
			goto err_close;
		}
	}
	r->base = mmap(NULL, r->length, PROT_READ | PROT_WRITE, MAP_SHARED,
		       r->fd, o->offset);
	if (r->base == MAP_FAILED) {
		fprintf(stderr, "memprobe: mmap %s length %zu offset %lld: %s\n",
			o->path, r->length, (long long)o->offset, strerror(errno));
		goto err_close;
	}
	return 0;

err_close:
	close(r->fd);
	r->fd = -1;
	return -1;
}

static void unmap_region(struct region *r)
{
	munmap(r->base, r->length);
	if (r->fd >= 0)
		close(r->fd);
}

/* ---- Engram ---- */

struct engram {
	size_t rows;
	size_t table_bytes;
};

static int engram_layout(const struct opts *o, const struct region *r,
			 struct engram *e)
{
	size_t fit = r->length / ((size_t)ENGRAM_TABLES * ENGRAM_ROW_BYTES);

	e->rows = o->engram_rows < fit ? o->engram_rows : fit;
	e->table_bytes = e->rows * ENGRAM_ROW_BYTES;
	return e->rows ? 0 : -1;
}

static float engram_value(size_t table, size_t row, size_t col,
			  const struct engram *e)
{
	size_t i = (table * e->rows + row) * ENGRAM_ROW_FLOATS + col;

	return (float)((double)i * 0.001);
}

static void engram_fill(const struct region *r, const struct engram *e)
{
	size_t t, row, col;
	float v;

	for (t = 0; t < ENGRAM_TABLES; t++)
		for (row = 0; row < e->rows; row++) {
			unsigned char *p = r->base + t * e->table_bytes +
					   row * ENGRAM_ROW_BYTES;

			for (col = 0; col < ENGRAM_ROW_FLOATS; col++) {
				v = engram_value(t, row, col, e);
				memcpy(p + col * sizeof(v), &v, sizeof(v));
			}
		}
	barrier_mem();
}

/* The probe rows of every table against the pattern; `source` labels the line (or NULL). */
static int engram_verify(const struct region *r, const struct engram *e, const char *source)
{
	size_t probe[4] = { 0, ENGRAM_PROBE_ROW % e->rows, e->rows / 2, e->rows - 1 };
	size_t t, k, col, checked = 0;
	float got, want;

	for (t = 0; t < ENGRAM_TABLES; t++)
		for (k = 0; k < ARRAY_SIZE(probe); k++) {
			const unsigned char *p = r->base + t * e->table_bytes +
						 probe[k] * ENGRAM_ROW_BYTES;

			for (col = 0; col < ENGRAM_ROW_FLOATS; col++) {
				memcpy(&got, p + col * sizeof(got), sizeof(got));
				want = engram_value(t, probe[k], col, e);
				if (memcmp(&got, &want, sizeof(got))) {
					printf("{\"kind\":\"verify\",%s%s%s\"ok\":false,\"table\":%zu,\"row\":%zu,\"col\":%zu,\"got\":%.9g,\"want\":%.9g}\n",
					       source ? "\"source\":\"" : "", source ? source : "",
					       source ? "\"," : "", t, probe[k], col, (double)got,
					       (double)want);
					return -1;
				}
			}
			checked++;
		}
	printf("{\"kind\":\"verify\",%s%s%s\"ok\":true,\"rows_checked\":%zu,\"rows_per_table\":%zu}\n",
	       source ? "\"source\":\"" : "", source ? source : "", source ? "\"," : "",
	       checked, e->rows);
	return 0;
}

/* One random row per table per token, like an N-gram hash would: offsets into the tables. */
static void engram_pick(const struct engram *e, size_t tokens, size_t *src_off)
{
	size_t tok, t;

	for (tok = 0; tok < tokens; tok++)
		for (t = 0; t < ENGRAM_TABLES; t++)
			src_off[tok * ENGRAM_TABLES + t] = t * e->table_bytes +
				rng_below(e->rows) * ENGRAM_ROW_BYTES;
	barrier_mem();
}

/* One prefetch: every picked row memcpy'd from `base` into dst; returns ns. */
static double engram_copy(unsigned char *dst, const unsigned char *base,
			  const size_t *src_off, size_t nreads)
{
	double t0 = now_ns();
	size_t i;

	for (i = 0; i < nreads; i++)
		memcpy(dst + i * ENGRAM_ROW_BYTES, base + src_off[i], ENGRAM_ROW_BYTES);
	barrier_mem();
	return now_ns() - t0;
}

static int engram_bench(const struct opts *o, const struct region *r,
			const struct engram *e, size_t tokens, double seconds)
{
	size_t nreads = tokens * ENGRAM_TABLES;
	unsigned char *dst;
	size_t *src_off;
	struct budget b;
	uint64_t check = 0;
	int it, total = ENGRAM_WARMUP + o->engram_iters;

	dst = malloc(nreads * ENGRAM_ROW_BYTES);
	src_off = malloc(nreads * sizeof(*src_off));
	if (!dst || !src_off) {
		free(dst);
		free(src_off);
		fprintf(stderr, "memprobe: out of memory for Engram buffers\n");
		return -1;
	}
	memset(dst, 0, nreads * ENGRAM_ROW_BYTES);
	budget_start(&b, seconds);
	for (it = 0; it < total; it++) {
		double ns;

		engram_pick(e, tokens, src_off);
		ns = engram_copy(dst, r->base, src_off, nreads);
		check += dst[(size_t)it % nreads * ENGRAM_ROW_BYTES];
		if (it >= ENGRAM_WARMUP) {
			printf("{\"kind\":\"sample\",\"test\":\"engram\",\"param\":%zu,\"unit\":\"ms\",\"value\":%.9g,\"rows_per_s\":%.9g}\n",
			       tokens, ns / NSEC_PER_MSEC, (double)nreads * NSEC_PER_SEC / ns);
		}
		if (it >= ENGRAM_WARMUP && it + 1 < total && budget_over(&b)) {
			emit_truncated("engram", tokens, it + 1 - ENGRAM_WARMUP,
				       o->engram_iters);
			break;
		}
	}
	sink_u64(check);
	free(dst);
	free(src_off);
	return 0;
}

/* ---- pointer chase ---- */

struct chase_node {
	struct chase_node *next;
	unsigned char pad[CACHELINE - sizeof(struct chase_node *)];
};

static int chase_bench(const struct opts *o, const struct region *r,
		       size_t ws, double seconds)
{
	size_t n = ws / sizeof(struct chase_node);
	struct chase_node *nodes = (struct chase_node *)r->base;
	struct chase_node *p;
	size_t *perm, i, j, tmp, k;
	struct budget b;
	int s;

	if (n < 2) {
		emit_skip("chase", ws, "working set smaller than two cache lines");
		return 0;
	}
	perm = malloc(n * sizeof(*perm));
	if (!perm) {
		fprintf(stderr, "memprobe: out of memory for the permutation\n");
		return -1;
	}
	/* Sattolo's algorithm: a random permutation that is one single cycle. */
	for (i = 0; i < n; i++)
		perm[i] = i;
	for (i = n - 1; i > 0; i--) {
		j = rng_below(i);
		tmp = perm[i];
		perm[i] = perm[j];
		perm[j] = tmp;
	}
	for (i = 0; i < n; i++)
		nodes[i].next = &nodes[perm[i]];
	free(perm);
	barrier_mem();

	p = &nodes[0];
	for (k = 0; k < n && k < o->chase_loads; k++)	/* warm-up pass */
		p = *(struct chase_node * volatile *)&p->next;
	budget_start(&b, seconds);
	for (s = 0; s < o->samples; s++) {
		double t0 = now_ns();

		for (k = 0; k < o->chase_loads; k++)
			p = *(struct chase_node * volatile *)&p->next;
		emit_sample("chase", ws, "ns", (now_ns() - t0) / (double)o->chase_loads);
		if (s + 1 < o->samples && budget_over(&b)) {
			emit_truncated("chase", ws, s + 1, o->samples);
			break;
		}
	}
	sink_u64((uint64_t)(uintptr_t)p);
	return 0;
}

/* ---- sequential bandwidth ---- */

static uint64_t read_pass(const uint64_t *p, size_t words)
{
	uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
	size_t i;

	for (i = 0; i + 4 <= words; i += 4) {
		a0 ^= p[i];
		a1 ^= p[i + 1];
		a2 ^= p[i + 2];
		a3 ^= p[i + 3];
	}
	return a0 ^ a1 ^ a2 ^ a3;
}

static void write_pass(uint64_t *p, size_t words, uint64_t v)
{
	size_t i;

	for (i = 0; i < words; i++)
		p[i] = v;
	barrier_mem();
}

static void bw_bench(const struct opts *o, const struct region *r, int write,
		     double seconds)
{
	const char *name = write ? "write" : "read";
	size_t bytes = o->bw_bytes ? o->bw_bytes : DEF_BW_BYTES;
	size_t words;
	struct budget b;
	int s;

	if (bytes > r->length)
		bytes = r->length;
	words = bytes / sizeof(uint64_t);
	bytes = words * sizeof(uint64_t);
	/* One untimed pass so that first-touch faults are not measured. */
	if (write)
		write_pass((uint64_t *)r->base, words, 0);
	else
		sink_u64(read_pass((const uint64_t *)r->base, words));
	budget_start(&b, seconds);
	for (s = 0; s < o->samples; s++) {
		double t0 = now_ns(), ns;

		if (write)
			write_pass((uint64_t *)r->base, words, (uint64_t)s + 1);
		else
			sink_u64(read_pass((const uint64_t *)r->base, words));
		barrier_mem();
		ns = now_ns() - t0;
		emit_sample(name, bytes, "GB/s", (double)bytes / ns);
		if (s + 1 < o->samples && budget_over(&b)) {
			emit_truncated(name, bytes, s + 1, o->samples);
			break;
		}
	}
}

/* ---- single loads and the clock ---- */

static double clock_overhead(void)
{
	double best = -1;
	int i;

	for (i = 0; i < CLOCK_PAIRS; i++) {
		double t0 = now_ns(), d = now_ns() - t0;

		if (best < 0 || d < best)
			best = d;
	}
	return best;
}

static void clock_bench(const struct opts *o)
{
	int i;

	for (i = 0; i < o->load_samples; i++) {
		double t0 = now_ns();

		emit_sample("clock", 0, "ns", now_ns() - t0);
	}
}

static void load_bench(const struct opts *o, const struct region *r, double seconds)
{
	size_t slots = r->length / CACHELINE;
	uint64_t acc = 0;
	struct budget b;
	int s;

	budget_start(&b, seconds);
	for (s = 0; s < o->load_samples; s++) {
		const volatile uint32_t *q = (const volatile uint32_t *)
			(r->base + rng_below(slots) * CACHELINE);
		double t0 = now_ns(), t1;

		acc += *q;
		t1 = now_ns();
		emit_sample("load", 4, "ns", t1 - t0);
		if (s + 1 < o->load_samples && budget_over(&b)) {
			emit_truncated("load", 4, s + 1, o->load_samples);
			break;
		}
	}
	sink_u64(acc);
}

static void print_env(const struct opts *o, const struct region *r)
{
	printf("{\"kind\":\"env\",\"source\":\"%s\",\"path\":\"%s\",\"sync\":%s,\"length\":%zu,\"offset\":%lld,\"page_size\":%ld,\"clock_overhead_ns\":%.3f,\"seed\":%llu}\n",
	       o->kind, o->path ? o->path : "", o->sync ? "true" : "false",
	       r->length, (long long)o->offset, sysconf(_SC_PAGESIZE),
	       clock_overhead(), (unsigned long long)o->seed);
}

static int count_blocks(const struct opts *o, size_t nr_chase)
{
	int n = 0;

	n += (o->tests & T_ENGRAM) ? o->nr_tokens : 0;
	n += (o->tests & T_LOAD) ? 1 : 0;
	n += (o->tests & T_CHASE) ? (int)nr_chase : 0;
	n += (o->tests & T_READ) ? 1 : 0;
	n += (o->tests & T_WRITE) ? 1 : 0;
	return n ? n : 1;
}

/* ---- interleaved sources ---- */

struct source {
	char *label;
	char *kind;
	char *path;
	unsigned int flags;	/* SRC_* of its kind */
	struct region r;
};

enum {
	SRC_ANON = BIT(0),	/* anonymous memory, no path */
	SRC_HUGE = BIT(1),	/* anon: 2 MiB pages (THP); shmdev: the PMD mmap flag */
	SRC_SHMDEV = BIT(2),	/* an OBMM region: O_SYNC under --sync */
	SRC_SYNC = BIT(3),	/* shmdev opened O_SYNC whatever --sync says */
	SRC_FILE = BIT(4),	/* a regular file, MAP_SHARED */
};

static const struct {
	const char *name;
	unsigned int flags;
} source_kinds[] = {
	{ "anon", SRC_ANON },
	{ "anon-thp", SRC_ANON | SRC_HUGE },
	{ "shmdev", SRC_SHMDEV },
	{ "shmdev-pmd", SRC_SHMDEV | SRC_HUGE },
	{ "shmdev-sync", SRC_SHMDEV | SRC_SYNC },
	{ "shmdev-pmd-sync", SRC_SHMDEV | SRC_HUGE | SRC_SYNC },
	{ "file", SRC_FILE },
};

/* LABEL=KIND[:PATH],... into src[]; the list is split in place. */
static int parse_sources(char *list, struct source *src, int max)
{
	char *save = NULL, *item;
	size_t k;
	int n = 0;

	for (item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(item, '='), *colon;

		if (n == max || !eq || eq == item)
			return -1;
		*eq = '\0';
		src[n].label = item;
		src[n].kind = eq + 1;
		colon = strchr(src[n].kind, ':');
		src[n].path = NULL;
		if (colon) {
			*colon = '\0';
			src[n].path = colon + 1;
		}
		for (k = 0; k < ARRAY_SIZE(source_kinds); k++)
			if (!strcmp(src[n].kind, source_kinds[k].name))
				break;
		if (k == ARRAY_SIZE(source_kinds))
			return -1;
		src[n].flags = source_kinds[k].flags;
		if (!(src[n].flags & SRC_ANON) != !!src[n].path)
			return -1;
		n++;
	}
	return n;
}

/*
 * Address space for `length` bytes at a 2 MiB boundary, reserved PROT_NONE:
 * every source is then mapped at the same alignment, so row k of table t
 * (or a chase node) crosses the same line and page boundaries in each.
 */
static void *reserve_aligned(size_t length)
{
	unsigned char *p = mmap(NULL, length + SZ_2M, PROT_NONE,
				MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	uintptr_t lo, base, end;

	if (p == MAP_FAILED)
		return NULL;
	lo = (uintptr_t)p;
	base = (lo + SZ_2M - 1) & ~(uintptr_t)(SZ_2M - 1);
	end = lo + length + SZ_2M;
	if (base > lo)
		munmap(p, base - lo);
	if (end > base + length)
		munmap((void *)(base + length), end - (base + length));
	return (void *)base;
}

static int map_anon(struct source *s, size_t length)
{
	void *base = reserve_aligned(length);
	int huge = !!(s->flags & SRC_HUGE);

	if (!base || mmap(base, length, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
		perror("memprobe: mmap anonymous");
		if (base)
			munmap(base, length);
		return -1;
	}
	/* Page size chosen explicitly: the guest's THP default is not ours. */
	madvise(base, length, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	s->r.base = base;
	s->r.length = length;
	s->r.fd = -1;
	memset(s->r.base, 0, length);
	return 0;
}

static int map_source(const struct opts *o, struct source *s)
{
	int flags = O_RDWR | O_CLOEXEC;
	off_t off = 0;
	void *base;

	if (s->flags & SRC_ANON)
		return map_anon(s, o->length);
	if ((s->flags & SRC_SHMDEV) && (o->sync || (s->flags & SRC_SYNC)))
		flags |= O_SYNC;
	if (s->flags & SRC_FILE)
		flags |= O_CREAT;
	s->r.fd = open(s->path, flags, 0600);
	if (s->r.fd < 0) {
		fprintf(stderr, "memprobe: open %s: %s\n", s->path, strerror(errno));
		return -1;
	}
	if ((s->flags & SRC_FILE) && ftruncate(s->r.fd, (off_t)o->length)) {
		perror("memprobe: ftruncate");
		goto err_close;
	}
	if ((s->flags & SRC_SHMDEV) && (s->flags & SRC_HUGE))
		off = (off_t)MMAP_FLAG_PMD;
	s->r.length = o->length;
	base = reserve_aligned(o->length);
	if (!base) {
		perror("memprobe: reserving address space");
		goto err_close;
	}
	s->r.base = mmap(base, o->length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
			 s->r.fd, off);
	if (s->r.base == MAP_FAILED) {
		fprintf(stderr, "memprobe: mmap %s (%s) length %zu: %s\n", s->path, s->kind,
			o->length, strerror(errno));
		munmap(base, o->length);
		goto err_close;
	}
	/* Fault every page in now (a PMD mapping maps on first touch). */
	memset(s->r.base, 0, o->length);
	return 0;

err_close:
	close(s->r.fd);
	s->r.fd = -1;
	return -1;
}

static void unmap_source(struct source *s)
{
	munmap(s->r.base, s->r.length);
	if (s->r.fd >= 0)
		close(s->r.fd);
}

/* One timed chase of `loads` dependent loads from *p; returns ns per load. */
static double chase_once(struct chase_node **p, size_t loads)
{
	struct chase_node *q = *p;
	double t0 = now_ns();
	size_t k;

	for (k = 0; k < loads; k++)
		q = *(struct chase_node * volatile *)&q->next;
	*p = q;
	return (now_ns() - t0) / (double)loads;
}

/* The chase list of perm[] in the ws bytes at base. */
static struct chase_node *chase_build(unsigned char *base, const size_t *perm, size_t nodes)
{
	struct chase_node *list = (struct chase_node *)base;
	size_t i;

	for (i = 0; i < nodes; i++)
		list[i].next = &list[perm[i]];
	barrier_mem();
	return &list[0];
}

/*
 * Samples in turn: round s makes --best-of timed runs of --chase-loads
 * loads on every source, the sources alternating run by run (rotating
 * which goes first), each run after an untimed one of as many loads (at
 * most one pass over its set); a source's sample is its fastest run.  So
 * every source sees the same conditions, and on a host whose cores other
 * work shares, a run that was preempted or crowded out of the caches does
 * not decide the figure.  While the set is smaller
 * than the region, each round moves it (the same place in every source)
 * to the next ws bytes, so no figure hangs on where one set happens to
 * lie (cache sets, TLB indexes).  The permutation is the same everywhere.
 */
static int interleave_chase(const struct opts *o, struct source *src, int n,
			    size_t ws, double seconds)
{
	size_t nodes = ws / sizeof(struct chase_node), *perm, i, j, tmp, k;
	size_t places = o->length / ws, warm = WARM_PASSES * o->chase_loads;
	struct chase_node *p[MAX_SOURCES];
	struct budget b;
	int s, x;

	if (nodes < 2) {
		for (x = 0; x < n; x++)
			printf("{\"kind\":\"skip\",\"source\":\"%s\",\"test\":\"chase\",\"param\":%zu,\"reason\":\"working set smaller than two cache lines\"}\n",
			       src[x].label, ws);
		return 0;
	}
	perm = malloc(nodes * sizeof(*perm));
	if (!perm) {
		fprintf(stderr, "memprobe: out of memory for the permutation\n");
		return -1;
	}
	for (i = 0; i < nodes; i++)
		perm[i] = i;
	for (i = nodes - 1; i > 0; i--) {
		j = rng_below(i);
		tmp = perm[i];
		perm[i] = perm[j];
		perm[j] = tmp;
	}
	if (warm > nodes)
		warm = nodes;
	budget_start(&b, seconds);
	for (s = 0; s < o->samples; s++) {
		size_t place = ((size_t)s % places) * ws;

		/*
		 * The set built last is partly still in the host's caches when
		 * the round starts (a 16 MiB set chased 4x faster there under
		 * TCG): the source built last takes turns like the one run first.
		 */
		for (k = 0; k < (size_t)n && (places > 1 || !s); k++) {
			x = (int)((k + (size_t)s + 1) % (size_t)n);
			p[x] = chase_build(src[x].r.base + place, perm, nodes);
		}
		double best[MAX_SOURCES] = { 0 }, t;
		int r;

		/* The runs of all sources alternate: their best-of windows coincide. */
		for (r = 0; r < o->best_of; r++) {
			for (k = 0; k < (size_t)n; k++) {
				x = (int)((k + (size_t)s + (size_t)r) % (size_t)n);
				chase_once(&p[x], warm);
				t = chase_once(&p[x], o->chase_loads);
				if (!r || t < best[x])
					best[x] = t;
			}
		}
		for (k = 0; k < (size_t)n; k++) {
			x = (int)((k + (size_t)s) % (size_t)n);
			emit_source_sample(src[x].label, "chase", ws, "ns", best[x]);
		}
		if (s + 1 < o->samples && budget_over(&b)) {
			for (x = 0; x < n; x++)
				printf("{\"kind\":\"truncated\",\"source\":\"%s\",\"test\":\"chase\",\"param\":%zu,\"samples\":%d,\"wanted\":%d,\"reason\":\"max-seconds\"}\n",
				       src[x].label, ws, s + 1, o->samples);
			break;
		}
	}
	free(perm);
	for (x = 0; x < n; x++)
		sink_u64((uint64_t)(uintptr_t)p[x]);
	return 0;
}

/* One 4 B load at the same random line of every source, in turn. */
static void interleave_load(const struct opts *o, struct source *src, int n, double seconds)
{
	size_t slots = o->length / CACHELINE, line;
	uint64_t acc = 0;
	struct budget b;
	int s, k, x;

	budget_start(&b, seconds);
	for (s = 0; s < o->load_samples; s++) {
		line = rng_below(slots);
		for (k = 0; k < n; k++) {
			const volatile uint32_t *q;
			double t0, t1;

			x = (k + s) % n;
			q = (const volatile uint32_t *)(src[x].r.base + line * CACHELINE);
			t0 = now_ns();
			acc += *q;
			t1 = now_ns();
			emit_source_sample(src[x].label, "load", 4, "ns", t1 - t0);
		}
		if (s + 1 < o->load_samples && budget_over(&b)) {
			for (x = 0; x < n; x++)
				printf("{\"kind\":\"truncated\",\"source\":\"%s\",\"test\":\"load\",\"param\":4,\"samples\":%d,\"wanted\":%d,\"reason\":\"max-seconds\"}\n",
				       src[x].label, s + 1, o->load_samples);
			break;
		}
	}
	sink_u64(acc);
}

/*
 * Every source gets the same tables: the pattern is written into the first
 * one and copied to the others by this process, so each page of each
 * source has been written once, from here, before any timing; then each
 * source's probe rows are checked.  Returns a bit per source that failed.
 */
static unsigned int interleave_engram_fill(struct source *src, int n, const struct engram *e)
{
	size_t bytes = (size_t)ENGRAM_TABLES * e->table_bytes;
	unsigned int bad = 0;
	int x;

	engram_fill(&src[0].r, e);
	for (x = 1; x < n; x++)
		memcpy(src[x].r.base, src[0].r.base, bytes);
	barrier_mem();
	for (x = 0; x < n; x++)
		if (engram_verify(&src[x].r, e, src[x].label))
			bad |= BIT(x);
	return bad;
}

/*
 * Prefetches in turn: every step picks one set of rows and copies it from
 * every source into the same destination buffer, the sources taking turns
 * to go first; after ENGRAM_WARMUP untimed steps, a sample of each source is
 * its fastest prefetch of --best-of steps.  So the sources are compared on
 * the same rows, with the same buffer, under the same conditions of the host
 * (their best-of windows coincide: a prefetch the vCPU was descheduled in,
 * on a host whose cores other work shares, does not decide a figure), and
 * sample k of two sources pair up.
 */
static int interleave_engram(const struct opts *o, struct source *src, int n,
			     const struct engram *e, size_t tokens, unsigned int bad,
			     const char *test, double seconds)
{
	size_t nreads = tokens * ENGRAM_TABLES, bytes = nreads * ENGRAM_ROW_BYTES;
	double best[MAX_SOURCES], t;
	unsigned char *dst = NULL;
	uint64_t check = 0;
	struct rusage before, after;
	size_t *src_off;
	struct budget b;
	int s, r, k, x;

	src_off = malloc(nreads * sizeof(*src_off));
	if (!src_off || posix_memalign((void **)&dst, SZ_2M, bytes)) {
		free(src_off);
		fprintf(stderr, "memprobe: out of memory for Engram buffers\n");
		return -1;
	}
	memset(dst, 0, bytes);
	for (x = 0; x < n; x++)
		if (bad & BIT(x))
			printf("{\"kind\":\"skip\",\"source\":\"%s\",\"test\":\"%s\",\"param\":%zu,\"reason\":\"verification failed\"}\n",
			       src[x].label, test, tokens);
	for (r = 0; r < ENGRAM_WARMUP; r++) {
		engram_pick(e, tokens, src_off);
		for (k = 0; k < n; k++) {
			x = (k + r) % n;
			if (!(bad & BIT(x)))
				engram_copy(dst, src[x].r.base, src_off, nreads);
		}
	}
	getrusage(RUSAGE_SELF, &before);
	budget_start(&b, seconds);
	for (s = 0; s < o->engram_iters; s++) {
		for (r = 0; r < o->best_of; r++) {
			engram_pick(e, tokens, src_off);
			for (k = 0; k < n; k++) {
				x = (k + s + r) % n;
				if (bad & BIT(x))
					continue;
				t = engram_copy(dst, src[x].r.base, src_off, nreads);
				check += dst[(size_t)(s + r) % nreads * ENGRAM_ROW_BYTES];
				if (!r || t < best[x])
					best[x] = t;
			}
		}
		for (x = 0; x < n; x++)
			if (!(bad & BIT(x)))
				printf("{\"kind\":\"sample\",\"source\":\"%s\",\"test\":\"%s\",\"param\":%zu,\"unit\":\"ms\",\"value\":%.9g,\"rows_per_s\":%.9g}\n",
				       src[x].label, test, tokens, best[x] / NSEC_PER_MSEC,
				       (double)nreads * NSEC_PER_SEC / best[x]);
		if (s + 1 < o->engram_iters && budget_over(&b)) {
			for (x = 0; x < n; x++)
				printf("{\"kind\":\"truncated\",\"source\":\"%s\",\"test\":\"%s\",\"param\":%zu,\"samples\":%d,\"wanted\":%d,\"reason\":\"max-seconds\"}\n",
				       src[x].label, test, tokens, s + 1, o->engram_iters);
			break;
		}
	}
	getrusage(RUSAGE_SELF, &after);
	/* A fault while timing would put the driver on the path of a prefetch. */
	printf("{\"kind\":\"info\",\"%s_faults\":%ld}\n", test,
	       (after.ru_minflt - before.ru_minflt) + (after.ru_majflt - before.ru_majflt));
	sink_u64(check);
	free(dst);
	free(src_off);
	return 0;
}

static int interleave_main(struct opts *o, double start)
{
	struct source src[MAX_SOURCES];
	double per_block;
	int n, x, i, rc = 0, blocks;

	n = parse_sources(o->interleave, src, MAX_SOURCES);
	if (n < 1) {
		fprintf(stderr, "memprobe: bad --interleave list (LABEL=KIND[:PATH],..., at most %d)\n",
			MAX_SOURCES);
		return EXIT_USAGE;
	}
	for (x = 0; x < n; x++) {
		if (map_source(o, &src[x])) {
			while (x--)
				unmap_source(&src[x]);
			return EXIT_SETUP;
		}
	}
	printf("{\"kind\":\"env\",\"source\":\"interleave\",\"sources\":%d,\"sync\":%s,\"length\":%zu,\"page_size\":%ld,\"clock_overhead_ns\":%.3f,\"seed\":%llu,\"best_of\":%d,\"engram_small_rows\":%zu}\n",
	       n, o->sync ? "true" : "false", o->length, sysconf(_SC_PAGESIZE),
	       clock_overhead(), (unsigned long long)o->seed, o->best_of,
	       o->engram_small_rows);
	blocks = ((o->tests & T_LOAD) ? 1 : 0) + ((o->tests & T_CHASE) ? o->nr_chase : 0) +
		 ((o->tests & T_ENGRAM) ? o->nr_tokens * (o->engram_small_rows ? 2 : 1) : 0);
	per_block = o->max_seconds / (blocks ? blocks : 1);
	/* Engram first: the chase overwrites the tables. */
	if (o->tests & (T_ENGRAM | T_VERIFY)) {
		struct engram e;
		unsigned int bad;

		if (engram_layout(o, &src[0].r, &e)) {
			for (x = 0; x < n; x++)
				for (i = 0; (o->tests & T_ENGRAM) && i < o->nr_tokens; i++)
					printf("{\"kind\":\"skip\",\"source\":\"%s\",\"test\":\"engram\",\"param\":%zu,\"reason\":\"region smaller than one row per table\"}\n",
					       src[x].label, o->engram_tokens[i]);
		} else {
			printf("{\"kind\":\"info\",\"engram_tables\":%d,\"engram_rows\":%zu,\"engram_row_bytes\":%d}\n",
			       ENGRAM_TABLES, e.rows, ENGRAM_ROW_BYTES);
			bad = interleave_engram_fill(src, n, &e);
			for (i = 0; (o->tests & T_ENGRAM) && i < o->nr_tokens; i++)
				if (interleave_engram(o, src, n, &e, o->engram_tokens[i], bad,
						      "engram", per_block))
					rc = EXIT_SETUP;
			/*
			 * The same copies from the first --engram-small-rows rows of
			 * each table: a few pages, which stay in the TLBs and caches,
			 * so a cost that comes with the pages a prefetch touches
			 * shows as the difference between the two ratios.
			 */
			if (o->engram_small_rows && o->engram_small_rows < e.rows) {
				struct engram small = e;

				small.rows = o->engram_small_rows;
				for (i = 0; (o->tests & T_ENGRAM) && i < o->nr_tokens; i++)
					if (interleave_engram(o, src, n, &small,
							      o->engram_tokens[i], bad,
							      "engram-small", per_block))
						rc = EXIT_SETUP;
			}
		}
	}
	if (o->tests & T_LOAD)
		interleave_load(o, src, n, per_block);
	for (i = 0; (o->tests & T_CHASE) && i < o->nr_chase; i++) {
		if (o->chase_sizes[i] > o->length) {
			for (x = 0; x < n; x++)
				printf("{\"kind\":\"skip\",\"source\":\"%s\",\"test\":\"chase\",\"param\":%zu,\"reason\":\"working set larger than the region\"}\n",
				       src[x].label, o->chase_sizes[i]);
			continue;
		}
		if (interleave_chase(o, src, n, o->chase_sizes[i], per_block))
			rc = EXIT_SETUP;
	}
	printf("{\"kind\":\"done\",\"ok\":%s,\"elapsed_s\":%.3f}\n",
	       rc ? "false" : "true", (now_ns() - start) / NSEC_PER_SEC);
	for (x = 0; x < n; x++)
		unmap_source(&src[x]);
	return rc;
}

int main(int argc, char **argv)
{
	struct opts o = {
		.tests = T_ALL,
		.chase_sizes = { 16UL << 10, 256UL << 10, 4UL << 20, 64UL << 20 },
		.nr_chase = 4,
		.chase_loads = DEF_CHASE_LOADS,
		.engram_tokens = { 128 },
		.nr_tokens = 1,
		.engram_rows = ENGRAM_ROWS,
		.engram_iters = ENGRAM_ITERS,
		.samples = DEF_SAMPLES,
		.load_samples = DEF_LOAD_SAMPLES,
		.max_seconds = DEF_MAX_SECONDS,
		.seed = 1,
		.best_of = 1,
	};
	struct region r;
	struct engram e;
	double start = now_ns(), per_block;
	int verified = 1, rc = 0, i;

	if (parse_args(argc, argv, &o)) {
		print_usage(stderr);
		return EXIT_USAGE;
	}
	rng_state = o.seed;
	if (!strcmp(o.kind, "interleave"))
		return interleave_main(&o, start);
	if (map_region(&o, &r))
		return EXIT_SETUP;
	print_env(&o, &r);
	per_block = o.max_seconds / count_blocks(&o, (size_t)o.nr_chase);

	if (engram_layout(&o, &r, &e)) {
		if (o.fill || (o.tests & (T_VERIFY | T_ENGRAM)))
			emit_skip("engram", 0, "region smaller than one row per table");
		o.fill = 0;
		o.tests &= ~(T_VERIFY | T_ENGRAM);
	} else {
		printf("{\"kind\":\"info\",\"engram_tables\":%d,\"engram_rows\":%zu,\"engram_row_bytes\":%d}\n", ENGRAM_TABLES, e.rows, ENGRAM_ROW_BYTES);
	}
	/* Local memory is its own writer: fill it, or verification has no data. */
	if (o.fill || !strcmp(o.kind, "local"))
		engram_fill(&r, &e);
	if (o.tests & T_VERIFY)
		verified = !engram_verify(&r, &e, NULL);
	if (o.tests & T_CLOCK)
		clock_bench(&o);
	/* Engram first: the chase and write tests overwrite the tables. */
	for (i = 0; (o.tests & T_ENGRAM) && i < o.nr_tokens; i++) {
		if (!verified) {
			emit_skip("engram", o.engram_tokens[i], "verification failed");
			continue;
		}
		if (engram_bench(&o, &r, &e, o.engram_tokens[i], per_block))
			rc = EXIT_SETUP;
	}
	if (o.tests & T_LOAD)
		load_bench(&o, &r, per_block);
	for (i = 0; (o.tests & T_CHASE) && i < o.nr_chase; i++) {
		if (o.chase_sizes[i] > r.length) {
			emit_skip("chase", o.chase_sizes[i], "working set larger than the region");
			continue;
		}
		if (chase_bench(&o, &r, o.chase_sizes[i], per_block))
			rc = EXIT_SETUP;
	}
	if (o.tests & T_READ)
		bw_bench(&o, &r, 0, per_block);
	if (o.tests & T_WRITE)
		bw_bench(&o, &r, 1, per_block);

	if (!rc && !verified)
		rc = EXIT_VERIFY;
	printf("{\"kind\":\"done\",\"ok\":%s,\"elapsed_s\":%.3f}\n",
	       rc ? "false" : "true", (now_ns() - start) / NSEC_PER_SEC);
	unmap_region(&r);
	return rc;
}
