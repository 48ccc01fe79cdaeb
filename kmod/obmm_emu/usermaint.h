/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what usermaint.c offers core.c: on arm64 under strict
 * coherence, a program's own DC instructions count as cache maintenance.
 */
#ifndef OBMM_EMU_USERMAINT_H
#define OBMM_EMU_USERMAINT_H

#ifdef CONFIG_ARM64
int obmm_usermaint_init(void);
void obmm_usermaint_exit(void);
#else
static inline int obmm_usermaint_init(void)
{
	return 0;
}

static inline void obmm_usermaint_exit(void)
{
}
#endif

#endif /* OBMM_EMU_USERMAINT_H */
