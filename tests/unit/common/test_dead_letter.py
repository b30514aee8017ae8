"""The one dead-letter builder (services.common.dead_letter): key, bytes, and exactly the contract's headers."""
from __future__ import annotations

import pytest

from services.common import names
from services.common.dead_letter import (
    DETAIL_LIMIT,
    DLQ_HEADERS,
    DLQ_VALUE_LIMIT,
    HEADER_OVERHEAD,
    MIN_RECORD_BYTES,
    bounded_detail,
    dead_letter,
    dead_letter_headers,
    record_bytes,
)


def test_dlq_headers_are_the_four_of_the_contract():
    assert DLQ_HEADERS == {names.HEADER_DLQ_SOURCE, names.HEADER_DLQ_REASON, names.HEADER_DLQ_TIME_MS,
                           names.HEADER_DLQ_OFFSET}


def test_kafka_sourced_dead_letter_keeps_key_bytes_and_headers_and_says_where_the_record_was():
    record = dead_letter("dead-letter", "temperature-data", b"s-1", b"{nope", "invalid_json", "payload is not JSON",
                         42, [("site", b"site-a"), (names.HEADER_DLQ_REASON, b"from an earlier round")],
                         partition=3, offset=17)
    assert (record.topic, record.key, record.value, record.reason) == ("dead-letter", b"s-1", b"{nope", "invalid_json")
    assert record.headers == [("site", b"site-a"),
                              (names.HEADER_DLQ_SOURCE, b"temperature-data"),
                              (names.HEADER_DLQ_REASON, b"invalid_json: payload is not JSON"),
                              (names.HEADER_DLQ_TIME_MS, b"42"),
                              (names.HEADER_DLQ_OFFSET, b"3:17")]


def test_mqtt_sourced_dead_letter_has_no_offset_and_is_keyed_by_its_topic_without_a_key():
    record = dead_letter("dead-letter", "sites/a/devices/d1/sensors/7/temperature", None, b"x", "unmapped",
                         "no rule", 1)
    assert record.key == b"sites/a/devices/d1/sensors/7/temperature"
    assert [k for k, _ in record.headers] == [names.HEADER_DLQ_SOURCE, names.HEADER_DLQ_REASON,
                                              names.HEADER_DLQ_TIME_MS]


def test_str_key_is_encoded_and_a_tombstone_stays_without_value():
    record = dead_letter("dlq", "t", "k", None, "unmapped", "no table", 1, None, 0, 5)
    assert (record.key, record.value) == (b"k", None)


def test_value_above_the_limit_is_cut_and_the_reason_says_so():
    record = dead_letter("dlq", "t", None, b"x" * (DLQ_VALUE_LIMIT + 10), "oversized", "too big", 1)
    assert len(record.value) == DLQ_VALUE_LIMIT
    reason = dict(record.headers)[names.HEADER_DLQ_REASON].decode()
    assert reason == f"oversized: too big (value cut to its first {DLQ_VALUE_LIMIT} of {DLQ_VALUE_LIMIT + 10} bytes)"


def test_headers_helper_is_what_the_builder_uses():
    headers = [("a", b"1"), (names.HEADER_DLQ_OFFSET, b"0:0")]
    assert dead_letter_headers("src", "r", "d", 7, headers, 1, 2) == dead_letter("q", "src", b"k", b"v", "r", "d", 7,
                                                                                 headers, 1, 2).headers


def test_detail_is_cut_at_the_limit_and_marked():
    assert bounded_detail("short: fix it") == "short: fix it"
    assert bounded_detail("x" * DETAIL_LIMIT) == "x" * DETAIL_LIMIT
    assert bounded_detail("x" * (DETAIL_LIMIT + 1)) == "x" * DETAIL_LIMIT + "..."


def test_detail_is_always_encodable_utf8_whatever_the_record_held():
    # A lone surrogate (bytes decoded with surrogateescape, say) would make the header's .encode() raise.
    detail = bounded_detail("bad \udcff here, ü stays")
    assert detail == "bad \\udcff here, ü stays"
    record = dead_letter("q", "t", b"k", b"v", "r", detail, 1)
    assert dict(record.headers)[names.HEADER_DLQ_REASON] == "r: bad \\udcff here, ü stays".encode()


# ------------------------------------------------------------------ bounded by the whole record (issue 26)

TOPIC = "sites/site-a/devices/d1/sensors/7/temperature"
OURS = [(names.HEADER_MQTT_TOPIC, TOPIC.encode()), (names.HEADER_SITE, b"site-a"), (names.HEADER_INGEST_MS, b"5")]
DEVICE_HEADERS = [(f"p{i}", b"v" * 60_000) for i in range(17)]          # MQTT user properties, ~1 MB


def _reason(record) -> str:
    return dict(record.headers)[names.HEADER_DLQ_REASON].decode()


def test_record_bytes_counts_key_value_every_header_name_and_value_and_their_length_fields():
    assert record_bytes(b"k", b"vv", [("ab", b"xyz"), ("ü", b"")]) == 1 + 2 + (2 + 3) + (2 + 0) + 2 * HEADER_OVERHEAD
    assert record_bytes(None, None, []) == 0


def test_a_bounded_dead_letter_that_fits_is_the_plain_one():
    args = ("dead-letter", TOPIC, b"7", b"{nope", "invalid_json", "payload is not JSON", 9, OURS)
    assert dead_letter(*args, max_bytes=900_000) == dead_letter(*args)


def test_the_headers_that_came_with_the_message_are_dropped_first_and_the_reason_says_so():
    record = dead_letter("dead-letter", TOPIC, b"7", b"{nope", "invalid_json", "payload is not JSON", 9,
                         DEVICE_HEADERS + OURS, max_bytes=900_000)
    assert record.value == b"{nope" and record.key == b"7"
    assert [k for k, _ in record.headers] == [names.HEADER_MQTT_TOPIC, names.HEADER_SITE, names.HEADER_INGEST_MS,
                                              names.HEADER_DLQ_SOURCE, names.HEADER_DLQ_REASON,
                                              names.HEADER_DLQ_TIME_MS]
    assert _reason(record) == ("invalid_json: payload is not JSON (dropped the 17 headers that came with the "
                               "message (1020211 bytes, e.g. MQTT user properties); to fit 900000 bytes)")
    assert record_bytes(record.key, record.value, record.headers) <= 900_000


def test_then_the_value_is_cut_and_the_reason_says_how_much_is_left():
    value = b"x" * 950_000
    record = dead_letter("dead-letter", TOPIC, b"7", value, "oversized", "too big", 9, DEVICE_HEADERS + OURS,
                         max_bytes=900_000)
    size = record_bytes(record.key, record.value, record.headers)
    assert 899_000 < size <= 900_000 and value.startswith(record.value)
    assert f"value cut to its first {len(record.value)} of 950000 bytes" in _reason(record)
    assert dict(record.headers)[names.HEADER_SITE] == b"site-a"               # our own headers stay


def test_under_the_smallest_bound_our_headers_the_key_and_the_source_go_too_and_it_still_fits():
    long_topic = "t/" + "ü" * 40_000                                      # 80 kB in UTF-8
    record = dead_letter("dead-letter", long_topic, None, b"x" * 5000, "unmapped", "no rule " + long_topic, 9,
                         [(names.HEADER_MQTT_TOPIC, long_topic.encode())], partition=1, offset=2,
                         max_bytes=MIN_RECORD_BYTES)
    reason = _reason(record)
    assert record_bytes(record.key, record.value, record.headers) <= MIN_RECORD_BYTES
    assert record.value == b"" and "dropped 1 more headers" in reason and "key cut to its first" in reason
    assert "source cut to its first" in reason and dict(record.headers)[names.HEADER_DLQ_OFFSET] == b"1:2"
    assert len(reason) < DETAIL_LIMIT + 500                                  # the detail itself is bounded too


def test_a_tombstone_stays_a_tombstone_when_bounded():
    record = dead_letter("dlq", "t", b"k", None, "unmapped", "no table", 1, DEVICE_HEADERS, 0, 5, max_bytes=900_000)
    assert record.value is None and record_bytes(record.key, record.value, record.headers) <= 900_000


def test_a_bound_below_the_minimum_is_refused():
    with pytest.raises(ValueError, match=f"below the minimum {MIN_RECORD_BYTES}"):
        dead_letter("dlq", "t", b"k", b"v", "r", "d", 1, max_bytes=MIN_RECORD_BYTES - 1)
