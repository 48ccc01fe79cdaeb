/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what ubc.c offers the files above it: the emulated UB
 * controllers and bus.
 */
#ifndef OBMM_EMU_UBC_H
#define OBMM_EMU_UBC_H

#include "obmm_emu.h"

int obmm_ubc_init(void);
void obmm_ubc_exit(void);
bool obmm_ubc_known_cna(u32 cna);
u64 obmm_ubc_feature(void);

#endif /* OBMM_EMU_UBC_H */
