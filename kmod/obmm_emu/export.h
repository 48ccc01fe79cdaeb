/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what export.c offers the files above it: EXPORT, EXPORT_PID,
 * UNEXPORT.
 */
#ifndef OBMM_EMU_EXPORT_H
#define OBMM_EMU_EXPORT_H

#include "obmm_emu.h"

long obmm_export_ioctl(void __user *uarg);
long obmm_export_pid_ioctl(void __user *uarg);
long obmm_unexport_ioctl(void __user *uarg);
bool obmm_exports_exit_wait(void);
void obmm_exports_exit(bool acked);

#endif /* OBMM_EMU_EXPORT_H */
