"""Sensor ownership for the bridge: sensor_id -> device_id, from the compacted `sensor-registration` topic.

The bridge reads the topic (BRIDGE_SENSOR_OWNERS_TOPIC) from its beginning without
joining a consumer group: every partition is assigned at OFFSET_BEGINNING and nothing
is committed (librdkafka wants a group.id all the same; this one never joins). `load`
blocks until every partition was read up to the end it had when loading began, so
the bridge subscribes to MQTT only with the whole table; `poll` then takes what came
since without waiting, called from the bridge's loop, so a new registration counts
within about a second. The Kafka login is the bridge's own (kafka_auth.internal_config):
it needs READ on the topic, nothing on a group.

A record's key is the sensor id and its value a `sensor-registration` record naming
the device; a tombstone (no value) removes the sensor. The latest record of a sensor
decides, as compaction keeps it: a value that is no valid registration of its key
removes the sensor too (logged with the fix), so a restart sees what the live bridge saw.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from services.common import contracts, kafka_auth
from services.common.contracts import ContractError
from services.common.observability import kv

log = logging.getLogger("bridge.owners")

POLL_EVERY_S = 0.01          # poll() asks the consumer at most this often (the bridge's loop turns faster)
POLL_BATCH = 500
LOAD_RETRY_S = 2.0           # topic missing or Kafka unreachable at start: ask again after this
METADATA_TIMEOUT_S = 10.0


class SensorOwners:
    """The sensor_id -> device_id table (`owners`, one dict for the bridge's whole life: the router reads it)."""

    def __init__(self, bootstrap: str, topic: str, client_id: str):
        self.topic = topic
        self.owners: dict[str, str] = {}
        self.fatal: str | None = None        # a fatal consumer error: the table no longer follows the topic
        self._next_poll = 0.0
        self._log_after: dict[str, float] = {}
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "client.id": f"{client_id}-sensor-owners",
            "group.id": f"{client_id}-sensor-owners",       # required by librdkafka; never joined or committed
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            **kafka_auth.internal_config(),     # the bridge's principal: READ on the topic
        })

    def load(self, stopped: Callable[[], bool]) -> bool:
        """Read every partition up to the end it has now; False if `stopped()` came first."""
        watermarks = self._watermarks(stopped)
        if watermarks is None:
            return False
        ends = {p: high for p, (_low, high) in watermarks.items()}
        self.consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in ends])
        todo = {p for p, (low, high) in watermarks.items() if high > low}
        while todo:
            if stopped():
                return False
            for msg in self.consumer.consume(POLL_BATCH, timeout=0.5):
                self._take(msg)
                if msg.error() is None and msg.offset() >= ends[msg.partition()] - 1:
                    todo.discard(msg.partition())
                elif msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF:
                    todo.discard(msg.partition())
            if self.fatal:
                return False
            if todo:
                for tp in self.consumer.position([TopicPartition(self.topic, p) for p in todo]):
                    if tp.offset >= ends[tp.partition]:
                        todo.discard(tp.partition)
        log.info("sensor owners read to the end; subscribing to MQTT", extra=kv(
            topic=self.topic, sensors=len(self.owners), partitions=len(ends)))
        return True

    def _watermarks(self, stopped: Callable[[], bool]) -> dict[int, tuple[int, int]] | None:
        """partition -> (low, high) watermarks now; retried until the topic is readable."""
        while not stopped():
            try:
                metadata = self.consumer.list_topics(self.topic, timeout=METADATA_TIMEOUT_S).topics.get(self.topic)
                if metadata is not None and metadata.error is None and metadata.partitions:
                    return {p: self.consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                                   timeout=METADATA_TIMEOUT_S)
                            for p in metadata.partitions}
                why = metadata.error.str() if metadata is not None and metadata.error else "no partitions"
            except KafkaException as err:
                why = str(err.args[0])
            self._log_rarely("load", logging.WARNING, "sensor owners topic not readable yet; the bridge subscribes "
                             "to MQTT only once it has read it", topic=self.topic, error=why,
                             fix="create the topic (topics role) and grant the bridge's Kafka user READ on it, or "
                                 "unset BRIDGE_SENSOR_OWNERS_TOPIC")
            time.sleep(LOAD_RETRY_S)
        return None

    def poll(self) -> None:
        """Take the registrations that came since, without waiting (every POLL_EVERY_S at most)."""
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_EVERY_S
        for msg in self.consumer.consume(POLL_BATCH, timeout=0):
            self._take(msg)

    def _take(self, msg) -> None:
        error = msg.error()
        if error is not None:
            if error.fatal() or error.code() == KafkaError._FATAL:
                self.fatal = f"fatal Kafka error reading {self.topic}: {error}"
            # The group is never used, so the bridge has no rights on it; librdkafka still asks for its coordinator.
            elif error.code() not in (KafkaError._PARTITION_EOF, KafkaError.GROUP_AUTHORIZATION_FAILED):
                self._log_rarely(f"error-{error.code()}", logging.WARNING, "sensor owners consumer error",
                                 topic=self.topic, error=error.str())
            return
        self.apply(msg.key(), msg.value())

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the topic: a registration sets its sensor's device, a tombstone removes the sensor."""
        if key is None:
            return
        sensor = key.decode("utf-8", "replace")
        if value is None:
            self.owners.pop(sensor, None)
            return
        try:
            record = contracts.SENSOR.validate(contracts.parse_json(value))
            if record["sensor_id"] != sensor:
                raise ContractError(f"{contracts.SENSOR.name}: key '{sensor}' differs from sensor_id "
                                    f"'{record['sensor_id']}' (key the record by sensor_id)")
        except ContractError as err:
            self.owners.pop(sensor, None)
            self._log_rarely("invalid", logging.WARNING, "invalid sensor registration: its sensor counts as not "
                             "registered", topic=self.topic, sensor=sensor[:100], error=str(err)[:300],
                             fix="register the sensor again with iot-registrar")
            return
        self.owners[sensor] = record["device_id"]

    def close(self) -> None:
        self.consumer.close()

    def _log_rarely(self, key: str, level: int, msg: str, **fields) -> None:
        now = time.monotonic()
        if now >= self._log_after.get(key, 0.0):
            self._log_after[key] = now + 10.0
            log.log(level, msg, extra=kv(**fields))
