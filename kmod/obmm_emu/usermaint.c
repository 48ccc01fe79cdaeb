// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu, arm64, strict coherence: a program's own cache maintenance
 * counts as maintenance (docs/coherence.md).
 *
 * Code written for UB hosts cleans and invalidates lines itself at EL0 (DC
 * CIVAC around a hand-over, DC CVAC before a flag).  The strict model's
 * caches are shadow pages the CPU knows nothing of, so those instructions
 * would change nothing here.  With SCTLR_EL1.UCI clear, EL0 DC CVAU, CVAC,
 * CVAP, CVADP, CIVAC and IC IVAU trap to the kernel, which executes them
 * for the task (arch/arm64/kernel/traps.c:user_cache_maint_handler, the
 * path of the ARM64_WORKAROUND_CLEAN_CACHE errata).  A kprobe there sees
 * each one; the model's maintenance of that line runs before the task
 * returns to EL0 (a task_work: it may sleep, the probe may not).
 *
 * Only while the module is loaded with coherence=strict.  A CPU brought
 * online later keeps UCI set: its DCs are not seen.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/kprobes.h>
#include <linux/percpu.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/smp.h>
#include <linux/task_work.h>
#include <linux/wait_bit.h>
#include <asm/esr.h>
#include <asm/ptrace.h>
#include <asm/sysreg.h>

#include "cache.h"
#include "shmdev.h"
#include "usermaint.h"

struct obmm_user_dc {
	struct callback_head work;
	unsigned long addr;
	bool inval;
};

/* task_works queued and not yet run: the module waits for them at exit */
static atomic_t obmm_user_dc_pending = ATOMIC_INIT(0);
/* CPUs where this module cleared UCI, and so sets it again at exit */
static DEFINE_PER_CPU(bool, obmm_uci_cleared);
static bool obmm_usermaint_on;

static void obmm_user_dc_run(struct callback_head *head)
{
	struct obmm_user_dc *dc = container_of(head, struct obmm_user_dc, work);

	obmm_shmdev_user_maint(dc->addr, dc->inval);
	obmm_cache_dc_end();
	kfree(dc);
	if (atomic_dec_and_test(&obmm_user_dc_pending))
		wake_up_var(&obmm_user_dc_pending);
}

/* user_cache_maint_handler(unsigned long esr, struct pt_regs *regs) */
static int obmm_user_dc_seen(struct kprobe *kp, struct pt_regs *kregs)
{
	unsigned long esr = kregs->regs[0];
	struct pt_regs *regs = (struct pt_regs *)kregs->regs[1];
	unsigned int crm = (esr & ESR_ELx_SYS64_ISS_CRM_MASK) >>
			   ESR_ELx_SYS64_ISS_CRM_SHIFT;
	struct obmm_user_dc *dc;
	unsigned long addr;

	if (crm == ESR_ELx_SYS64_ISS_CRM_IC_IVAU || !current->mm)
		return 0;
	dc = kmalloc(sizeof(*dc), GFP_ATOMIC);
	if (!dc)
		return 0;
	addr = untagged_addr(pt_regs_read_reg(regs, ESR_ELx_SYS64_ISS_RT(esr)));
	dc->addr = addr;
	dc->inval = crm == ESR_ELx_SYS64_ISS_CRM_DC_CIVAC;
	init_task_work(&dc->work, obmm_user_dc_run);
	atomic_inc(&obmm_user_dc_pending);
	if (task_work_add(current, &dc->work, TWA_RESUME)) {
		atomic_dec(&obmm_user_dc_pending);
		kfree(dc);
		return 0;
	}
	/* The kernel's DC may fault the page in: no use of the line. */
	obmm_cache_dc_begin(addr);
	return 0;
}

static struct kprobe obmm_user_dc_probe = {
	.symbol_name = "user_cache_maint_handler",
	.pre_handler = obmm_user_dc_seen,
};

static void obmm_uci_clear(void *unused)
{
	bool set = read_sysreg(sctlr_el1) & SCTLR_EL1_UCI;

	if (set)
		sysreg_clear_set(sctlr_el1, SCTLR_EL1_UCI, 0);
	this_cpu_write(obmm_uci_cleared, set);
}

static void obmm_uci_restore(void *unused)
{
	if (this_cpu_read(obmm_uci_cleared))
		sysreg_clear_set(sctlr_el1, 0, SCTLR_EL1_UCI);
	this_cpu_write(obmm_uci_cleared, false);
}

int obmm_usermaint_init(void)
{
	int ret;

	if (!obmm_cache_strict())
		return 0;
	ret = register_kprobe(&obmm_user_dc_probe);
	if (ret) {
		pr_err("emulator: coherence=strict: cannot see user cache maintenance (kprobe on user_cache_maint_handler: %d)\n",
		       ret);
		return ret;
	}
	on_each_cpu(obmm_uci_clear, NULL, 1);
	obmm_usermaint_on = true;
	pr_info("coherence: user cache maintenance (DC CVAC, CVAP, CVADP, CVAU, CIVAC at EL0) counts\n");
	return 0;
}

void obmm_usermaint_exit(void)
{
	if (!obmm_usermaint_on)
		return;
	on_each_cpu(obmm_uci_restore, NULL, 1);
	unregister_kprobe(&obmm_user_dc_probe);
	/* A task between its DC and its return to EL0 still runs ours. */
	wait_var_event(&obmm_user_dc_pending,
		       !atomic_read(&obmm_user_dc_pending));
	obmm_usermaint_on = false;
}
