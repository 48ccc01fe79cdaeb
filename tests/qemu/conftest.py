"""Host-side suite that brings a QEMU node up and runs the guest tests in it (``make qemu-test``).

The plugin (pylib/obmm/testbed/suite/pytest_qemu.py) collects ``*.guestsuite`` files into one host
item per guest test.  The hardware stage loads the same plugin with ``-p`` and runs the same
``guest.guestsuite`` on a UB host (pytest registers the plugin once either way).
"""

pytest_plugins = ["obmm.testbed.suite.pytest_qemu"]
