"""How clients log in to a site's Kafka: EXTERNAL from outside the site, INTERNAL as a service's own principal."""
from __future__ import annotations

import pytest

from services.common import kafka_auth
from services.common.settings import SettingsError
from spark.iot_jobs import runtime


def test_sasl_ssl_config_logs_in_with_scram_verifies_the_broker_and_shows_a_client_certificate():
    config = kafka_auth.sasl_ssl_config("operator", "pw", "/run/secrets/kafka_ca.pem",
                                        "/run/secrets/kafka_client.crt", "/run/secrets/kafka_client.key")
    assert config == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                      "sasl.username": "operator", "sasl.password": "pw",
                      "ssl.ca.location": "/run/secrets/kafka_ca.pem",
                      "ssl.endpoint.identification.algorithm": "https",
                      "ssl.certificate.location": "/run/secrets/kafka_client.crt",
                      "ssl.key.location": "/run/secrets/kafka_client.key"}


def test_a_service_logs_in_to_internal_as_its_own_principal_with_the_password_from_its_secret(tmp_path):
    (tmp_path / "kafka_password").write_text("s3cret-Pw-0123456789\n")
    environ = {"KAFKA_USERNAME": "bridge", "KAFKA_PASSWORD_FILE": str(tmp_path / "kafka_password")}
    assert kafka_auth.internal_config(environ) == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "bridge", "sasl.password": "s3cret-Pw-0123456789"}
    assert kafka_auth.java_internal_options(environ) == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="bridge" password="s3cret-Pw-0123456789";'}


def test_with_the_brokers_ca_the_login_goes_inside_tls_checking_the_brokers_name(tmp_path):
    """KAFKA_CA_FILE (the site's brokers CA): SASL_SSL to the SERVICES listener; Java clients get the CA
    inline, so Spark's executors in other containers need no file."""
    (tmp_path / "kafka_password").write_text("s3cret-Pw-0123456789\n")
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    environ = {"KAFKA_USERNAME": "bridge", "KAFKA_PASSWORD_FILE": str(tmp_path / "kafka_password"),
               "KAFKA_CA_FILE": str(tmp_path / "ca.pem")}
    assert kafka_auth.internal_config(environ) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "bridge", "sasl.password": "s3cret-Pw-0123456789",
        "ssl.ca.location": str(tmp_path / "ca.pem"), "ssl.endpoint.identification.algorithm": "https"}
    java = kafka_auth.java_internal_options(environ)
    assert java["security.protocol"] == "SASL_SSL" and java["ssl.truststore.type"] == "PEM"
    assert java["ssl.truststore.certificates"] == "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    assert java["ssl.endpoint.identification.algorithm"] == "https"
    assert "ssl.truststore.location" not in java


def test_a_missing_brokers_ca_is_an_error_naming_the_variable_and_the_way_back_to_clear(tmp_path):
    (tmp_path / "kafka_password").write_text("s3cret-Pw-0123456789")
    environ = {"KAFKA_USERNAME": "adapter", "KAFKA_PASSWORD_FILE": str(tmp_path / "kafka_password"),
               "KAFKA_CA_FILE": str(tmp_path / "nope.pem")}
    for build in (kafka_auth.internal_config, kafka_auth.java_internal_options):
        with pytest.raises(SettingsError, match=r"KAFKA_CA_FILE=.*nope.pem not found .*kafka_brokers_ca.*unset it"):
            build(environ)


def test_without_a_user_there_is_no_login_and_a_user_without_its_password_is_an_error(tmp_path):
    assert kafka_auth.internal_config({}) == {}
    with pytest.raises(SettingsError, match=r"kafka_password not found at .*missing .*KAFKA_PASSWORD_FILE"):
        kafka_auth.internal_config({"KAFKA_USERNAME": "adapter", "KAFKA_PASSWORD_FILE": str(tmp_path / "missing")})


def test_jaas_values_are_quoted_so_a_quote_in_a_password_cannot_end_it():
    assert kafka_auth.jaas_config("u", 'a"b\\c') == \
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="a\\"b\\\\c";'


def test_a_tools_client_properties_hold_the_jaas_line_escaped_once_more_for_java_properties():
    """The roles' --command-config (deploy/kafka_acls.py kafka_client_properties): java.util.Properties
    unescapes backslashes once, so the JAAS parser still sees one escaped backslash."""
    from deploy.kafka_acls import kafka_client_properties
    text = kafka_client_properties({"user": "admin", "password": 'p\\w"d'})
    assert text.splitlines() == ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=SCRAM-SHA-512",
                                 "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                                 'username="admin" password="p\\\\\\\\w\\\\"d";']


def test_a_tools_client_properties_with_the_brokers_ca_go_inside_tls_and_check_the_brokers_name():
    from deploy.kafka_acls import kafka_client_properties
    login = {"user": "admin", "password": "pw"}
    lines = kafka_client_properties(login, "/run/secrets/kafka_brokers_ca.pem").splitlines()
    assert lines[0] == "security.protocol=SASL_SSL"
    assert set(lines[3:]) == {"ssl.truststore.type=PEM", "ssl.truststore.location=/run/secrets/kafka_brokers_ca.pem",
                              "ssl.endpoint.identification.algorithm=https"}


def test_a_tools_overlay_login_goes_inside_tls_only_with_the_brokers_ca(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert kafka_auth.overlay_config("admin", "pw", {})["security.protocol"] == "SASL_PLAINTEXT"
    tls = kafka_auth.overlay_config("admin", "pw", {"KAFKA_CA_FILE": str(ca)})
    assert (tls["security.protocol"], tls["ssl.ca.location"]) == ("SASL_SSL", str(ca))
    assert tls["ssl.endpoint.identification.algorithm"] == "https"
    with pytest.raises(SettingsError, match="KAFKA_CA_FILE=.*missing.pem not found"):
        kafka_auth.overlay_config("admin", "pw", {"KAFKA_CA_FILE": str(tmp_path / "missing.pem")})


def test_a_spark_job_reads_and_writes_as_its_principal_in_its_own_groups(monkeypatch, tmp_path):
    (tmp_path / "pw").write_text("job-password-0123456789")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-1:9092")
    monkeypatch.setenv("KAFKA_USERNAME", "threshold-detector")
    monkeypatch.setenv("KAFKA_PASSWORD_FILE", str(tmp_path / "pw"))
    monkeypatch.setenv("KAFKA_GROUP_ID_PREFIX", "site-a-threshold-detector")
    monkeypatch.setenv("KAFKA_OPTION_SECURITY_PROTOCOL", "PLAINTEXT")     # cannot undo the login
    kafka = runtime.KafkaSettings.from_env()
    assert kafka.options["kafka.security.protocol"] == "SASL_PLAINTEXT"
    assert kafka.options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert 'username="threshold-detector" password="job-password-0123456789"' in kafka.options["kafka.sasl.jaas.config"]
    assert kafka.source_options({"subscribe": "t"}, {})["groupIdPrefix"] == "site-a-threshold-detector"
