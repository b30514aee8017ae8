"""The jre image's jmx-exporter-agent (images/jre/bin/jmx-exporter-agent), run on this machine's bash and
openssl: the flag it prints, the files it makes for HTTPS with a login, and the message of each wrong
setting. The agent itself serving HTTPS to that login only is tests/integration/test_metrics.py."""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from tooling.testbed import certs

SCRIPT = Path(__file__).resolve().parents[3] / "images/jre/bin/jmx-exporter-agent"
RULES = Path(__file__).resolve().parents[3] / "images/kafka/jmx-exporter/kafka.yml"


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JMX_EXPORTER_")}
    return subprocess.run(["bash", str(SCRIPT), str(RULES), str(tmp_path)], env={**environ, **env},
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture()
def pki(tmp_path):
    return certs.metrics_pki(tmp_path / "pki")


def test_without_a_port_there_is_no_agent(tmp_path):
    result = _run(tmp_path)
    assert (result.returncode, result.stdout) == (0, "")


def test_in_clear_the_flag_names_the_images_rules(tmp_path):
    result = _run(tmp_path, JMX_EXPORTER_PORT="9404")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"-javaagent:/opt/jmx-exporter/jmx_prometheus_javaagent.jar=9404:{RULES}"


def test_with_a_keystore_the_rules_gain_https_and_the_login_readable_by_this_user_only(tmp_path, pki):
    result = _run(tmp_path, JMX_EXPORTER_PORT="9404", JMX_EXPORTER_KEYSTORE=f"{pki['exporter']}/metrics_keystore.pem",
                  JMX_EXPORTER_PASSWORD_FILE=f"{pki['exporter']}/metrics_password")
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(f"=9404:{tmp_path}/jmx-exporter.yml")
    rules = yaml.safe_load((tmp_path / "jmx-exporter.yml").read_text())
    assert rules["rules"] == yaml.safe_load(RULES.read_text())["rules"]
    server = rules["httpServer"]
    assert server["authentication"]["basic"] == {"username": "prometheus", "password": pki["password"]}
    assert server["ssl"]["keyStore"]["filename"] == f"{tmp_path}/jmx-exporter.p12"
    assert server["ssl"]["certificate"]["alias"] == "exporter"
    listing = subprocess.run(["openssl", "pkcs12", "-in", f"{tmp_path}/jmx-exporter.p12", "-nokeys", "-passin",
                              f"pass:{server['ssl']['keyStore']['password']}"], capture_output=True, text=True,
                             check=True).stdout
    assert "friendlyName: exporter" in listing and "subject=CN = metrics-exporter" in listing
    for made in ("jmx-exporter.yml", "jmx-exporter.p12"):
        assert stat.S_IMODE((tmp_path / made).stat().st_mode) == 0o600, made
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jmx-exporter.p12", "jmx-exporter.yml", "pki"]


@pytest.mark.parametrize(("env", "named"), [
    ({"JMX_EXPORTER_PORT": "70000"}, "JMX_EXPORTER_PORT must be a TCP port"),
    ({"JMX_EXPORTER_PORT": "9404", "JMX_EXPORTER_KEYSTORE": "{exporter}/metrics_keystore.pem"},
     "JMX_EXPORTER_KEYSTORE and JMX_EXPORTER_PASSWORD_FILE go together"),
    ({"JMX_EXPORTER_PORT": "9404", "JMX_EXPORTER_KEYSTORE": "{exporter}/scrapers_ca.pem",
      "JMX_EXPORTER_PASSWORD_FILE": "{exporter}/metrics_password"}, "is not a PEM key with its certificate"),
    ({"JMX_EXPORTER_PORT": "9404", "JMX_EXPORTER_KEYSTORE": "{exporter}/metrics_keystore.pem",
      "JMX_EXPORTER_PASSWORD_FILE": "{exporter}/missing"}, "JMX_EXPORTER_PASSWORD_FILE="),
    ({"JMX_EXPORTER_PORT": "9404", "JMX_EXPORTER_KEYSTORE": "{exporter}/metrics_keystore.pem",
      "JMX_EXPORTER_PASSWORD_FILE": "{exporter}/scrapers_ca.pem"}, "must be 16 or more letters"),
])
def test_a_wrong_setting_is_named(tmp_path, pki, env, named):
    result = _run(tmp_path, **{k: v.format(exporter=pki["exporter"]) for k, v in env.items()})
    assert result.returncode == 2 and named in result.stderr, result.stderr
    assert result.stdout == ""
