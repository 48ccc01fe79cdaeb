"""Benchmarks: control-path ioctl latency, data-path load latency and bandwidth, the Engram
prefetch workload, and testbed speed, each measured beside its baseline in the same run.

Modules: `memprobe.c` (the C probe, built on the node), `probe` (build / run / parse it),
`controlpath` (ioctl timing, runs on a node), `regions` (region set-up helper run on a node),
`scheme7` (the seed's client benchmark over the Python API, runs on a node), `results` (the
result model, results.json and summary.md), `plots` (PNG plots), `runner` (drives the nodes
through run/copy callables), `cluster_hook` (QEMU clusters or hardware hosts for the runner),
`compare` (two result folders side by side) and `cli` (`obmm-testbed bench`).  Only `plots`
needs matplotlib.
"""
