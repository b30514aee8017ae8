"""When the certificates a site serves and trusts expire, as Prometheus rules the stack role renders.

Nothing on a node exports a certificate's end date, but the controller holds every certificate it hands a
site (the pki role's secrets: the CAs, each broker's keystore, Mosquitto's, Prometheus', the relay's). So
the stack role renders one recording rule per certificate, `iot_certificate_not_after_timestamp_seconds`
(a constant: its notAfter), into the site's Prometheus, and the alert rules of monitoring/rules compare it
with time(). A certificate re-issued by a run changes the rule, so the figure follows what is deployed.
"""
from __future__ import annotations

import hashlib
import re

import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from deploy.errors import fail

METRIC = "iot_certificate_not_after_timestamp_seconds"
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----")


def _name(cert: x509.Certificate) -> str:
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(common[0].value) if common else cert.subject.rfc4514_string()


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def certificate_expiries(secrets: dict) -> list[dict]:
    """Every certificate in the values of `secrets` (PEM text: a certificate, a chain, or a keystore of a key
    and its chain), once each: [{certificate: its common name, kind: ca|leaf, secret: the first secret that
    holds it, not_after: epoch seconds}], soonest first. Private keys and other values are skipped unread."""
    found: dict[str, dict] = {}
    for secret in sorted(secrets):
        for pem in _PEM.findall(str(secrets[secret])):
            try:
                cert = x509.load_pem_x509_certificate(pem.encode())
            except ValueError as err:
                fail(f"certificates: secret {secret} holds a certificate that does not parse ({err}); "
                     "remove it from the pki directory and rerun, the pki role makes a new one")
            fingerprint = hashlib.sha256(pem.encode()).hexdigest()
            found.setdefault(fingerprint, {"certificate": _name(cert), "kind": "ca" if _is_ca(cert) else "leaf",
                                           "secret": str(secret),
                                           "not_after": int(cert.not_valid_after_utc.timestamp())})
    return sorted(found.values(), key=lambda c: (c["not_after"], c["certificate"]))


def certificate_rules(secrets: dict, site: str) -> str:
    """The Prometheus rule file (YAML) of the site's certificates: one `iot_certificate_not_after_timestamp_
    seconds` series per certificate, labelled with its name, kind (ca or leaf), secret and the site. Every value
    is made a plain str: Ansible hands its filters str subclasses (tagged strings) that yaml cannot write."""
    rules = [{"record": METRIC, "expr": f"vector({c['not_after']})",
              "labels": {"certificate": str(c["certificate"]), "kind": c["kind"], "secret": str(c["secret"]),
                         "site": str(site)}}
             for c in certificate_expiries(secrets)]
    header = ("# Rendered by the stack role (deploy/certificates.py): when each certificate the site serves or\n"
              "# trusts expires. CertificateExpiresSoon (monitoring/rules/iot-stack.yml) reads it.\n")
    return header + yaml.safe_dump({"groups": [{"name": "certificate-dates", "rules": rules}]}, sort_keys=False)


FILTERS = {f.__name__: f for f in (certificate_expiries, certificate_rules)}
