# SPDX-License-Identifier: GPL-2.0
# How a UB driver directory of an upstream tree (drivers/ub/obmm) is built
# out of tree over this compat layer.  obmm.testbed.builds.kbuild writes, into a
# copy of that directory, a Kbuild of two lines: `include` of this file,
# then `include $(src)/Makefile` (the upstream object list), and runs
#   make -C KDIR M=COPY CONFIG_OBMM=m UB_COMPAT_DIR=... UB_UPSTREAM_DIR=...
#        KBUILD_EXTRA_SYMBOLS=<ub_compat's Module.symvers> modules
include $(UB_COMPAT_DIR)/features.mk

# ub_compat.h first in every file; our include/ stands in for OLK headers;
# the upstream tree's include/ for its own (uapi/ub/obmm.h, ub/ubus/...);
# the UB bus is there (its header then declares what bus.c exports).
ccflags-y += -include $(UB_COMPAT_DIR)/include/ub_compat.h \
	     -I$(UB_COMPAT_DIR)/include -I$(UB_UPSTREAM_DIR)/include \
	     -DCONFIG_UB_UBUS=1 $(ub_compat_features)
