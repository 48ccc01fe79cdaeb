"""QEMU machines: command line, accelerator, ACPI tables, the fabric hub, snapshots, cluster
processes and who owns them, and the guest kernel watchers.  Kept free of imports (the package
is copied into guests)."""
