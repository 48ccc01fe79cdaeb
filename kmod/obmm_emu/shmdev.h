/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what shmdev.c offers the files above it: /dev/obmm_shmdev<id>:
 * open, mmap, UPDATE_RANGE.
 */
#ifndef OBMM_EMU_SHMDEV_H
#define OBMM_EMU_SHMDEV_H

#include "obmm_emu.h"

int obmm_shmdev_init(void);
void obmm_shmdev_exit(void);
int obmm_shmdev_publish(struct obmm_region *r);
void obmm_shmdev_unpublish(struct obmm_region *r);
struct device *obmm_shmdev_root(void);
void obmm_shmdev_revoke(struct obmm_region *r);
bool obmm_shmdev_revoked(struct obmm_region *r);
void obmm_shmdev_user_maint(unsigned long addr, bool inval);

#endif /* OBMM_EMU_SHMDEV_H */
