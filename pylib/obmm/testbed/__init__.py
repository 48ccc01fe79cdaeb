"""QEMU testbed: guest images, cluster life cycle, SSH, and the guest test runner.

Kept free of imports: the package is copied into guests, which lack paramiko.
"""
