// SPDX-License-Identifier: GPL-2.0
/*
 * Cross-node atomics on one OBMM region (tests/cluster/test_atomics_xnode.py).
 *
 *   atomics SHMDEV NODES ADDS LOCKS
 *
 * Maps the first 4 KiB of SHMDEV (an export on its node, an import on
 * the others), waits until NODES processes arrived, then does ADDS
 * fetch-and-adds on one 64-bit word with LOCKS rounds of a compare-and-swap
 * spin lock around a plain increment of another word spread among them.
 * Prints one JSON line with the seconds it took.  Another node's QEMU shares the RAM:
 * only real (host) atomics keep the counts exact.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAP_LEN		4096
#define WAIT_S		120
#define SPIN_CHECK_MASK	0xfffff

/* One cache line each. */
struct shared {
	uint64_t counter;
	uint64_t pad0[7];
	uint64_t lock;
	uint64_t pad1[7];
	uint64_t plain;
	uint64_t pad2[7];
	uint64_t arrived;
	uint64_t pad3[7];
	uint64_t left;
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Take the CAS spin lock, bump the plain word, release; nonzero if stuck. */
static int lock_round(volatile struct shared *s)
{
	uint64_t expected = 0, spins = 0;
	double stuck_since = 0;

	while (!__atomic_compare_exchange_n(&s->lock, &expected, 1, 0,
					    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
		expected = 0;
		/* A lock two non-atomic CASes both took stays held. */
		if (++spins & SPIN_CHECK_MASK)
			continue;
		if (!stuck_since) {
			stuck_since = now();
		} else if (now() - stuck_since > WAIT_S) {
			fprintf(stderr, "lock held for %d s\n", WAIT_S);
			return 1;
		}
	}
	s->plain = s->plain + 1;
	__atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE);
	return 0;
}

int main(int argc, char **argv)
{
	volatile struct shared *s;
	uint64_t nodes, adds, locks, every, done = 0, i;
	double t0, t1;
	int fd;

	if (argc != 5) {
		fprintf(stderr, "usage: %s SHMDEV NODES ADDS LOCKS\n", argv[0]);
		return 2;
	}
	nodes = strtoull(argv[2], NULL, 0);
	adds = strtoull(argv[3], NULL, 0);
	locks = strtoull(argv[4], NULL, 0);
	fd = open(argv[1], O_RDWR);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	s = mmap(NULL, MAP_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (s == MAP_FAILED) {
		perror("mmap");
		return 1;
	}

	/* Start together, so that the runs overlap. */
	__atomic_fetch_add(&s->arrived, 1, __ATOMIC_SEQ_CST);
	t0 = now();
	while (__atomic_load_n(&s->arrived, __ATOMIC_ACQUIRE) < nodes) {
		if (now() - t0 > WAIT_S) {
			fprintf(stderr, "only %" PRIu64 " of %" PRIu64 " arrived\n",
				s->arrived, nodes);
			return 3;
		}
	}

	/*
	 * One lock round after every ADDS / LOCKS adds, so both kinds overlap
	 * the other nodes' for the whole run.
	 */
	every = locks ? adds / locks : 0;
	t0 = now();
	for (i = 0; i < adds; i++) {
		__atomic_fetch_add(&s->counter, 1, __ATOMIC_SEQ_CST);
		if (every && i % every == 0 && done < locks) {
			if (lock_round(s))
				return 4;
			done++;
		}
	}
	while (done < locks) {
		if (lock_round(s))
			return 4;
		done++;
	}
	t1 = now();
	__atomic_fetch_add(&s->left, 1, __ATOMIC_SEQ_CST);
	printf("{\"seconds\": %.3f}\n", t1 - t0);
	return 0;
}
