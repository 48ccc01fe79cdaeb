/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers shared by the C tests: emulator fabric facts read from
 * /sys/kernel/obmm_emu (the only emulator-specific part: on real UB
 * hardware the decoder address comes from management software).
 */
#ifndef OBMM_TEST_UTIL_H
#define OBMM_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OBMM_EMU_SYSFS "/sys/kernel/obmm_emu"
#define OBMM_SZ_2M (2UL << 20)

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

static inline unsigned long long obmm_window_base(int node)
{
	char path[128];

	snprintf(path, sizeof(path), OBMM_EMU_SYSFS "/windows/%d/base", node);
	return obmm_read_sysfs_ull(path);
}

static inline unsigned long long obmm_window_size(int node)
{
	char path[128];

	snprintf(path, sizeof(path), OBMM_EMU_SYSFS "/windows/%d/size", node);
	return obmm_read_sysfs_ull(path);
}

static inline int obmm_node_id(void)
{
	return (int)obmm_read_sysfs_ull(OBMM_EMU_SYSFS "/node_id");
}

static inline unsigned int obmm_cna(void)
{
	return (unsigned int)obmm_read_sysfs_ull(OBMM_EMU_SYSFS "/cna");
}

#endif /* OBMM_TEST_UTIL_H */
