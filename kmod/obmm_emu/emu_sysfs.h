/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what emu_sysfs.c offers core.c: /sys/kernel/obmm_emu/.
 */
#ifndef OBMM_EMU_EMU_SYSFS_H
#define OBMM_EMU_EMU_SYSFS_H

int obmm_sysfs_init(void);
void obmm_sysfs_exit(void);

#endif /* OBMM_EMU_EMU_SYSFS_H */
