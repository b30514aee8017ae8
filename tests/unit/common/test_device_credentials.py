"""The device-credentials record: ids, the JSON both iot-devices and mosquitto-agent read, fail-closed parsing."""
from __future__ import annotations

import json

import pytest

from services.common.device_credentials import (
    HASH_RE,
    Credential,
    CredentialError,
    check_device_id,
    device_id_error,
    parse_credential,
)

HASH = "$7$1000$AAAAAAAAAAAAAAAA$" + "A" * 86 + "=="


def test_a_record_round_trips_through_its_json():
    record = Credential(True, "password", HASH, "cli", 1732000000000)
    assert json.loads(record.to_json()) == {"enabled": True, "auth": "password", "hash": HASH, "source": "cli",
                                            "updated_ms": 1732000000000}
    assert parse_credential("press-1", record.to_json()) == record


def test_a_certificate_device_has_no_hash():
    record = Credential(False, "certificate", None, "cli", 1)
    assert parse_credential("cam-1", record.to_json()) == record


@pytest.mark.parametrize("value, why", [
    (b"{", "not JSON"), (b"\xff", "not JSON"), (b"[]", "JSON object"),
    (b'{"enabled": 1, "auth": "password", "hash": "' + HASH.encode() + b'"}', "'enabled'"),
    (b'{"enabled": true, "auth": "token", "hash": null}', "'auth'"),
    (b'{"enabled": true, "auth": "password", "hash": null}', "needs a valid hash"),
    (b'{"enabled": true, "auth": "password", "hash": "$7$1000$a b$c"}', "needs a valid hash"),
    (b'{"enabled": true, "auth": "password", "hash": "$7$99999999$AAAA$AAAA"}', "more than 10000000"),
    (b'{"enabled": true, "auth": "password", "hash": "$7$1000$AAAA$' + b"A" * 88 + b'"}', "longer than 64"),
    (b'{"enabled": true, "auth": "certificate", "hash": "' + HASH.encode() + b'"}', "'hash' null"),
    (b'{"enabled": true, "auth": "certificate", "hash": null, "source": "other"}', "'source'"),
    (b'{"enabled": true, "auth": "certificate", "hash": null, "updated_ms": "now"}', "'updated_ms'"),
], ids=["syntax", "encoding", "array", "enabled", "auth", "no-hash", "hash-with-space", "iterations",
        "long-digest", "certificate-hash",
        "source", "updated"])
def test_a_bad_record_is_refused_naming_the_device_and_field(value, why):
    with pytest.raises(CredentialError, match=why) as caught:
        parse_credential("press-1", value)
    assert "press-1" in str(caught.value)


def test_a_record_under_an_invalid_id_is_refused():
    with pytest.raises(CredentialError, match="reserved"):
        parse_credential("bridge-1", Credential(True, "certificate", None, "cli", 1).to_json())


@pytest.mark.parametrize("hashed", [HASH, "$7$101$AAAAAAAAAAAAAAAA$AAAA", "$7$1$AAA=$AA=="])
def test_hashes_in_mosquittos_form_pass(hashed):
    assert HASH_RE.fullmatch(hashed)


@pytest.mark.parametrize("hashed", ["$7$1000$AAAAA$AAAA", "$6$1000$AAAA$AAAA", "$7$$AAAA$AAAA", "$7$01$AAAA$AAAA",
                                    "$7$1000$AAAA$AAAA\n", "$7$1000$AAAA"])
def test_hashes_the_plugin_cannot_decode_do_not_pass(hashed):
    assert not HASH_RE.fullmatch(hashed)


def test_device_ids_follow_the_rule():
    assert device_id_error("press-1") is None
    assert check_device_id("a" * 64) == "a" * 64
    assert "not valid" in device_id_error("a" * 65)
    assert "not valid" in device_id_error(None)
    assert "not valid" in device_id_error("press-1\n")
    assert "reserved" in device_id_error("mosquitto-agent-1")
    with pytest.raises(CredentialError):
        check_device_id("_lead")
