# SPDX-License-Identifier: GPL-2.0
# What the kernel being built against has, as -D flags in ub_compat_features:
# by version where an interface changed shape, by its headers where one
# appeared (distributions backport).  Included by this module's Kbuild and
# by upstream.mk, so both builds see the same.
ub_compat_kver := $(shell echo $$(($(VERSION) * 1000 + $(PATCHLEVEL))))
ub_compat_since = $(shell [ $(ub_compat_kver) -ge $(1) ] && echo y)
ub_compat_kernel_has = $(shell grep -qs '$(1)' $(srctree)/$(2) && echo y)

ub_compat_features :=
# 6.3: vm_flags_set/clear(); split_vma() takes a VMA iterator
ifeq ($(call ub_compat_since,6003),y)
ub_compat_features += -DUB_COMPAT_HAVE_VM_FLAGS_SET -DUB_COMPAT_HAVE_SPLIT_VMA_VMI
endif
# 6.4: DEFINE_SEMAPHORE(name, count)
ifeq ($(call ub_compat_since,6004),y)
ub_compat_features += -DUB_COMPAT_HAVE_SEMAPHORE_COUNT
endif
# 6.5: pin_user_pages_remote() without vmas; pte_offset_map_lock() out of line
ifeq ($(call ub_compat_since,6005),y)
ub_compat_features += -DUB_COMPAT_HAVE_PIN_REMOTE_NO_VMAS -DUB_COMPAT_HAVE_PTE_MAP_OUT_OF_LINE
endif
# x86 pmd_mkspecial() (huge PFN maps, 6.12)
ifeq ($(call ub_compat_kernel_has,pmd_mkspecial,arch/x86/include/asm/pgtable.h),y)
ub_compat_features += -DUB_COMPAT_HAVE_X86_PMD_MKSPECIAL
endif
# mainline's GHES report chain (OLK had its own first)
ifeq ($(call ub_compat_kernel_has,ghes_register_report_chain,include/acpi/ghes.h),y)
ub_compat_features += -DUB_COMPAT_KERNEL_HAS_GHES_REPORT_CHAIN
endif
