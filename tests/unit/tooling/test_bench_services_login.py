"""The benchmarks' TLS runs (`scripts/bench bridge`, `scripts/bench adapter --tls-cost`) log a service in to
SERVICES through the deployed settings path: while login_environment holds services_login's variables,
kafka_auth.internal_config gives SCRAM inside TLS with the brokers CA; afterwards the process's own
environment is back as it was, so the clear runs that follow log in to nothing."""
from __future__ import annotations

import os

from services.common import kafka_auth
from tooling.testbed.kafka_cluster import KafkaCluster, login_environment, services_login


def test_a_service_built_inside_logs_in_over_tls_and_the_environment_is_restored_after(tmp_path, monkeypatch):
    (tmp_path / "brokers-ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    cluster = KafkaCluster("zk", "kafka", "kafka:9092", "127.0.0.1:1", str(tmp_path / "ca.crt"),
                           ("operator", "op-pw"), ("admin", "a"), str(tmp_path), "127.0.0.1:2")
    monkeypatch.setenv(kafka_auth.USERNAME_ENV, "someone-else")
    monkeypatch.delenv(kafka_auth.CA_FILE.env, raising=False)

    with login_environment(services_login(cluster)):
        config = kafka_auth.internal_config()
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.username"] == "operator" and config["sasl.password"] == "op-pw"
    assert config["ssl.ca.location"] == str(tmp_path / "brokers-ca.crt")

    assert os.environ[kafka_auth.USERNAME_ENV] == "someone-else"
    assert kafka_auth.CA_FILE.env not in os.environ
    with login_environment({}):
        assert kafka_auth.internal_config() == {}
