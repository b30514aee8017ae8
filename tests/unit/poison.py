"""Poison input for the consumers' record paths: hypothesis strategies and the checks they share.

Every consumer (adapter, the bridge's command path, the registrar's reader, the
Spark jobs) must turn any bytes into either a usable record or a dead letter with
a reason, and never raise. These strategies produce what breaks parsers: any
bytes, any JSON (st.recursive), numbers that do not fit (1e999, NaN, 2**64,
10**400, ints over Python's 4300-digit limit), nesting deeper than the
recursion limit, lone surrogates and control characters.
"""
from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from services.common import contracts

# Bounded so the unit suite stays fast; no example database in the work tree.
POISON_SETTINGS = settings(max_examples=200, deadline=None, database=None,
                           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

LONG_MIN, LONG_MAX = -2 ** 63, 2 ** 63 - 1
# Event times (epoch ms) every store can hold: 0001-01-01 to 9999-12-31 UTC (Python's datetime; Spark's
# timestamp_millis overflows beyond +-9.2e15, Cassandra's `date` of the day partition beyond +-1.8e17).
EPOCH_MS_MIN, EPOCH_MS_MAX = -62_135_596_800_000, 253_402_300_799_999
TIME_FIELDS = frozenset({"timestamp", "first_transgression", "last_transgression", "window_start", "window_end"})
DEEP = b"[" * 100_000 + b"]" * 100_000          # far deeper than Python's recursion limit

# JSON tokens json.dumps never writes, each spliced into a document as a field value.
RAW_TOKENS = (
    b"1e999", b"-1e999", b"1e-999", b"NaN", b"Infinity", b"-Infinity", b"-0", b"1.0e18", b"9" * 400,
    b"1" + b"0" * 4400,                          # over Python's int-str limit: json.loads raises ValueError
    b'"\\ud800"', b'"\\udfff x"', b'"\\u0000"', b'"a\\u0001b"', b'"\\u009f"', b'"\\uffff"', b'"/+#"',
    b'"' + b"x" * 70_000 + b'"',                 # longer than an MQTT topic may be
    b"[" * 3000 + b"]" * 3000, b"{}", b"[]", b"true", b"null", b'""',
)

EXTREME_NUMBERS = st.sampled_from([
    math.inf, -math.inf, math.nan, 1e308, -1e308, 5e-324, 2.0 ** 63, -(2.0 ** 63), 1e18 + 0.5,
    2 ** 63, LONG_MAX, LONG_MIN, LONG_MIN - 1, 2 ** 64, 10 ** 400, -(10 ** 400), 2 ** 53 + 1,
    EPOCH_MS_MIN, EPOCH_MS_MAX, EPOCH_MS_MIN - 1, EPOCH_MS_MAX + 1,
    253_402_300_800_000 * 1000, 9_223_372_036_854_775, 0, -1,
]) | st.integers(min_value=-(2 ** 80), max_value=2 ** 80) | st.floats()

_TEXT = st.text(max_size=12) | st.sampled_from(["\ud800", "a\x00b", "\x01", "\x7f", "\u0085", "\ufdd0", "\uffff",
                                                 "d/1", "+", "#", "", "x" * 300])

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | EXTREME_NUMBERS | _TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_TEXT, children, max_size=4),
    max_leaves=12,
)


def bounds(field: contracts.Field) -> tuple[int, int]:
    return (EPOCH_MS_MIN, EPOCH_MS_MAX) if field.name in TIME_FIELDS else (LONG_MIN, LONG_MAX)


def valid_value(field: contracts.Field):
    """A value the field accepts (so that a document is often valid but for one field)."""
    if field.choices:
        return st.sampled_from(field.choices)
    if field.kind == "string":
        return st.text(alphabet=st.characters(codec="utf-8", categories=("L", "N")), min_size=1, max_size=8)
    if field.kind == "long":
        low, high = bounds(field)
        return st.integers(min_value=max(low, -(10 ** 15)), max_value=min(high, 10 ** 15))
    if field.kind == "double":
        return st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)
    return st.booleans()


_MISSING = object()


@st.composite
def contract_documents(draw, contract: contracts.Contract) -> bytes:
    """A JSON object with the contract's fields, each valid, missing, any JSON value or a raw poison token."""
    parts = []
    for field in contract.fields:
        choice = draw(st.sampled_from(("valid", "valid", "valid", "missing", "json", "extreme", "raw")))
        if choice == "missing":
            continue
        if choice == "raw":
            token = draw(st.sampled_from(RAW_TOKENS))
        elif choice == "extreme":
            token = json.dumps(draw(EXTREME_NUMBERS)).encode()
        else:
            value = draw(valid_value(field) if choice == "valid" else JSON_VALUES)
            token = json.dumps(value).encode()
        parts.append(json.dumps(field.name).encode() + b":" + token)
    return b"{" + b",".join(parts) + b"}"


def any_document(contract: contracts.Contract):
    """Bytes a consumer of `contract` may meet: mostly near-valid documents, else any JSON or any bytes."""
    return st.one_of(
        contract_documents(contract), contract_documents(contract),
        JSON_VALUES.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=64), st.binary(max_size=16).map(lambda b: b"{" + b),
        st.sampled_from([DEEP, b"{\"a\":" + DEEP + b"}", b"\xff\xfe", b"\xef\xbb\xbf{}", b"", b"{\"a\": 1e999}"]),
    )


def is_clean(contract: contracts.Contract, record: dict) -> bool:
    """A validated record every store can take: exactly the contract's fields, each of its type and in range."""
    if set(record) != set(contract.field_names()):
        return False
    for field in contract.fields:
        value = record[field.name]
        if value is None:
            if field.required:
                return False
        elif field.kind == "string":
            if type(value) is not str or not value:
                return False
            value.encode("utf-8")          # raises on a lone surrogate
        elif field.kind == "long":
            low, high = bounds(field)
            if type(value) is not int or not low <= value <= high:
                return False
        elif field.kind == "double":
            if type(value) is not float or not math.isfinite(value):
                return False
        elif type(value) is not bool:
            return False
    return True
