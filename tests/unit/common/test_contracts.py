"""Contracts: validation names the problem, units convert correctly, Spark schemas follow the fields."""
from __future__ import annotations

import math

import pytest

from services.common import contracts
from services.common.contracts import READING, ContractError


@pytest.mark.parametrize("value, unit, celsius", [
    (0.0, "C", 0.0), (32.0, "F", 0.0), (212.0, "F", 100.0), (-40.0, "F", -40.0),
    (273.15, "K", 0.0), (0.0, "K", -273.15), (98.6, "F", 37.0),
])
def test_to_celsius(value, unit, celsius):
    assert math.isclose(contracts.to_celsius(value, unit), celsius, abs_tol=1e-9)


@pytest.mark.parametrize("unit", contracts.UNITS)
@pytest.mark.parametrize("celsius", [-40.0, 0.0, 21.5, 100.0])
def test_from_celsius_inverts_to_celsius(unit, celsius):
    assert math.isclose(contracts.to_celsius(contracts.from_celsius(celsius, unit), unit), celsius, abs_tol=1e-9)


def test_unknown_unit_is_named_with_the_choices():
    with pytest.raises(ContractError, match=r"unknown unit 'R' \(expected C, F or K\)"):
        contracts.to_celsius(1.0, "R")


def test_valid_reading_is_typed_and_trimmed_to_contract_fields():
    clean = READING.validate({"sensor_id": 7, "timestamp": 1700000000000, "temperature": 21,
                              "unit": "C", "extra": "dropped"})
    assert clean == {"sensor_id": "7", "timestamp": 1700000000000, "temperature": 21.0, "unit": "C",
                     "device_id": None}


def test_a_reading_may_name_its_device_and_older_readings_without_one_stay_valid():
    base = {"sensor_id": "7", "timestamp": 1, "temperature": 1.0, "unit": "C"}
    assert READING.validate({**base, "device_id": "d1"})["device_id"] == "d1"
    assert READING.validate(base)["device_id"] is None
    with pytest.raises(ContractError, match="'device_id' must not be empty"):
        READING.validate({**base, "device_id": ""})


@pytest.mark.parametrize("record, reason", [
    ({"timestamp": 1, "temperature": 1.0, "unit": "C"}, "missing field 'sensor_id'"),
    ({"sensor_id": "7", "timestamp": 1, "temperature": "warm", "unit": "C"}, "'temperature' must be a finite number"),
    ({"sensor_id": "7", "timestamp": 1, "temperature": float("nan"), "unit": "C"}, "finite number"),
    ({"sensor_id": "7", "timestamp": 1, "temperature": True, "unit": "C"}, "finite number"),
    ({"sensor_id": "7", "timestamp": 1, "temperature": 1.0, "unit": "X"}, r"unknown value 'X' \(expected C, F, K\)"),
    ({"sensor_id": "7", "timestamp": 1.5, "temperature": 1.0, "unit": "C"}, "'timestamp' must be an integer"),
    ({"sensor_id": "", "timestamp": 1, "temperature": 1.0, "unit": "C"}, "'sensor_id' must not be empty"),
    ([1, 2], "expected a JSON object, got list"),
])
def test_invalid_reading_names_the_problem(record, reason):
    with pytest.raises(ContractError, match=reason):
        READING.validate(record)


def test_optional_fields_may_be_absent():
    assert contracts.DEVICE.validate({"device_id": "d1", "name": "press"}) == {
        "device_id": "d1", "name": "press", "description": None, "location": None}


def test_spark_ddl_lists_every_field_with_its_type():
    assert contracts.spark_ddl("temperature-reading") == (
        "`sensor_id` STRING, `timestamp` BIGINT, `temperature` DOUBLE, `unit` STRING, `device_id` STRING")


def test_unknown_contract_lists_known_ones():
    with pytest.raises(ContractError, match="unknown contract 'nope' .*temperature-reading"):
        contracts.contract("nope")
