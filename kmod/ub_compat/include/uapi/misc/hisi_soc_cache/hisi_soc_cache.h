/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ub_compat: the HiSilicon SoC cache maintenance operations the OBMM
 * driver requests (hisi_soc_cache_maintain(), implemented in mm.c).
 */
#ifndef UB_COMPAT_HISI_SOC_CACHE_H
#define UB_COMPAT_HISI_SOC_CACHE_H

enum hisi_soc_cache_maint_type {
	HISI_CACHE_MAINT_CLEANSHARED,
	HISI_CACHE_MAINT_CLEANINVALID,
	HISI_CACHE_MAINT_MAKEINVALID,
	HISI_CACHE_MAINT_MAX
};

#endif /* UB_COMPAT_HISI_SOC_CACHE_H */
