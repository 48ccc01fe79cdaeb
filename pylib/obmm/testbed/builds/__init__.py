"""Build artefacts: kernel headers and modules, guest images and their kernel providers, initramfs,
the debug kernel, KUnit and URMA builds.  Kept free of imports (the package is copied into
guests)."""
