"""Stages with several steps: the build matrix, patch check, KUnit, fuzz-diff, real-vs-emu report.
Kept free of imports."""
