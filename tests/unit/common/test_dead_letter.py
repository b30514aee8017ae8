"""The one dead-letter builder (services.common.dead_letter): key, bytes, and exactly the contract's headers."""
from __future__ import annotations

from services.common import names
from services.common.dead_letter import (
    DETAIL_LIMIT,
    DLQ_HEADERS,
    DLQ_VALUE_LIMIT,
    bounded_detail,
    dead_letter,
    dead_letter_headers,
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
