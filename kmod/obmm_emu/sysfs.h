/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what sysfs.c offers the files above it: the attribute groups
 * of a region's device.
 */
#ifndef OBMM_EMU_SYSFS_H
#define OBMM_EMU_SYSFS_H

#include "obmm_emu.h"

extern const struct attribute_group *obmm_export_groups[];
extern const struct attribute_group *obmm_import_groups[];

#endif /* OBMM_EMU_SYSFS_H */
