"""Contracts take any bytes: a clean record every store can hold, or a ContractError (issue 12, case 2).

ContractError is what every consumer turns into a dead letter, so anything else
raised here (OverflowError for 1e999, RecursionError for deep nesting, ValueError
for an int over Python's digit limit) would stop a consumer on one record.
"""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common import contracts
from services.common.contracts import READING, ContractError
from tests.unit.poison import DEEP, EPOCH_MS_MAX, EPOCH_MS_MIN, POISON_SETTINGS, TIME_FIELDS, any_document, is_clean

GOOD = {"sensor_id": "s-1", "timestamp": 1_700_000_000_000, "temperature": 21.5, "unit": "C"}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("timestamp", math.inf, "'timestamp' must be an integer"),          # what JSON 1e999 becomes
    ("timestamp", -math.inf, "'timestamp' must be an integer"),
    ("timestamp", math.nan, "'timestamp' must be an integer"),
    ("timestamp", 2 ** 63, "'timestamp' must be an epoch time in ms"),
    ("timestamp", 10 ** 400, "'timestamp' must be an epoch time in ms"),
    ("timestamp", EPOCH_MS_MAX + 1, "'timestamp' must be an epoch time in ms"),
    ("timestamp", EPOCH_MS_MIN - 1, "'timestamp' must be an epoch time in ms"),
    ("timestamp", 1e300, "'timestamp' must be an epoch time in ms"),
    ("temperature", 10 ** 400, "'temperature' must be a finite number"),  # float() would overflow
    ("sensor_id", "s-\ud800", "'sensor_id' must be Unicode text"),       # JSON "\ud800": no UTF-8 for it
    ("unit", "\ud800", "'unit' must be Unicode text"),
])
def test_a_value_that_does_not_fit_is_a_contract_error(field, value, message):
    with pytest.raises(ContractError, match=message):
        READING.validate(dict(GOOD, **{field: value}))


def test_every_long_fits_a_bigint_and_every_time_field_a_date():
    for contract in contracts.CONTRACTS.values():
        for field in contract.fields:
            if field.kind != "long":
                continue
            low, high = field.bounds
            assert (low, high) == ((EPOCH_MS_MIN, EPOCH_MS_MAX) if field.name in TIME_FIELDS
                                   else (-2 ** 63, 2 ** 63 - 1)), (contract.name, field.name)


def test_the_bounds_themselves_are_valid_times():
    for edge in (EPOCH_MS_MIN, EPOCH_MS_MAX, 1.7e12):
        assert READING.validate(dict(GOOD, timestamp=edge))["timestamp"] == int(edge)


def test_an_error_message_stays_short_whatever_the_value():
    with pytest.raises(ContractError) as caught:
        READING.validate(dict(GOOD, timestamp=["x" * 100_000]))
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize("raw", [
    b'{"sensor_id": "s", "timestamp": 1e999, "temperature": 1, "unit": "C"}',
    b'{"sensor_id": "s", "timestamp": 1' + b"0" * 5000 + b', "temperature": 1, "unit": "C"}',
    b'{"sensor_id": "s", "timestamp": 1, "temperature": 1e999, "unit": "C"}',
    b'{"sensor_id": "\\ud800", "timestamp": 1, "temperature": 1, "unit": "C"}',
    DEEP, b'{"a": ' + DEEP + b"}", b"\xff{}", b"{\"a\": \"\xff\"}", b"", b"\x00",
])
def test_poison_documents_are_contract_errors(raw):
    with pytest.raises(ContractError):
        READING.validate(contracts.parse_json(raw))


@pytest.mark.parametrize(("raw", "why"), [
    (DEEP, "nested too deeply"),
    (b"1" * 5000, "4300"),               # Python's int-str limit
    (b"\xff", "Unicode"),
    (b"{not json", "Expecting"),
    (None, "NoneType"),
])
def test_parse_json_turns_every_failure_into_invalid_json(raw, why):
    with pytest.raises(contracts.InvalidJson, match=why):
        contracts.parse_json(raw)


def test_invalid_json_is_a_contract_error():
    assert issubclass(contracts.InvalidJson, ContractError)


def test_parse_json_is_json_loads_for_what_json_loads_takes():
    for raw in (b'{"a": 1, "b": [1.5, "\\u00fc"]}', '{"a": 1}'.encode("utf-16"), b"\xef\xbb\xbf{}", b"17", b"1e999"):
        assert contracts.parse_json(raw) == json.loads(raw)


@pytest.mark.parametrize("contract", list(contracts.CONTRACTS.values()), ids=lambda c: c.name)
@POISON_SETTINGS
@given(data=st.data())
def test_any_bytes_give_a_clean_record_or_a_contract_error(contract, data):
    raw = data.draw(any_document(contract))
    try:
        record = contract.validate(contracts.parse_json(raw))
    except ContractError as err:
        assert str(err) and len(str(err)) < 1000
        str(err).encode("utf-8")             # the reason goes into a Kafka header
    else:
        assert is_clean(contract, record), record
