"""A seeded, model-based fuzzer of the emulated obmm, run inside a node (``python3 -m obmm.fuzz``).

* :mod:`obmm.fuzz.ops`: the operations.  A run of ``--ops N`` with ``--seed S`` is the list
  ``generate(S, N)``, drawn before anything runs: an operation is its kind and a few random
  64-bit words, interpreted against the live state only when it runs.  So any subset of the
  list is a valid run too, and ``--only 3,17,42`` replays exactly those.
* :mod:`obmm.fuzz.engine`: runs operations against the driver and a model of it; after every
  step it checks the errno against the ones the model allows and the state against the model
  (regions, shmdev nodes, sysfs, pool ``used``, ``/proc/iomem``, revoked imports, the module's
  refcount, the process's mappings, data through the mappings) and the kernel log.
* :mod:`obmm.fuzz.shrink`: delta debugging of a failing list to a minimal one that fails the
  same way.
* :mod:`obmm.fuzz.race`: the concurrent mode (threads and processes racing the lifetimes).
* :mod:`obmm.fuzz.faults`: failslab / fail_page_alloc when the kernel has them.

The fuzzer uses the standard library and the package's own cffi bindings only, so it runs on a
guest with nothing installed beyond what the testbed's image has.
"""
