/* SPDX-License-Identifier: GPL-2.0 */
/*
 * obmm_emu: what import.c offers the files above it: IMPORT, UNIMPORT,
 * (UN)DECLARE_PREIMPORT, the revocation of imports.
 */
#ifndef OBMM_EMU_IMPORT_H
#define OBMM_EMU_IMPORT_H

#include "obmm_emu.h"

long obmm_import_ioctl(void __user *uarg);
long obmm_unimport_ioctl(void __user *uarg);
long obmm_declare_preimport_ioctl(void __user *uarg);
long obmm_undeclare_preimport_ioctl(void __user *uarg);
int obmm_imports_init(void);
void obmm_imports_exit(void);
unsigned long obmm_imports_revoke_scan(void);
bool obmm_imports_own_borrow_held(u64 *start, u64 *end);
ssize_t obmm_imports_show_revoked(char *buf);

#endif /* OBMM_EMU_IMPORT_H */
