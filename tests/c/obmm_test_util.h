/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers shared by the C tests: testbed fabric facts read from
 * /sys/kernel/obmm_emu, or /sys/kernel/ub_compat under the real obmm.ko (the
 * only testbed-specific part: on real UB hardware the decoder address comes
 * from management software).
 */
#ifndef OBMM_TEST_UTIL_H
#define OBMM_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OBMM_EMU_SYSFS "/sys/kernel/obmm_emu"
#define OBMM_COMPAT_SYSFS "/sys/kernel/ub_compat"
#define OBMM_SZ_2M (2UL << 20)

/* The emulator's fabric files, or the real driver's compat layer's. */
static inline const char *obmm_fabric_sysfs(void)
{
	if (access(OBMM_EMU_SYSFS, F_OK) && !access(OBMM_COMPAT_SYSFS, F_OK))
		return OBMM_COMPAT_SYSFS;
	return OBMM_EMU_SYSFS;
}

static inline unsigned long long obmm_read_sysfs_ull(const char *path)
{
	unsigned long long v = 0;
	FILE *f = fopen(path, "r");

	if (!f) {
		perror(path);
		exit(2);
	}
	if (fscanf(f, "%lli", &v) != 1) {
		fprintf(stderr, "%s: unreadable\n", path);
		exit(2);
	}
	fclose(f);
	return v;
}

static inline unsigned long long obmm_fabric_ull(const char *name)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/%s", obmm_fabric_sysfs(), name);
	return obmm_read_sysfs_ull(path);
}

static inline unsigned long long obmm_window_base(int node)
{
	char name[64];

	snprintf(name, sizeof(name), "windows/%d/base", node);
	return obmm_fabric_ull(name);
}

/*
 * Where this node reaches node @node's physical address @pa: its window's
 * base + @pa past that node's RAM base (windows/<node>/remote_base: 0 on
 * x86, 1 GiB on arm64's virt machine; absent in older modules).
 */
static inline unsigned long long obmm_window_addr(int node, unsigned long long pa)
{
	char name[64], path[160];
	unsigned long long rbase = 0;

	snprintf(name, sizeof(name), "windows/%d/remote_base", node);
	snprintf(path, sizeof(path), "%s/%s", obmm_fabric_sysfs(), name);
	if (access(path, F_OK) == 0)
		rbase = obmm_read_sysfs_ull(path);
	return obmm_window_base(node) + pa - rbase;
}

static inline unsigned long long obmm_window_size(int node)
{
	char name[64];

	snprintf(name, sizeof(name), "windows/%d/size", node);
	return obmm_fabric_ull(name);
}

static inline int obmm_node_id(void)
{
	return (int)obmm_fabric_ull("node_id");
}

static inline unsigned int obmm_cna(void)
{
	return (unsigned int)obmm_fabric_ull("cna");
}

#endif /* OBMM_TEST_UTIL_H */
