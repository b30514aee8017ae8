"""The TLS context of a CQL client (the adapter, iot-site-data): CQL over TLS, each node's certificate
checked against the site's Cassandra CA (the pki role's tasks/cassandra.yml), which issues only that
site's Cassandra nodes' certificates.

The driver connects to the addresses the nodes gossip (container addresses that change with every task),
not to the names in their certificates, so the name is not checked: the chain to that CA is the proof
that a peer is one of the site's nodes. Tests: tests/integration/test_cassandra_image.py (TLS cases).
"""
from __future__ import annotations

import ssl


def cql_tls_context(ca_file: str = "", ca_pem: str = "") -> ssl.SSLContext | None:
    """A client context trusting only the CA in `ca_file` (a path) or `ca_pem` (its text), or None (CQL in
    clear) when both are empty."""
    if not (ca_file or ca_pem):
        return None
    context = ssl.create_default_context(cafile=ca_file or None, cadata=ca_pem or None)  # TLS 1.2+, CERT_REQUIRED
    context.check_hostname = False
    return context
