"""The registrar's reader takes any file: valid registrations, or a RegistryError saying where and why
(issue 12, case 2). It never ends in a traceback, and nothing is produced from a file with an error."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.commands import registrar
from tests.unit.poison import DEEP, POISON_SETTINGS, any_document, is_clean


def _load(raw: bytes, suffix: str = ".json"):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"registry{suffix}"
        path.write_bytes(raw)
        return registrar.load_file(path)


@pytest.mark.parametrize(("raw", "suffix", "why"), [
    (b'{"devices": [{"device_id": "d1", "name": "n", "location": 1e999}]}', ".json", "devices\\[1\\]"),
    (b'{"devices": [{"device_id": "d1", "name": ' + DEEP + b"}]}", ".json", "not valid JSON"),
    (b'{"devices": [{"device_id": ' + b"1" * 5000 + b', "name": "n"}]}', ".json", "not valid JSON"),
    (b'{"devices": [{"device_id": "d\xff", "name": "n"}]}', ".json", "not valid JSON"),
    (b'{"devices": [{"device_id": "d\\ud800", "name": "n"}]}', ".json", "Unicode text"),
    (b"[]", ".json", "expected an object"),
    (b"17", ".json", "expected an object"),
    (b'{"devices": {"device_id": "d1"}}', ".json", "'devices' must be a list"),
    (b'{"devices": 5}', ".json", "'devices' must be a list"),
    (b"a = " + b"[" * 5000 + b"]" * 5000, ".toml", "not valid TOML"),
    (b'devices = "\xff"', ".toml", "not valid TOML"),
])
def test_a_poison_registry_file_is_a_registry_error_naming_the_problem(raw, suffix, why):
    with pytest.raises(registrar.RegistryError, match=why):
        _load(raw, suffix)


@st.composite
def _registry_files(draw) -> bytes:
    parts = []
    for section, (_topic, contract) in registrar.SECTIONS.items():
        if draw(st.booleans()):
            items = draw(st.lists(any_document(contract), max_size=3))
            parts.append(f'"{section}": ['.encode() + b",".join(items) + b"]")
    return b"{" + b",".join(parts) + b"}"


@POISON_SETTINGS
@given(raw=_registry_files() | st.binary(max_size=64), suffix=st.sampled_from([".json", ".toml"]))
def test_any_registry_file_gives_valid_registrations_or_a_registry_error(raw, suffix):
    try:
        records = _load(raw, suffix)
    except registrar.RegistryError as err:
        assert str(err)
        return
    contracts_by_topic = {topic: contract for topic, contract in registrar.SECTIONS.values()}
    for topic, items in records.items():
        assert items and all(is_clean(contracts_by_topic[topic], item) for item in items)
