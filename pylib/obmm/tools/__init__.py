"""Developer tooling: the `obmm-testbed` command line, kernel-log scanning, ELF pre-flight of
modules, the patch-series checks.  Not part of the runtime (``import obmm`` never loads it)."""
