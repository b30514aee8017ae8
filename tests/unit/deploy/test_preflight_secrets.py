"""No default secrets: preflight refuses weak ones, the lab makes its own, the webhook URL is a Swarm secret.

Preflight (ansible/roles/preflight/tasks/variables.yml) asks deploy/preflight.py's
secret_refusals about every secret variable; each refusal names the variable (and
the MQTT user), says why and how to create a vaulted value. The lab generates
random secrets once per lab (tooling/lab/lab.py). The notifier's webhook URL, which
carries a bot token, reaches it as the Swarm secret notifier_webhook_url.
"""
from __future__ import annotations

import os
import stat

import pytest
import yaml

from deploy.preflight import PLAIN_ENV_SECRET_RE, mqtt_device_refusals, secret_refusals, weak_secret
from deploy.topology import site_topology
from tooling.testbed.stack_render import REPO, load_inventory, render, stack_vars

GOOD = "Zx9kQ2rLq0vR7sT1mN4pW8yB"      # what `openssl rand -base64 24` gives: 32 characters, here 24
USERS = {"stack_cassandra_password": "cassandra", "stack_cassandra_adapter_password": "iot_adapter"}
HOW = "ansible-vault encrypt_string"


def refusals(**overrides) -> list[str]:
    """secret_refusals as preflight calls it, with fit values unless overridden."""
    passwords = {"stack_cassandra_password": GOOD + "1", "stack_cassandra_adapter_password": GOOD + "2"}
    passwords.update({k: v for k, v in overrides.items() if k in passwords})
    return secret_refusals(passwords, users=USERS,
                                   mqtt_users=overrides.get("mqtt_users", {"bridge": GOOD + "3", "device": GOOD + "4"}),
                                   webhook_url=overrides.get("webhook_url", ""),
                                   spark_jobs=overrides.get("spark_jobs", {}))


def test_fit_secrets_pass():
    assert refusals() == []
    assert refusals(webhook_url="https://api.telegram.org/bot123456:AAF-example_token/sendMessage") == []
    assert weak_secret("correct horse battery staple") is None


@pytest.mark.parametrize("value, why", [
    ("", "must be set"),
    (None, "must be set"),
    ("   ", "must be set"),
    ("change-me-cassandra", "is a placeholder (it starts with change-me)"),
    ("change-me", "is a placeholder (it starts with change-me)"),
    ("CHANGEME_please_1234567", "is a placeholder (it starts with change-me)"),
    ("Tr0ub4dor&3", "is shorter than 16 characters"),
    ("x" * 15, "is shorter than 16 characters"),
    ("cassandracassandra", "is the user name itself"),
    ("Cassandra-Cassandra-2024", "is the user name itself"),
    ("passwordpassword", "is a well-known default password"),
    ("Secret-Password-123", "is a well-known default password"),
    ("admin_admin_admin_admin", "is a well-known default password"),
    ("changeit-changeit", "is a well-known default password"),
    ("1234567890123456", "is a well-known default password"),
    ("abababababababababab", "uses fewer than 5 different characters"),
])
def test_each_weak_superuser_password_is_refused_with_name_reason_and_how_to_vault(value, why):
    (message,) = refusals(stack_cassandra_password=value)
    assert message.startswith(f"stack_cassandra_password {why}. "), message
    assert f'{HOW} "$(openssl rand -base64 24)" --name vault_cassandra_password' in message
    assert "set stack_cassandra_password to vault_cassandra_password" in message


def test_a_refusal_never_repeats_the_secret():
    for value in ("change-me-cassandra", "Tr0ub4dor&3", "Secret-Password-123", "iot_adapter_iot_adapter1"):
        for message in refusals(stack_cassandra_adapter_password=value):
            assert value not in message


def test_the_adapter_password_is_refused_when_it_is_its_user_name():
    (message,) = refusals(stack_cassandra_adapter_password="iot_adapter_iot_adapter")
    assert message.startswith("stack_cassandra_adapter_password is the user name itself. ")
    assert "--name vault_cassandra_adapter_password" in message


@pytest.mark.parametrize("password, why", [
    ("change-me-device", "is a placeholder (it starts with change-me)"),
    ("device-secret", "is shorter than 16 characters"),
    ("device-device-device", "is its user name itself"),
    ("mosquitto-password", "is a well-known default password"),
    ("", "must be set"),
])
def test_each_mqtt_password_is_refused_naming_its_user(password, why):
    (message,) = refusals(mqtt_users={"bridge": GOOD, "device": password})
    assert message.startswith(f"stack_mqtt_users: the password of user device {why}. "), message
    assert "--name vault_mqtt_device_password" in message and "set stack_mqtt_users.device to" in message


def test_every_weak_secret_is_named_not_only_the_first():
    found = refusals(stack_cassandra_password="cassandra", stack_cassandra_adapter_password="change-me-adapter",
                     mqtt_users={"bridge": "bridge", "device": GOOD, "sensor-7": "short"})
    assert [m.split(". ")[0] for m in found] == [
        "stack_cassandra_password is shorter than 16 characters",
        "stack_cassandra_adapter_password is a placeholder (it starts with change-me)",
        "stack_mqtt_users: the password of user bridge is shorter than 16 characters",
        "stack_mqtt_users: the password of user sensor-7 is shorter than 16 characters",
    ]
    assert "--name vault_mqtt_sensor_7_password" in found[-1]


@pytest.mark.parametrize("url, why", [
    ("https://api.telegram.org/bot<token>/sendMessage", "is a placeholder"),
    ("https://example.org/change-me", "is a placeholder"),
    ("api.telegram.org/bot123:abc/sendMessage", "must be an https:// URL (or empty: no webhook)"),
    ("http://api.telegram.org/bot123:abc/sendMessage", "must be an https:// URL (or empty: no webhook)"),
])
def test_a_placeholder_or_malformed_webhook_url_is_refused(url, why):
    (message,) = refusals(webhook_url=url)
    assert message.startswith(f"stack_notifier_webhook_url {why}. "), message
    assert f"{HOW} 'https://api.telegram.org/bot<token>/sendMessage' --name vault_notifier_webhook_url" in message


def test_a_secret_in_a_spark_jobs_plain_environment_is_refused():
    jobs = {"datacenter": [{"name": "notifier", "file": "notifier.py",
                            "env": {"WEBHOOK_URL": "https://x.example/bot1/send", "WEBHOOK_CHAT_ID": "-100",
                                    "WEBHOOK_URL_FILE": "/run/secrets/x"}}],
            "edge": [{"name": "rollups", "env": {"TRIGGER_INTERVAL": "5 seconds", "DB_PASSWORD": "x"}}]}
    assert refusals(spark_jobs=jobs) == [
        "stack_spark.jobs.datacenter (notifier): env WEBHOOK_URL would put a secret into the stack file in plain"
        " text; set stack_notifier_webhook_url (vaulted) instead, which the notifier gets as the Swarm secret"
        " notifier_webhook_url.",
        "stack_spark.jobs.edge (rollups): env DB_PASSWORD would put a secret into the stack file in plain text;"
        " pass secrets as Swarm secrets.",
    ]


def _example_secrets(host: str = "site-a-1") -> dict:
    """inventory.example's variables of one host as Ansible resolves them when no vault_* variable is set."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    hostvars, _ = load_inventory(REPO / "inventory.example")
    templar = Templar(loader=DataLoader(), variables=hostvars[host])
    names = [*USERS, "stack_mqtt_users", "stack_mqtt_devices", "stack_notifier_webhook_url"]
    return {name: templar.template(hostvars[host][name]) for name in names if name in hostvars[host]}


def test_every_placeholder_of_the_example_inventory_is_refused():
    values = _example_secrets()
    found = secret_refusals({k: values[k] for k in USERS}, users=USERS, mqtt_users=values["stack_mqtt_users"],
                                    webhook_url=values.get("stack_notifier_webhook_url", ""),
                                    mqtt_devices=values["stack_mqtt_devices"])
    assert [m.split(". ")[0] for m in found] == [
        "stack_cassandra_password is a placeholder (it starts with change-me)",
        "stack_cassandra_adapter_password is a placeholder (it starts with change-me)",
        "stack_mqtt_users: the password of user bridge is a placeholder (it starts with change-me)",
        "stack_mqtt_users: the password of user mosquitto-agent is a placeholder (it starts with change-me)",
        "stack_mqtt_devices: the password of device site-a-press-1 is a placeholder (it starts with change-me)",
        "stack_mqtt_devices: the password of device site-a-press-2 is a placeholder (it starts with change-me)",
    ]
    # ... and each refusal suggests the vault variable the example inventory already refers to.
    text = "".join(path.read_text() for path in (REPO / "inventory.example/group_vars").glob("*/*.yml"))
    for message in found:
        vault = message.split("--name ")[1].split("`")[0]
        assert f"{{{{ {vault} |" in text, f"{vault} is not what inventory.example refers to"


# ---------------------------------------------------------------- the webhook URL as a Swarm secret

def test_notifier_reads_the_webhook_url_from_a_hashed_swarm_secret():
    hostvars, groups = load_inventory(REPO / "inventory.example")
    stack = render("datacenter", site_topology(hostvars, groups["datacenter"], "datacenter", "datacenter"))
    notifier = stack["services"]["notifier"]
    assert notifier["environment"]["WEBHOOK_URL_FILE"] == "/run/secrets/notifier_webhook_url"
    assert "WEBHOOK_URL" not in notifier["environment"]
    assert notifier["secrets"] == ["notifier_webhook_url", "spark_auth_secret",     # cluster mode: Spark RPC too
                                   {"source": "kafka_password_notifier", "target": "kafka_password"},
                                   {"source": "kafka_brokers_ca", "target": "kafka_brokers_ca.pem"}]
    name = stack["secrets"]["notifier_webhook_url"]["name"]
    assert name.startswith("datacenter_notifier_webhook_url_") and len(name.rsplit("_", 1)[1]) == 12
    # Only the notifier sees the webhook URL.
    assert [n for n, s in stack["services"].items() if "notifier_webhook_url" in s.get("secrets", [])] == ["notifier"]


def test_a_secrets_swarm_name_is_keyed_so_a_guessed_password_cannot_be_checked_against_it():
    """Anyone who may list the Swarm's secrets sees their names: a plain hash of a human-chosen password
    could be tried against guesses offline. A secret's name is an HMAC with the deployment's salt key;
    a config's (not secret) is its content's SHA-256, as before."""
    import hashlib

    from deploy.swarm import stack_files
    spec = {"configs": {"site": "a: 1\n"}, "secrets": {"cassandra_password": "Winter2026!factory"}}
    files = stack_files(spec, "/opt/iot-stack/site-a", "k" * 43)
    plain = hashlib.sha256(b"Winter2026!factory").hexdigest()
    assert files["secrets"]["cassandra_password"]["path"] == "/opt/iot-stack/site-a/secrets/cassandra_password"
    assert files["secrets"]["cassandra_password"]["hash"][:12] != plain[:12]
    assert files["configs"]["site"]["hash"] == hashlib.sha256(b"a: 1\n").hexdigest()
    # Stable for one key (a re-run does not roll the services), different under another deployment's key,
    # different for another secret holding the same password, and new when the password changes.
    again = stack_files(spec, "/h", "k" * 43)["secrets"]["cassandra_password"]
    assert again == {"path": "/h/secrets/cassandra_password", "hash": files["secrets"]["cassandra_password"]["hash"]}
    hashes = {stack_files(s, "/h", k)["secrets"][n]["hash"] for s, k, n in (
        (spec, "k" * 43, "cassandra_password"), (spec, "j" * 43, "cassandra_password"),
        ({"secrets": {"other": "Winter2026!factory"}}, "k" * 43, "other"),
        ({"secrets": {"cassandra_password": "Summer2026!factory"}}, "k" * 43, "cassandra_password"))}
    assert len(hashes) == 4


def test_the_rendered_stack_names_secrets_by_the_keyed_hash():
    hostvars, groups = load_inventory(REPO / "inventory.example")
    topology = site_topology(hostvars, groups["site_a"], "site-a", "edge")
    names = {key: {n: s["name"] for n, s in render("edge", topology, pki_password_salt_key=key)["secrets"].items()}
             for key in ("k" * 43, "j" * 43)}
    assert names["k" * 43].keys() == names["j" * 43].keys() and "cassandra_password" in names["k" * 43]
    for secret, name in names["k" * 43].items():
        assert name.startswith(f"site-a_{secret}_") and name != names["j" * 43][secret]


@pytest.mark.parametrize("url, content", [("", "\n"), ("  https://example.org/bot1:x/send \n", "https://example.org/bot1:x/send\n")])
def test_the_webhook_secret_is_never_empty_and_a_lone_newline_means_no_webhook(url, content):
    """Swarm refuses an empty secret; the notifier strips the file, so "\\n" is no webhook."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    template = trust_as_template(stack_vars()["__stack_files"]["datacenter"]["secrets"]["notifier_webhook_url"])
    templar = Templar(loader=DataLoader(), variables={"stack_notifier_webhook_url": url})
    assert templar.template(template) == content
    defaults = yaml.safe_load((REPO / "ansible/roles/stack/defaults/main.yml").read_text())
    assert defaults["stack_notifier_webhook_url"] == ""


def test_no_rendered_service_gets_a_secret_in_its_environment():
    hostvars, groups = load_inventory(REPO / "inventory.example")
    for group, tier in (("site_a", "edge"), ("datacenter", "datacenter")):
        stack = render(tier, site_topology(hostvars, groups[group], group.replace("_", "-"), tier))
        for name, service in stack["services"].items():
            plain = [k for k in service.get("environment", {}) if PLAIN_ENV_SECRET_RE.match(k)]
            assert plain == [], f"{name}: {plain} in plain text"


# ---------------------------------------------------------------- the lab's secrets

@pytest.fixture
def lab(tmp_path, monkeypatch):
    monkeypatch.setenv("IOT_STACK_CACHE", str(tmp_path))
    from tooling.lab import lab
    monkeypatch.setattr(lab, "log", lambda *_: None)
    return lab


def test_lab_secrets_are_random_long_private_and_made_once(lab):
    made = lab.create_secrets()
    assert set(made) == set(lab.SECRET_NAMES) and len(set(made.values())) == len(made)
    assert all(len(v) >= 24 for v in made.values())
    assert stat.S_IMODE(os.stat(lab.secrets_path()).st_mode) == 0o600
    assert lab.create_secrets() == made                  # a later `up` reuses them
    assert lab.secret("device") == made["device"] == lab.LAB_SECRETS["device"]
    assert dict(lab.LAB_SECRETS) == made
    lab.remove_secrets()                                 # `down`
    assert not lab.secrets_path().exists()
    assert lab.create_secrets() != made                  # a new lab, new secrets


def test_lab_secrets_pass_preflight(lab):
    values = yaml.safe_load(lab.secret_group_vars(lab.create_secrets()))
    assert secret_refusals({k: values[k] for k in USERS}, users=USERS,
                                   mqtt_users=values["stack_mqtt_users"]) == []
    assert set(values["stack_mqtt_users"]) == {"bridge", "mosquitto-agent"}
    for site in ("site-a", "site-b"):
        devices = lab.device_credentials(site)
        assert secret_refusals({}, mqtt_devices=devices) == []
        assert mqtt_device_refusals(devices, values["stack_mqtt_users"]) == []
        assert len(set(devices.values())) == len(devices) == len(lab.device_ids(site))
    assert "password" not in lab.LAB_GROUP_VARS          # lab.yml holds sizes only


def test_reading_lab_secrets_without_a_lab_is_a_clear_error(lab):
    with pytest.raises(SystemExit, match=r"lab: the lab has no secrets .*`scripts/lab up` creates them"):
        lab.secret("device")
    with pytest.raises(SystemExit, match="no secrets"):
        lab.LAB_SECRETS["device"]
    with pytest.raises(KeyError, match="no secret 'nope'"):
        lab.secret("nope")
    lab.secrets_path().write_text("{not json")
    with pytest.raises(SystemExit, match="cannot read the lab's secrets"):
        lab.secret("device")


@pytest.mark.parametrize("device, why", [
    ("press/1", "must be 1-64 letters, digits"), ("press+1", "must be 1-64 letters, digits"),
    ("#", "must be 1-64 letters, digits"), ("a" * 65, "must be 1-64 letters, digits"),
    ("bridge", "is also in stack_mqtt_users"),
])
def test_a_device_id_that_cannot_be_its_own_login_and_topic_segment_is_refused(device, why):
    (message,) = mqtt_device_refusals({device: GOOD, "press-2": GOOD}, {"bridge": GOOD})
    assert message.startswith(f"stack_mqtt_devices: device id {device!r} ") and why in message, message
    assert GOOD not in message


def test_each_weak_device_password_is_refused_naming_the_device():
    device = "site-a-press-0002"
    (message,) = secret_refusals({}, mqtt_devices={"press-1": GOOD, device: device})
    assert message.startswith(f"stack_mqtt_devices: the password of device {device} is its user name"), message
    assert "--name vault_mqtt_site_a_press_0002_password" in message
    assert f"set stack_mqtt_devices.{device} to" in message
