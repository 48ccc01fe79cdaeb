#!/bin/sh
# Runs last, with the complete root file system in $1.  Inputs from the builder (environment):
#   OBMM_AUTHORIZED_KEY  public key allowed to log in as root
set -eu
root="$1"
here=$(dirname "$0")

# The fast-boot init (tini runs it as PID 1's child); see obmm-init and docs/testbed.md.
install -m 0755 "$here/obmm-init" "$root/usr/local/sbin/obmm-init"

# Root login by the cache's key only.
install -d -m 700 "$root/root/.ssh"
printf '%s\n' "$OBMM_AUTHORIZED_KEY" > "$root/root/.ssh/authorized_keys"
chmod 600 "$root/root/.ssh/authorized_keys"
cat > "$root/etc/ssh/sshd_config.d/obmm-testbed.conf" <<'CONF'
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
CONF

echo obmm > "$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 obmm\n' > "$root/etc/hosts"
printf '/dev/vda / ext4 rw,errors=remount-ro 0 0\n' > "$root/etc/fstab"
# Root has no password: the serial console is for reading (it is a log file on the host),
# and an empty password lets a hand-attached console log in when debugging.
chroot "$root" passwd -d root >/dev/null

# DHCP on the user-mode NIC with networkd; waiting for "online" only delays boot.
mkdir -p "$root/etc/systemd/network"
cat > "$root/etc/systemd/network/20-eth0.network" <<'CONF'
[Match]
Name=eth0

[Network]
DHCP=ipv4
LinkLocalAddressing=no
IPv6AcceptRA=no
CONF
chroot "$root" systemctl enable systemd-networkd.service >/dev/null 2>&1
for unit in systemd-networkd-wait-online.service apt-daily.timer apt-daily-upgrade.timer \
            e2scrub_all.timer e2scrub_reap.service fstrim.timer dpkg-db-backup.timer \
            man-db.timer getty@tty1.service systemd-timesyncd.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
done

# Drivers for hardware a test node never uses (q35's AHCI, KVM-in-guest, wireless): each costs
# seconds of udev time under TCG.
cat > "$root/etc/modprobe.d/obmm-testbed.conf" <<'CONF'
blacklist ahci
blacklist libahci
blacklist kvm
blacklist kvm_amd
blacklist kvm_intel
blacklist cfg80211
blacklist powernow_k8
blacklist pcspkr
blacklist joydev
blacklist evdev
blacklist serio_raw
CONF

# Kernel messages on the console as they happen (the host reads the console file).
mkdir -p "$root/etc/sysctl.d"
echo 'kernel.printk = 7 4 1 7' > "$root/etc/sysctl.d/10-obmm-console.conf"
# journald in RAM: the disk is a throwaway overlay anyway.
mkdir -p "$root/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\n' > "$root/etc/systemd/journald.conf.d/obmm-testbed.conf"

# The module index knows obmm/obmm.ko and obmm/obmm_testhook.ko, where the testbed installs
# its modules as on a UB host (obmm.testbed.provision), so modprobe finds them without the
# depmod that reading every module of the tree costs at each provisioning (about 25 s under
# TCG).  Empty stand-ins are indexed (depmod says it cannot read their symbols) and removed.
for kdir in "$root"/lib/modules/*/; do
    [ -d "$kdir/kernel" ] || continue
    mkdir -p "$kdir/obmm"
    : > "$kdir/obmm/obmm.ko"
    : > "$kdir/obmm/obmm_testhook.ko"
    chroot "$root" depmod "$(basename "$kdir")" 2>/dev/null
    rm -f "$kdir/obmm/obmm.ko" "$kdir/obmm/obmm_testhook.ko"
done

mkdir -p "$root/opt/obmm-testbed"
rm -f "$root/etc/machine-id" && : > "$root/etc/machine-id"
