"""Throw-away certificates for integration tests, shaped as the pki role makes them (ECDSA P-256, two days):
a CA, certificates it issues, and PKCS#8 keys as Kafka's and Cassandra's PEM keystores read them."""
from __future__ import annotations

import datetime as dt


def key_pem(key) -> bytes:
    """A private key as unencrypted PKCS#8 PEM."""
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def ca(name: str):
    """(key, certificate) of a new self-signed CA named `name`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def issue(ca, name: str, usage, sans=()):
    """(key, certificate) of `name` from `ca` (key, certificate), for `usage` (an ExtendedKeyUsageOID, or a
    tuple of them)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
               .add_extension(x509.ExtendedKeyUsage(list(usage) if isinstance(usage, tuple) else [usage]),
                              critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def metrics_pki(directory) -> dict[str, str]:
    """The site's metrics PKI as the pki role makes it (tasks/metrics.yml) and the stack mounts it, written
    under `directory` (a pathlib.Path): {"prometheus": a directory to mount at /run/secrets of the Prometheus
    container (metrics_ca.pem, scraper.pem, metrics_password: its login to the JMX exporters), "exporter":
    the same for an exporter (metrics_keystore.pem, scrapers_ca.pem, metrics_password), "password": the
    login's password}. Files 0644 in 0755 directories: the images run as the app user."""
    import secrets

    from cryptography.hazmat.primitives import serialization
    from cryptography.x509 import DNSName
    from cryptography.x509.oid import ExtendedKeyUsageOID

    def pem(cert) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    metrics_ca, scrapers_ca = ca("iot-stack metrics CA test"), ca("iot-stack scrapers CA test")
    usage = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
    exporter = issue(metrics_ca, "metrics-exporter", usage, sans=[DNSName("metrics-exporter")])
    scraper = issue(scrapers_ca, "scraper-prometheus", usage, sans=[DNSName("scraper-prometheus")])
    password = secrets.token_hex(20)
    files = {"prometheus": {"metrics_ca.pem": pem(metrics_ca[1]), "metrics_password": f"{password}\n".encode(),
                            "scraper.pem": key_pem(scraper[0]) + pem(scraper[1]) + pem(scrapers_ca[1])},
             "exporter": {"scrapers_ca.pem": pem(scrapers_ca[1]), "metrics_password": f"{password}\n".encode(),
                          "metrics_keystore.pem": key_pem(exporter[0]) + pem(exporter[1]) + pem(metrics_ca[1])}}
    dirs = {"password": password}
    for side, content in files.items():
        side_dir = directory / side
        side_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        side_dir.chmod(0o755)
        for name, data in content.items():
            (side_dir / name).write_bytes(data)
            (side_dir / name).chmod(0o644)
        dirs[side] = str(side_dir)
    return dirs
