"""The settings every client from outside a site uses for Kafka's EXTERNAL listener."""
from __future__ import annotations

from services.common import kafka_auth


def test_sasl_ssl_config_logs_in_with_scram_and_verifies_the_broker():
    config = kafka_auth.sasl_ssl_config("operator", "pw", "/run/secrets/kafka_ca.pem")
    assert config == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                      "sasl.username": "operator", "sasl.password": "pw",
                      "ssl.ca.location": "/run/secrets/kafka_ca.pem",
                      "ssl.endpoint.identification.algorithm": "https"}
