#!/bin/sh
# openEuler root file system finishing, run on the host after `dnf --installroot`.
# Inputs (environment): OBMM_AUTHORIZED_KEY, OBMM_KERNEL_RELEASE.
set -eu
root="$1"
rel="$OBMM_KERNEL_RELEASE"

install -d -m 700 "$root/root/.ssh"
printf '%s\n' "$OBMM_AUTHORIZED_KEY" > "$root/root/.ssh/authorized_keys"
chmod 600 "$root/root/.ssh/authorized_keys"
mkdir -p "$root/etc/ssh/sshd_config.d"
cat > "$root/etc/ssh/sshd_config.d/obmm-testbed.conf" <<'CONF'
PermitRootLogin prohibit-password
PasswordAuthentication no
UseDNS no
CONF
# openEuler's sshd_config may predate the Include line.
grep -q '^Include /etc/ssh/sshd_config.d' "$root/etc/ssh/sshd_config" ||
    sed -i '1i Include /etc/ssh/sshd_config.d/*.conf' "$root/etc/ssh/sshd_config"

echo obmm > "$root/etc/hostname"
printf '/dev/vda / ext4 rw 0 0\n' > "$root/etc/fstab"
chroot "$root" passwd -d root >/dev/null
# Host keys now, so the host can pin them (as the Debian recipe gets from openssh's postinst).
chroot "$root" ssh-keygen -A
chroot "$root" systemctl enable sshd.service NetworkManager.service >/dev/null 2>&1 || true
# The image is ext4 on virtio-blk without SELinux labels.
[ -f "$root/etc/selinux/config" ] && sed -i 's/^SELINUX=.*/SELINUX=disabled/' "$root/etc/selinux/config"
# An initramfs that only has to find a virtio disk (not host-only: it is built in a chroot).
chroot "$root" dracut -f --no-hostonly --add-drivers "virtio_pci virtio_blk virtio_net ext4" \
    "/boot/initramfs-$rel.img" "$rel"
mkdir -p "$root/opt/obmm-testbed"
: > "$root/etc/machine-id"
