"""Whatever an MQTT message carries, the bridge's record fits Kafka (issue 26).

A record Kafka refuses for its size is never taken: before issue 26 a reading with
~1 MB of MQTT v5 user properties could be written neither to its topic nor, as a
dead letter, to `dead-letter`, and the bridge retried it every second while its
window filled and the whole site's ingestion stopped. So the router (and the
dead-letter builder behind it) must turn any topic, payload and user properties,
any count and size of them, into a record within BRIDGE_MAX_RECORD_BYTES whose
header names Kafka's client can encode, and never raise.

The record's size is counted here independently of services.common.dead_letter:
key + value + every header's name (UTF-8) and value.
"""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from services.bridge.routing import REASONS, Router
from services.bridge.rules import DEFAULT_RULES, Mapping
from services.common import contracts, names
from services.common.dead_letter import MIN_RECORD_BYTES, dead_letter
from tests.unit.poison import POISON_SETTINGS, any_document

MAPPING = Mapping.from_dicts(DEFAULT_RULES)
MB = 1_000_000

# Any Unicode, lone surrogates included (the MQTT client replaces bad UTF-8, so those come only from code).
ANY_TEXT = st.text(alphabet=st.characters(exclude_categories=()), max_size=40)
# Large texts are made by repetition: hypothesis cannot draw megabytes character by character.
LARGE_TEXT = st.tuples(ANY_TEXT, st.integers(min_value=0, max_value=3 * MB)).map(
    lambda t: (t[0] or "v") * (t[1] // max(1, len((t[0] or "v").encode("utf-8", "surrogatepass")))))
TEXT = ANY_TEXT | LARGE_TEXT | st.sampled_from([names.HEADER_SITE, names.HEADER_INGEST_MS, names.HEADER_MQTT_TOPIC,
                                                names.HEADER_DLQ_REASON, names.HEADER_DLQ_SOURCE, ""])
USER_PROPERTIES = st.none() | st.lists(st.tuples(TEXT, TEXT), max_size=20) | st.one_of(
    # as the reading: 17 properties of 60 kB
    st.just([(f"p{i}", "v" * 60_000) for i in range(17)]),
    # many tiny ones: what counts there is each header's own overhead
    st.integers(min_value=0, max_value=200_000).map(lambda n: [("a", "")] * n),
)
SEGMENT = ANY_TEXT.filter(lambda s: "/" not in s) | st.integers(min_value=1, max_value=70_000).map(lambda n: "s" * n)
TOPICS = st.one_of(
    st.builds(lambda site, device, sensor: names.MQTT_READINGS.format(site=site, device_id=device, sensor_id=sensor),
              st.sampled_from(["site-a", "site-b"]) | SEGMENT, st.sampled_from(["d1", "d2"]) | SEGMENT,
              st.sampled_from(["7", "8"]) | SEGMENT),
    ANY_TEXT, LARGE_TEXT.map(lambda t: t[:200_000]),
)
PAYLOADS = st.one_of(
    any_document(contracts.READING),
    st.builds(lambda fields: json.dumps({"timestamp": 1, "temperature": 2.5, "unit": "C", **fields}).encode(),
              st.fixed_dictionaries({}, optional={"sensor_id": SEGMENT, "device_id": SEGMENT})),
    st.integers(min_value=0, max_value=3 * MB).map(lambda n: b"x" * n),
)
BOUNDS = st.sampled_from([MIN_RECORD_BYTES, 65_536, 900_000]) | st.integers(min_value=MIN_RECORD_BYTES,
                                                                          max_value=2 * MB)
OWNERS = st.none() | st.dictionaries(st.sampled_from(["7", "8"]), st.sampled_from(["d1", "d2"]))


def _size(record) -> int:
    """key + value + every header's name and value, in bytes."""
    headers = sum(len(k.encode("utf-8")) + len(v or b"") for k, v in record.headers)
    return len(record.key) + len(record.value or b"") + headers


def _check(record, bound: int) -> None:
    assert _size(record) <= bound, (record.topic, record.reason, _size(record))
    assert isinstance(record.key, bytes) and isinstance(record.value, bytes)
    for name, value in record.headers:
        name.encode("utf-8")                    # what the producer does with it: never raises
        assert isinstance(value, bytes)
    if record.reason is not None:
        assert record.topic == "dead-letter" and record.reason in REASONS
        assert dict(record.headers)[names.HEADER_DLQ_REASON].decode().startswith(record.reason + ": ")


@POISON_SETTINGS
@given(topic=TOPICS, payload=PAYLOADS, user=USER_PROPERTIES, bound=BOUNDS, owners=OWNERS,
       max_payload=st.sampled_from([1024, 65_536, 4 * MB]))
def test_any_message_becomes_a_record_within_the_bound_and_routing_never_raises(topic, payload, user, bound, owners,
                                                                               max_payload):
    router = Router(MAPPING, "dead-letter", max_payload, "site-a", bound, owners)
    for _ in range(2):                          # the first call plans the topic, the second uses the plan
        _check(router.route(topic, payload, user, 1_700_000_000_000), bound)


@POISON_SETTINGS
@given(source=TOPICS, key=st.none() | st.binary(max_size=64) | TEXT, value=st.none() | PAYLOADS,
       headers=st.none() | st.lists(st.tuples(TEXT, TEXT.map(lambda t: t.encode("utf-8", "surrogatepass"))),
                                    max_size=20),
       detail=TEXT, bound=BOUNDS, where=st.none() | st.tuples(st.integers(0, 2 ** 31), st.integers(0, 2 ** 63)))
def test_any_dead_letter_fits_its_bound_whatever_it_carries(source, key, value, headers, detail, bound, where):
    partition, offset = where or (None, None)
    record = dead_letter("dead-letter", source, key, value, "unprocessable", detail, 1, headers, partition, offset,
                         max_bytes=bound)
    assert _size(record) <= bound
    for name, _ in record.headers:
        name.encode("utf-8")
    assert dict(record.headers)[names.HEADER_DLQ_REASON].startswith(b"unprocessable: ")
