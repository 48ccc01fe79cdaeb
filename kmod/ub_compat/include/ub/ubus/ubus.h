/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ub_compat: the UB bus's feature bits (OLK include/ub/ubus/ubus.h).
 * Implemented in bus.c.
 */
#ifndef UB_COMPAT_UB_UBUS_UBUS_H
#define UB_COMPAT_UB_UBUS_UBUS_H

#include <linux/bits.h>

#define UB_MEM_BORROW_NC	BIT(0)
#define UB_MEM_BORROW_CC	BIT(1)
#define UB_MEM_SHARE_NC		BIT(2)
#define UB_MEM_SHARE_CC		BIT(3)

unsigned long long ub_feature_get(void);

#endif /* UB_COMPAT_UB_UBUS_UBUS_H */
