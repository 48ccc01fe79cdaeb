"""A UBSE of ours: the shared-memory part of UB Service Engine, on the testbed's fabric.

On a UB host the ubs-mem daemon (ubsmd) loads UBSE's client library (``libubse-client.so.1``)
and asks the UBSE daemon to export memory on a lender node, program the importer's decoder and
import it there.  This package is the daemon side of ours; ``ubse/`` at the repository root is
the client library (C, its own header), which talks to :mod:`obmm.ubse.service` over a Unix
socket on each node.

* :mod:`obmm.ubse.codes`     UBSE's return codes (numbers from its public client header)
* :mod:`obmm.ubse.rules`     the checks the client and daemon make, block rounding, the config
* :mod:`obmm.ubse.registry`  the cluster's registry (nodes, shared memory, owners), kept by the
                             master node, which drives the nodes' agents
* :mod:`obmm.ubse.agent`     what a node does for the master: OBMM export, decoder + import
* :mod:`obmm.ubse.wire`      the two protocols: text lines to the C client, framed JSON between
                             nodes
* :mod:`obmm.ubse.service`   one node's service: the Unix socket, the TCP port, forwarding

``python -m obmm.ubse serve`` runs a node's service; docs/ubs-mem.md says what is UBSE's and
what is ours.
"""
