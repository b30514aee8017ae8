"""How a client reaches a site's Kafka EXTERNAL listener (host port 9094): SASL_SSL with a SCRAM-SHA-512
login, the broker's certificate checked against the deployment's CA and its name against the address
dialled. One place for every confluent-kafka client that connects from outside a site (operators'
tools, the registrar, the lab); services on a site's overlay use INTERNAL and need none of it."""
from __future__ import annotations

MECHANISM = "SCRAM-SHA-512"


def sasl_ssl_config(username: str, password: str, ca_file: str) -> dict[str, str]:
    """librdkafka settings for a login to a site's EXTERNAL listener."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "sasl.username": username,
        "sasl.password": password,
        "ssl.ca.location": ca_file,
        # Also librdkafka's default since 2.0; stated, as it is what makes the certificate's name count.
        "ssl.endpoint.identification.algorithm": "https",
    }
