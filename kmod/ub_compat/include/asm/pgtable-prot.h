/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ub_compat: arm64's asm/pgtable-prot.h has no x86 counterpart; the PTE
 * bits the driver uses are defined in ub_compat.h.
 */
#ifndef UB_COMPAT_ASM_PGTABLE_PROT_H
#define UB_COMPAT_ASM_PGTABLE_PROT_H

#include <asm/pgtable_types.h>

#endif /* UB_COMPAT_ASM_PGTABLE_PROT_H */
