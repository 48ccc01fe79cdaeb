"""obmm-testbed: bindings, tools and testbed for openEuler's OBMM UAPI.

`import obmm` needs only cffi: the modules at this level (abi, api, errors, causes, handle,
exchange, decoder, identity) are what runs on guests and on real UB hosts.  The developer tooling
is `obmm.tools`, the QEMU testbed and hardware stage `obmm.testbed`, the benchmarks `obmm.bench`.
"""

from __future__ import annotations

from obmm.abi import (
    OBMM_EXPORT_FLAG_ALLOW_MMAP,
    OBMM_EXPORT_FLAG_FAST,
    OBMM_IMPORT_FLAG_ALLOW_MMAP,
    OBMM_IMPORT_FLAG_NUMA_REMOTE,
    OBMM_IMPORT_FLAG_PREIMPORT,
    OBMM_MMAP_FLAG_HUGETLB_PMD,
)
from obmm.api import PROT_NONE, PROT_READ, PROT_WRITE, Export, Import, Mapping, Obmm, ShmDev
from obmm.errors import ObmmError

__version__ = "0.1.0"

# Short names for the flags used most.
EXPORT_ALLOW_MMAP = OBMM_EXPORT_FLAG_ALLOW_MMAP
EXPORT_FAST = OBMM_EXPORT_FLAG_FAST
IMPORT_ALLOW_MMAP = OBMM_IMPORT_FLAG_ALLOW_MMAP
IMPORT_PREIMPORT = OBMM_IMPORT_FLAG_PREIMPORT
IMPORT_NUMA_REMOTE = OBMM_IMPORT_FLAG_NUMA_REMOTE

__all__ = [
    "EXPORT_ALLOW_MMAP",
    "EXPORT_FAST",
    "IMPORT_ALLOW_MMAP",
    "IMPORT_NUMA_REMOTE",
    "IMPORT_PREIMPORT",
    "OBMM_EXPORT_FLAG_ALLOW_MMAP",
    "OBMM_EXPORT_FLAG_FAST",
    "OBMM_IMPORT_FLAG_ALLOW_MMAP",
    "OBMM_IMPORT_FLAG_NUMA_REMOTE",
    "OBMM_IMPORT_FLAG_PREIMPORT",
    "OBMM_MMAP_FLAG_HUGETLB_PMD",
    "PROT_NONE",
    "PROT_READ",
    "PROT_WRITE",
    "Export",
    "Import",
    "Mapping",
    "Obmm",
    "ObmmError",
    "ShmDev",
]
