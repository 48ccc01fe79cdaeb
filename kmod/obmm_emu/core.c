// SPDX-License-Identifier: GPL-2.0
/*
 * obmm_emu: /dev/obmm misc device, ioctl dispatch, module init and exit.
 *
 * Bring-up is here and only here, in order (each step unwound in reverse):
 * the emulated UMMU's ops, regions, /proc/obmm, the fabric (windows,
 * control region), this node's export pool, the node going online
 * (heartbeat), the revocation scan, the regions' pseudo filesystem, the
 * shmdev class, /sys/kernel/obmm_emu, the UB controller, /dev/obmm.
 *
 * It is also the composition root: the only file that calls every layer,
 * and wires a lower one to a higher one (obmm_access_register()) where the
 * lower must reach up; no other file calls into core.c.
 */
/*
 * The real driver's prefix (obmm_core.h): its init and exit lines, which
 * scripts grep for, read the same here.
 */
#define pr_fmt(fmt) "OBMM: " fmt

#include <linux/delay.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/moduleparam.h>

#include "access.h"
#include "cache.h"
#include "emu_sysfs.h"
#include "export.h"
#include "fabric.h"
#include "import.h"
#include "pool.h"
#include "region.h"
#include "shmdev.h"
#include "ubc.h"
#include "usermaint.h"

static long obmm_dev_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	void __user *uarg = (void __user *)arg;

	if (!obmm_fabric_enabled())
		return obmm_refuse("ioctl", -EOPNOTSUPP,
				   "obmm feature not enabled");

	switch (cmd) {
	case OBMM_CMD_EXPORT:
		return obmm_export_ioctl(uarg);
	case OBMM_CMD_IMPORT:
		return obmm_import_ioctl(uarg);
	case OBMM_CMD_UNEXPORT:
		return obmm_unexport_ioctl(uarg);
	case OBMM_CMD_UNIMPORT:
		return obmm_unimport_ioctl(uarg);
	case OBMM_CMD_ADDR_QUERY:
		return obmm_addr_query_ioctl(uarg);
	case OBMM_CMD_EXPORT_PID:
		return obmm_export_pid_ioctl(uarg);
	case OBMM_CMD_DECLARE_PREIMPORT:
		return obmm_declare_preimport_ioctl(uarg);
	case OBMM_CMD_UNDECLARE_PREIMPORT:
		return obmm_undeclare_preimport_ioctl(uarg);
	default:
		/* Not logged, as by the real driver: isatty() probes every fd. */
		return -ENOTTY;
	}
}

static int obmm_dev_open(struct inode *inode, struct file *file)
{
	return 0;
}

static int obmm_dev_flush(struct file *file, fl_owner_t id)
{
	return 0;
}

static const struct file_operations obmm_dev_fops = {
	.owner = THIS_MODULE,
	.open = obmm_dev_open,
	.flush = obmm_dev_flush,
	.unlocked_ioctl = obmm_dev_ioctl,
};

static struct miscdevice obmm_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "obmm",
	.fops = &obmm_dev_fops,
};

/*
 * The fabric, then this node's pool in its own window, then the node goes
 * online and the revocation scan starts.  Without a usable fabric there is
 * no pool and no scan, and every ioctl returns -EOPNOTSUPP.
 */
static int __init obmm_emu_fabric_up(void)
{
	const struct tb_fabric_window *own;
	int ret;

	ret = obmm_fabric_init();
	if (ret)
		return ret;
	own = obmm_fabric_own_window();
	if (!own)
		return 0;
	ret = obmm_pool_init(own->size, obmm_access_scan_ms());
	if (ret) {
		obmm_fabric_exit();
		return ret;
	}
	obmm_fabric_start(obmm_pool_base(), obmm_pool_size());
	obmm_access_start();
	obmm_pool_start();
	return 0;
}

static void obmm_emu_fabric_down(void)
{
	obmm_access_stop();
	obmm_fabric_stop();
	obmm_pool_exit();
	obmm_fabric_exit();
}

/* The emulated UMMU revokes imports and waits for borrows through these. */
static const struct obmm_access_ops obmm_emu_access_ops = {
	.revoke_scan = obmm_imports_revoke_scan,
	.own_borrow_held = obmm_imports_own_borrow_held,
};

static int __init obmm_emu_init(void)
{
	int ret;

	pr_info("obmm_module: init started\n");
	if (obmm_emu_node_id < 0 || obmm_emu_node_id >= OBMM_EMU_MAX_NODES) {
		pr_err("node_id %d out of range\n", obmm_emu_node_id);
		return -EINVAL;
	}
	ret = obmm_pool_parse_params();
	if (ret)
		return ret;

	obmm_access_register(&obmm_emu_access_ops);
	obmm_regions_init();
	ret = obmm_imports_init();
	if (ret)
		return ret;
	ret = obmm_emu_fabric_up();
	if (ret)
		goto err_imports;
	/* As obmm_core.c:ubmem_feature_probe(); the feature is the fabric's. */
	pr_info("ub_feature: %#llx, obmm_enabled: %ld\n", obmm_ubc_feature(),
		(long)obmm_fabric_enabled());
	ret = obmm_region_fs_init();
	if (ret)
		goto err_fabric;
	ret = obmm_shmdev_init();
	if (ret)
		goto err_region_fs;
	ret = obmm_sysfs_init();
	if (ret)
		goto err_shmdev;
	ret = obmm_ubc_init();
	if (ret)
		goto err_sysfs;
	ret = obmm_cache_init();
	if (ret)
		goto err_ubc;
	ret = obmm_usermaint_init();
	if (ret)
		goto err_cache;
	/* Last: no ioctl may arrive before init is complete. */
	ret = misc_register(&obmm_misc);
	if (ret)
		goto err_usermaint;

	pr_info("node %d ready (%s)\n", obmm_emu_node_id,
		obmm_fabric_enabled() ? "fabric present" :
		"no fabric: every ioctl returns EOPNOTSUPP");
	pr_info("obmm_module: init completed\n");
	return 0;

err_usermaint:
	obmm_usermaint_exit();
err_cache:
	obmm_cache_exit();
err_ubc:
	obmm_ubc_exit();
err_sysfs:
	obmm_sysfs_exit();
err_shmdev:
	obmm_shmdev_exit();
err_region_fs:
	obmm_region_fs_exit();
err_fabric:
	obmm_emu_fabric_down();
err_imports:
	obmm_imports_exit();
	return ret;
}

#ifdef OBMM_EMU_TEST
/*
 * Test only: module exit waits this long once the fabric is down, so that
 * a test can show no work of the module still runs against it then.
 */
static unsigned int test_exit_delay_ms;
module_param(test_exit_delay_ms, uint, 0600);
MODULE_PARM_DESC(test_exit_delay_ms,
		 "test only: module exit waits this long after the fabric is down (ms, at most 5000)");

static void obmm_emu_test_exit_delay(void)
{
	msleep(min_t(unsigned int, READ_ONCE(test_exit_delay_ms),
		     OBMM_TEST_DELAY_MAX_MS));
}
#else
static void obmm_emu_test_exit_delay(void)
{
}
#endif

static void __exit obmm_emu_exit(void)
{
	bool acked;

	pr_info("obmm_module: exit started\n");
	misc_deregister(&obmm_misc);
	obmm_usermaint_exit();
	obmm_ubc_exit();
	obmm_sysfs_exit();
	obmm_shmdev_exit();
	obmm_region_fs_exit();
	/*
	 * Before the fabric: the EXPORT_PID quarantine work reads the control
	 * region, and peers acknowledge through it.  Its pages are unpinned
	 * only once the node is OFFLINE, so no peer still reaches them.
	 */
	acked = obmm_exports_exit_wait();
	obmm_emu_fabric_down();
	obmm_emu_test_exit_delay();
	obmm_exports_exit(acked);
	obmm_imports_exit();
	obmm_regions_exit();
	obmm_cache_exit();
	pr_info("obmm_module: exit completed\n");
}

module_init(obmm_emu_init);
module_exit(obmm_emu_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Emulated OBMM (UB memory export/import) driver for obmm-testbed");
MODULE_AUTHOR("obmm-testbed");
