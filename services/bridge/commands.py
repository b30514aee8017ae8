"""Reverse path of the bridge: Kafka `device-commands` -> MQTT `sites/<site>/devices/<id>/commands`.

Each record is published at QoS 1; its offset is committed only once the broker
PUBACKed it (or, for an invalid command, once its dead-letter record is in Kafka),
and only as part of a gap-free prefix per partition (services.common.offsets, as in
the adapter), so a crash re-forwards rather than skips. Runs on the bridge's single
loop thread (the MQTT client's on_puback included).

Whatever a record's bytes, it is published or dead-lettered; nothing about one
record may raise out of here. That includes the topic: Mosquitto closes the
connection on a PUBLISH whose topic is not valid MQTT UTF-8, and the bridge would
send it again after every reconnect, stopping the readings too.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from services.bridge import metrics
from services.common import contracts, kafka_auth, names
from services.common.contracts import ContractError, InvalidJson, parse_json
from services.common.dead_letter import (
    CONTRACT_VIOLATION,
    INVALID_JSON,
    UNPROCESSABLE,
    DeadLetter,
    bounded_detail,
    dead_letter,
)
from services.common.observability import kv
from services.common.offsets import OffsetTracker, Partition
from services.common.site import resolve_site
from services.mqtt.codec import reason_name

log = logging.getLogger("bridge.commands")
_TOPIC_CHARS = ("/", "+", "#")
_MQTT_STRING_MAX = 65535        # bytes of an MQTT UTF-8 string (the topic of a PUBLISH)


def _mqtt_text_problem(text: str) -> str | None:
    """Why Mosquitto would refuse `text` in a topic (mosquitto_validate_utf8), or None.

    It refuses control characters (U+0000-U+001F, U+007F-U+009F) and the
    non-characters U+FDD0-U+FDEF and U+xxFFFE/U+xxFFFF; contracts already refuse
    lone surrogates."""
    for char in text:
        code = ord(char)
        if code <= 0x1F or 0x7F <= code <= 0x9F:
            return f"a control character (U+{code:04X})"
        if 0xFDD0 <= code <= 0xFDEF or (code & 0xFFFE) == 0xFFFE:
            return f"U+{code:04X}, which is not a character"
    return None


def command_topic(value: bytes, key: bytes | None, default_site: str | None) -> str:
    """MQTT topic for one `device-commands` record; raises ContractError (InvalidJson for bad JSON)."""
    record = contracts.DEVICE_COMMAND.validate(parse_json(value))
    device_id, site = record["device_id"], resolve_site(field=record["site"], default=default_site)
    if key is not None and key.decode(errors="replace") != device_id:
        raise ContractError(f"device-command: key '{key.decode(errors='replace')}' differs from "
                            f"device_id '{device_id}' (key the record by device_id)")
    if not site:
        raise ContractError("device-command: no site in the record and BRIDGE_SITE is unset (set either)")
    for name, text in (("device_id", device_id), ("site", site)):
        if any(c in text for c in _TOPIC_CHARS):
            raise ContractError(f"device-command: {name} {text[:80]!r} must not contain '/', '+' or '#'")
        problem = _mqtt_text_problem(text)
        if problem:
            raise ContractError(f"device-command: {name} {text[:80]!r} contains {problem}; MQTT topics cannot")
    topic = names.MQTT_COMMANDS.format(site=site, device_id=device_id)
    size = len(topic.encode("utf-8", "surrogatepass"))
    if size > _MQTT_STRING_MAX:
        raise ContractError(f"device-command: topic of {size} bytes is longer than MQTT's {_MQTT_STRING_MAX}")
    return topic


class CommandForwarder:
    def __init__(self, bootstrap: str, topic: str, group: str, client_id: str, dlq_topic: str,
                 default_site: str | None, dead_letter_sink: Callable[[DeadLetter, Callable[[], None]], None],
                 max_in_flight: int = 100, group_instance_id: str | None = None, session_timeout_ms: int = 45000,
                 max_record: int | None = None):
        self.topic, self.dlq_topic, self.default_site = topic, dlq_topic, default_site
        self.max_record = max_record              # bound of a dead letter (BRIDGE_MAX_RECORD_BYTES)
        self.dead_letter_sink = dead_letter_sink
        self.max_in_flight = max_in_flight
        self.fatal: str | None = None             # a fatal consumer error: the consumer is dead for good
        config = {
            "bootstrap.servers": bootstrap, "group.id": group, "client.id": f"{client_id}-commands",
            "session.timeout.ms": session_timeout_ms,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            **kafka_auth.internal_config(),     # the bridge's principal: reads device-commands in its group
        }
        if group_instance_id:
            # Static membership (BRIDGE_COMMANDS_GROUP_INSTANCE_ID). A second consumer with the same id
            # fences this one (FENCED_INSTANCE_ID, fatal): pump sets `fatal` and the bridge stops.
            config["group.instance.id"] = group_instance_id
        self.consumer = Consumer(config)
        self.consumer.subscribe([topic], on_revoke=self._revoked)
        self.tracker = OffsetTracker()            # a record is finished once PUBACKed or dead-lettered
        self.by_mid: dict[int, tuple[Partition, int]] = {}     # MQTT packet id -> ((topic, partition), offset)
        self.in_flight = 0

    def pump(self, client) -> None:
        """Forward what the consumer has, within the in-flight bound. Call only while MQTT is connected."""
        room = self.max_in_flight - self.in_flight
        if room <= 0:
            return
        for msg in self.consumer.consume(num_messages=min(room, 100), timeout=0):
            if msg.error():
                error = msg.error()
                if error.fatal() or error.code() == KafkaError._FATAL:
                    # librdkafka's fatal consumer error comes as a record with code _FATAL (fatal() stays false).
                    self.fatal = f"fatal Kafka command consumer error: {error}"
                    return
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("command consumer error", extra=kv(error=str(error)))
                continue
            self._forward(client, msg)

    def _forward(self, client, msg: Message) -> None:
        tp, offset = (msg.topic(), msg.partition()), msg.offset()
        self.tracker.consumed(tp, offset)
        self.in_flight += 1
        value = msg.value() or b""
        try:
            topic = command_topic(value, msg.key(), self.default_site)
        except Exception as err:  # noqa: BLE001 - one record's data must never stop the bridge
            if isinstance(err, InvalidJson):
                reason = INVALID_JSON
            elif isinstance(err, ContractError):
                reason = CONTRACT_VIOLATION
            else:
                reason, err = UNPROCESSABLE, f"{type(err).__name__}: {err}"
            detail = bounded_detail(str(err))
            record = dead_letter(self.dlq_topic, tp[0], msg.key(), value, reason, detail,
                                 int(time.time() * 1000), list(msg.headers() or ()), tp[1], offset,
                                 max_bytes=self.max_record)
            log.warning("command dead-lettered", extra=kv(reason=reason, detail=detail[:300], offset=offset))
            metrics.COMMANDS_DEAD_LETTERED.inc()
            self.dead_letter_sink(record, lambda: self._done(tp, offset))
            return
        mid = client.publish(topic, value, qos=1)
        self.by_mid[mid] = (tp, offset)

    def on_publish(self, mid: int, reason_code: int) -> None:
        """The broker's PUBACK of a forwarded command (MqttSession.on_puback)."""
        entry = self.by_mid.pop(mid, None)
        if entry is None:
            return
        if reason_code >= 0x80:          # e.g. not authorised by the ACL: still the broker's final answer
            log.warning("command refused by broker", extra=kv(reason=reason_name(reason_code), offset=entry[1]))
        else:
            metrics.COMMANDS.inc()
        self._done(*entry)

    def _done(self, tp: Partition, offset: int) -> None:
        """One command is finished (PUBACKed or dead-lettered): commit whatever prefix became gap-free."""
        self.in_flight -= 1
        self.tracker.finished(tp, offset)
        commits = self.tracker.take_commits()
        if commits:
            self.consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in commits.items()],
                                 asynchronous=True)

    def _revoked(self, _consumer, partitions) -> None:
        # Uncommitted commands of a revoked partition are forwarded again by its next owner.
        for tp in partitions:
            self.tracker.drop((tp.topic, tp.partition))

    def close(self) -> None:
        self.consumer.close()
