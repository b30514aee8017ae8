"""iot-devices without Kafka: passwords and hashes, the printed lines, ids, the CSV, the table a topic adds
up to, the inventory sync's plan, device certificates and the command line."""
from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest

from deploy.passwords import mqtt_device_hashes
from services.commands import devices
from services.common.device_credentials import HASH_RE, Credential

SITE = "site-a"
SALT_KEY = "k" * 40


def _cred(source: str = "cli", enabled: bool = True, password: str | None = "pw", auth: str = "password",
          salt: bytes | None = None) -> Credential:
    hashed = devices.hash_password(password, salt) if auth == "password" else None
    return Credential(enabled, auth, hashed, source, 1)


# ------------------------------------------------------------------ passwords and hashes

def test_new_passwords_are_32_random_letters_and_digits():
    passwords = {devices.new_password() for _ in range(50)}
    assert len(passwords) == 50
    assert all(re.fullmatch(r"[A-Za-z0-9]{32}", p) for p in passwords)


def test_a_hash_is_pbkdf2_sha512_in_mosquittos_7_form():
    hashed = devices.hash_password("secret")
    assert HASH_RE.fullmatch(hashed)
    _, seven, iterations, salt, digest = hashed.split("$")
    assert (seven, iterations) == ("7", "1000")
    salt, digest = base64.b64decode(salt), base64.b64decode(digest)
    assert len(salt) == 12 and len(digest) == 64
    assert digest == hashlib.pbkdf2_hmac("sha512", b"secret", salt, 1000, 64)


def test_each_hash_gets_its_own_salt():
    assert devices.hash_password("same") != devices.hash_password("same")


def test_a_hash_verifies_its_password_only():
    hashed = devices.hash_password("right")
    assert devices.verify_password("right", hashed)
    assert not devices.verify_password("wrong", hashed)


@pytest.mark.parametrize("hashed", [None, "", "plain", "$6$1000$c2FsdA==$ZGln", "$7$x$c2FsdA==$ZGln",
                                    "$7$1000$!!$ZGln", "$7$0$c2FsdA==$ZGln", "$7$1000$c2FsdA==$"])
def test_a_malformed_hash_verifies_nothing(hashed):
    assert not devices.verify_password("pw", hashed)


def test_an_inventory_hash_is_the_one_the_stack_roles_filter_writes():
    """Same salt rule as deploy/passwords.py mqtt_device_hashes, so a rerun changes nothing."""
    salt = devices.inventory_salt(SALT_KEY, SITE, "press-1", "pw-1")
    ours = devices.hash_password("pw-1", salt)
    assert mqtt_device_hashes({"press-1": "pw-1"}, SITE, SALT_KEY) == {"press-1": ours}
    assert devices.inventory_salt(SALT_KEY, "site-b", "press-1", "pw-1") != salt


# ------------------------------------------------------------------ output lines

def test_a_password_credential_is_one_json_line_with_device_username_password_and_site():
    line = devices.credential_line("press-1", SITE, password="pw")
    assert "\n" not in line
    assert json.loads(line) == {"device": "press-1", "username": "press-1", "password": "pw", "site": SITE}


def test_a_certificate_credential_carries_key_and_certificate_instead_of_a_password():
    line = json.loads(devices.credential_line("cam-1", SITE, key_pem="KEY", certificate_pem="CERT"))
    assert line == {"device": "cam-1", "username": "cam-1", "key": "KEY", "certificate": "CERT", "site": SITE}


def test_the_listing_never_shows_a_hash():
    line = json.loads(devices.listing_line("press-1", _cred()))
    assert line == {"device": "press-1", "enabled": True, "auth": "password", "source": "cli", "updated_ms": 1}


# ------------------------------------------------------------------ ids and the CSV

@pytest.mark.parametrize("device", ["a", "press-1", "A.b_c-9", "x" * 64, "9lives"])
def test_valid_device_ids_pass(device):
    assert devices.check_ids([device]) == [device]


@pytest.mark.parametrize("device, why", [
    ("", "not valid"), ("-lead", "not valid"), ("has space", "not valid"), ("x" * 65, "not valid"),
    ("a/b", "not valid"), ("a\n", "not valid"), ("a+b", "not valid"), ("a#", "not valid"), ("é", "not valid"),
    ("bridge-1", "reserved for the services"), ("mosquitto-agent-2", "reserved for the services")])
def test_invalid_device_ids_are_refused_naming_the_rule(device, why):
    with pytest.raises(devices.InputError, match=why):
        devices.check_ids([device])


def test_a_csv_gives_ids_with_password_by_default():
    text = "device_id,auth\npress-1\npress-2,password\ncam-1,Certificate\n\n# comment\n press-3 , \n"
    assert devices.parse_csv(text) == [("press-1", "password"), ("press-2", "password"),
                                       ("cam-1", "certificate"), ("press-3", "password")]


def test_a_csv_without_header_starts_with_a_device():
    assert devices.parse_csv("press-1\n") == [("press-1", "password")]


def test_a_bad_csv_names_every_bad_row():
    text = "device_id\nok-1\nbridge-x\nok-2,token\nok-1\na,b,c\n"
    with pytest.raises(devices.InputError) as caught:
        devices.parse_csv(text, "devices.csv")
    message = str(caught.value)
    for expected in ("devices.csv row 3: device id 'bridge-x'", "row 4: auth 'token' of ok-2",
                     "row 5: ok-1 is listed twice (first in row 2)", "row 6: expected device_id[,auth]"):
        assert expected in message


def test_an_empty_csv_is_refused():
    with pytest.raises(devices.InputError, match="no devices"):
        devices.parse_csv("device_id\n# nothing\n")


def test_a_csv_of_thousands_of_rows_parses_quickly():
    text = "\n".join(f"dev-{i}" for i in range(20000))
    assert len(devices.parse_csv(text)) == 20000


# ------------------------------------------------------------------ the table a topic adds up to

def test_the_last_record_of_a_device_wins_and_a_tombstone_removes_it():
    a, b = _cred(password="a"), _cred(password="b")
    table, warnings = devices.fold_records([(b"d1", a.to_json()), (b"d2", a.to_json()), (b"d1", b.to_json()),
                                            (b"d2", None)])
    assert table == {"d1": b} and warnings == []


def test_an_unreadable_record_counts_as_removed_with_a_warning():
    table, warnings = devices.fold_records([(b"d1", _cred().to_json()), (b"d1", b"{not json")])
    assert table == {}
    assert len(warnings) == 1 and "d1" in warnings[0] and "counts as removed" in warnings[0]


def test_a_later_valid_record_clears_an_earlier_warning():
    table, warnings = devices.fold_records([(b"d1", b"[]"), (b"d1", _cred().to_json())])
    assert list(table) == ["d1"] and warnings == []


# ------------------------------------------------------------------ inventory sync

def _inventory_cred(device: str, password: str, enabled: bool = True) -> Credential:
    salt = devices.inventory_salt(SALT_KEY, SITE, device, password)
    return Credential(enabled, "password", devices.hash_password(password, salt), "inventory", 1)


def _plan(table, passwords, now_ms=1):
    """sync-inventory of passwords (stack_mqtt_devices), as the tool plans it."""
    return devices.plan_inventory(table, devices.inventory_hashes(table, passwords, SITE, SALT_KEY), now_ms)


def test_inventory_sync_adds_changes_and_removes_only_inventory_devices():
    table = {"same": _inventory_cred("same", "pw"), "moved": _inventory_cred("moved", "old"),
             "gone": _inventory_cred("gone", "pw"), "mine": _cred("cli")}
    plan = _plan(table, {"same": "pw", "moved": "new", "fresh": "pw", "mine": "x"}, now_ms=5)
    assert json.loads(plan.summary()) == {"added": ["fresh"], "changed": ["moved"], "removed": ["gone"],
                                          "unchanged": 1}
    assert plan.cli_owned == ["mine"]
    assert set(plan.records) == {"fresh", "moved", "gone"} and plan.records["gone"] is None
    fresh = plan.records["fresh"]
    assert fresh.source == "inventory" and fresh.enabled and fresh.updated_ms == 5
    assert devices.verify_password("pw", fresh.hash) and devices.verify_password("new", plan.records["moved"].hash)


def test_a_second_inventory_sync_changes_nothing():
    inventory = {"d1": "pw1", "d2": "pw2"}
    first = _plan({}, inventory)
    table = {d: c for d, c in first.records.items() if c is not None}
    second = _plan(table, inventory, now_ms=2)
    assert json.loads(second.summary()) == {"added": [], "changed": [], "removed": [], "unchanged": 2}
    assert second.records == {}


def test_an_inventory_hash_is_the_same_on_every_run():
    assert _plan({}, {"d1": "pw"}).records["d1"].hash == _plan({}, {"d1": "pw"}).records["d1"].hash


def test_a_disabled_inventory_device_stays_disabled_when_its_password_changes():
    table = {"d1": _inventory_cred("d1", "old", enabled=False)}
    assert _plan(table, {"d1": "new"}).records["d1"].enabled is False


def test_an_inventory_device_stored_from_another_hash_form_is_kept_while_it_verifies():
    """A hash of other iterations and salt (mosquitto_passwd's 101, a random salt) still verifies: no rewrite."""
    table = {"d1": Credential(True, "password", devices.hash_password("pw", iterations=101), "inventory", 1)}
    assert _plan(table, {"d1": "pw"}).unchanged == 1


def test_hashes_made_on_the_controller_sync_the_same_as_passwords():
    """The devices role hashes stack_mqtt_devices on the controller ({"devices": {id: hash}}): the same
    stable hashes, so either form sees the other's records as unchanged."""
    passwords = {"d1": "pw1", "d2": "pw2"}
    hashes = {d: devices.hash_password(p, devices.inventory_salt(SALT_KEY, SITE, d, p)) for d, p in passwords.items()}
    inventory = devices.parse_inventory(json.dumps({"devices": hashes}))
    assert inventory.hashes == hashes and inventory.passwords is None
    from_passwords = {d: c for d, c in _plan({}, passwords).records.items() if c is not None}
    again = devices.plan_inventory(from_passwords, inventory.hashes, 2)
    assert json.loads(again.summary()) == {"added": [], "changed": [], "removed": [], "unchanged": 2}
    changed = devices.plan_inventory(from_passwords, {"d1": hashes["d1"], "d2": devices.hash_password("x")}, 3)
    assert json.loads(changed.summary())["changed"] == ["d2"]


def test_passwords_parse_as_passwords():
    assert devices.parse_inventory('{"d1": "pw"}') == devices.Inventory(passwords={"d1": "pw"})


@pytest.mark.parametrize("text, why", [("[]", "must be a JSON object"), ("{", "not JSON"),
                                       ('{"bridge-1": "pw"}', "reserved"), ('{"d1": ""}', "non-empty password"),
                                       ('{"d1": 5}', "non-empty password"),
                                       ('{"devices": {"d1": "plain"}}', "'hash' must be"),
                                       ('{"devices": {"bridge-2": "$7$1$AAAA$AAAA"}}', "reserved")])
def test_bad_inventory_input_is_refused(text, why):
    with pytest.raises(devices.InputError, match=why):
        devices.parse_inventory(text)


# ------------------------------------------------------------------ the envelope

def test_the_envelope_carries_the_kafka_password_and_the_commands_stdin():
    assert devices.parse_envelope('{"kafka_password": "k", "input": "device_id\\np1\\n"}') == ("k", "device_id\np1\n")
    assert devices.parse_envelope('{"kafka_password": "k", "input": {"devices": {}}}') == ("k", '{"devices": {}}')


@pytest.mark.parametrize("text", ["", "[]", '{"input": ""}', '{"kafka_password": ""}', '{"kafka_password": 1}'])
def test_a_bad_envelope_is_refused(text):
    with pytest.raises(devices.InputError, match="stdin-envelope"):
        devices.parse_envelope(text)


def test_the_envelope_password_logs_in_as_kafka_username(monkeypatch):
    monkeypatch.setenv("KAFKA_USERNAME", "operator")
    monkeypatch.setenv("KAFKA_PASSWORD_FILE", "/nonexistent")       # not read: the envelope has the password
    config = devices.kafka_security(False, ("", "", ""), "from-stdin")
    assert (config["security.protocol"], config["sasl.username"], config["sasl.password"]) == \
        ("SASL_PLAINTEXT", "operator", "from-stdin")
    monkeypatch.delenv("KAFKA_USERNAME")
    with pytest.raises(devices.InputError, match="needs KAFKA_USERNAME"):
        devices.kafka_security(False, ("", "", ""), "from-stdin")


# ------------------------------------------------------------------ certificates

def _pem_ca():
    """A CA certificate and its key (PEM), as an operator keeps them for device certificates."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "device CA")])
    now = dt.datetime.now(dt.UTC)
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
          .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    return ca, ca.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def test_a_device_certificate_names_the_device_and_chains_to_the_ca():
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca, ca_pem, ca_key = _pem_ca()
    device_key, device_cert = devices.make_certificate("cam-1", ca_pem, ca_key, 30)
    cert = x509.load_pem_x509_certificate(device_cert.encode())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "cam-1"
    cert.verify_directly_issued_by(ca)
    assert 29 <= (cert.not_valid_after_utc - dt.datetime.now(dt.UTC)).days <= 30
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == \
        [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert serialization.load_pem_private_key(device_key.encode(), None).public_key().public_numbers() == \
        cert.public_key().public_numbers()


def test_a_device_certificate_needs_the_cas_own_key():
    _, ca_pem, _ = _pem_ca()
    _, _, other_key = _pem_ca()
    with pytest.raises(devices.InputError, match="not the key of --ca-cert"):
        devices.make_certificate("cam-1", ca_pem, other_key, 30)


# ------------------------------------------------------------------ command line

def test_help_names_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        devices.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for command in devices.COMMANDS:
        assert command in out
    assert "DEVICES_BOOTSTRAP" in out


@pytest.mark.parametrize("argv", [["list"], ["--bootstrap", "k:9092"], ["--bootstrap", "k:9092", "nothing"],
                                  ["--bootstrap", "k:9092", "add"],
                                  ["--bootstrap", "k:9092", "--timeout", "x", "list"]],
                         ids=["no-bootstrap", "no-command", "unknown-command", "add-without-id", "bad-timeout"])
def test_bad_flags_print_usage_and_exit_2(argv, capsys, monkeypatch):
    monkeypatch.delenv("DEVICES_BOOTSTRAP", raising=False)
    with pytest.raises(SystemExit) as exit_:
        devices.main(argv)
    assert exit_.value.code == 2
    assert "usage: iot-devices" in capsys.readouterr().err


def test_an_invalid_id_is_refused_before_kafka_is_asked(capsys, monkeypatch):
    monkeypatch.delenv("KAFKA_USERNAME", raising=False)
    assert devices.main(["--bootstrap", "127.0.0.1:1", "--site", SITE, "add", "bridge-7"]) == 2
    assert "reserved for the services' client ids" in capsys.readouterr().err


def test_add_without_a_site_says_which_flag_is_missing(capsys, monkeypatch):
    monkeypatch.delenv("KAFKA_USERNAME", raising=False)
    monkeypatch.delenv("DEVICES_SITE", raising=False)
    assert devices.main(["--bootstrap", "127.0.0.1:1", "add", "press-1"]) == 2
    assert "needs --site" in capsys.readouterr().err


def test_external_without_a_login_says_what_to_set(capsys, monkeypatch):
    monkeypatch.delenv("KAFKA_USERNAME", raising=False)
    assert devices.main(["--bootstrap", "127.0.0.1:1", "--external", "list"]) == 2
    assert "KAFKA_USERNAME" in capsys.readouterr().err


def test_external_logs_in_with_sasl_ssl_and_the_operators_client_certificate(tmp_path, monkeypatch):
    (tmp_path / "pw").write_text("secret\n")
    files = tuple(str(tmp_path / name) for name in ("ca.pem", "operator.crt", "operator.key"))
    for path in files:
        Path(path).write_text("PEM")
    monkeypatch.setenv("KAFKA_USERNAME", "operator")
    monkeypatch.setenv("KAFKA_PASSWORD_FILE", str(tmp_path / "pw"))
    config = devices.kafka_security(True, files)
    assert config["security.protocol"] == "SASL_SSL" and config["sasl.username"] == "operator"
    assert config["sasl.password"] == "secret" and config["ssl.ca.location"] == files[0]
    assert (config["ssl.certificate.location"], config["ssl.key.location"]) == files[1:]
    assert devices.kafka_security(False, ("", "", ""))["security.protocol"] == "SASL_PLAINTEXT"
    Path(files[1]).unlink()
    with pytest.raises(devices.InputError, match="--cert-file .* not found .*clients/operator.crt"):
        devices.kafka_security(True, files)
