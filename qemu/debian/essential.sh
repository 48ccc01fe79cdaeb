#!/bin/sh
# Runs after the essential packages, before the kernel is installed: so the initramfs the
# kernel's postinst builds holds only what a virtio guest needs (MODULES=most would probe the
# build host and make a large initrd that costs seconds to unpack under TCG).
set -eu
root="$1"
mkdir -p "$root/etc/initramfs-tools/conf.d"
printf 'MODULES=list\nCOMPRESS=gzip\n' > "$root/etc/initramfs-tools/conf.d/obmm-testbed.conf"
printf 'virtio_pci\nvirtio_blk\nvirtio_net\next4\n' >> "$root/etc/initramfs-tools/modules"
