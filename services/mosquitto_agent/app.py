"""mosquitto-agent: Mosquitto's device table (the iot_gate plugin's) kept equal to `device-credentials`.

One thread does everything, as in the bridge: the lean MQTT client (services.mqtt.session) and a Kafka
Consumer polled without blocking, so the table, the requests in flight and the answers never race.

- The topic is read from its beginning with every partition assigned (no consumer group joins or commits).
  Each record sets or removes one device's line; one that does not parse counts as a removal (fail closed)
  and is logged as an error.
- Only once every partition has reached its end is the table complete and sent, whole, as a `snapshot` (again
  on every reconnect); later records go as `upsert` and `remove`. A refused request (ok=false) is logged with
  the plugin's text, and a full snapshot follows after a backoff.
- Health (/healthz): MQTT connected, the last snapshot acknowledged, Kafka answered within 30 s.

Tests: tests/unit/mosquitto_agent/, tests/integration/test_devices_and_agent.py. Part sizes, backoff and
statistics: docs/architecture.md, "Inside mosquitto-agent"."""
from __future__ import annotations

import json
import logging
import select
import sys
import time
from collections import deque
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from services.common import kafka_auth, names
from services.common.backoff import Backoff
from services.common.device_credentials import CredentialError, parse_credential
from services.common.observability import StopFlag, kv, metrics_tls, serve_http, setup_logging
from services.common.settings import SettingsError
from services.mosquitto_agent import metrics, protocol
from services.mosquitto_agent import settings as agent_settings
from services.mqtt.codec import reason_name
from services.mqtt.session import MqttSession, tls_context

log = logging.getLogger("mosquitto-agent")

KAFKA_HEALTHY_WITHIN_S = 30.0
RECONNECT_MIN_S, RECONNECT_MAX_S = 0.5, 10.0
RESYNC_MIN_S, RESYNC_MAX_S = 5.0, 300.0
ASSIGN_RETRY_S = 5.0
DRAIN_S = 2.0                 # on SIGTERM: longest wait for the plugin's answers to requests in flight
READ_BATCH = 1000             # records per consume call
READ_CALLS = 10               # consume calls per loop turn while records keep coming
SYS_FILTER = "$SYS/#"
CHANGES = (protocol.SNAPSHOT, protocol.UPSERT, protocol.REMOVE)


@dataclass
class Request:
    command: str
    devices: int              # device lines (or ids) it carries
    final: bool = False       # the last part of a snapshot
    table_size: int = 0       # a snapshot's devices in all
    sent_at: float = 0.0


class Agent:
    def __init__(self, s: agent_settings.AgentSettings, stop: StopFlag, consumer: Consumer | None = None,
                 figures: metrics.Figures = metrics.FIGURES):
        self.s, self.stop, self.figures = s, stop, figures
        self.table: dict[str, str] = {}                 # device id -> its plugin line
        self.changes: dict[str, str | None] = {}        # read since the snapshot went, not sent yet (None: remove)
        self.partitions: list[int] | None = None
        self.at_end: set[int] = set()
        self.caught_up = False
        self.read_started = time.monotonic()
        self.assign_at = 0.0
        self.kafka_ok_at = 0.0
        self.client: MqttSession | None = None
        self.connected = False
        self.reconnect_at = 0.0
        self.backoff = Backoff(RECONNECT_MIN_S, RECONNECT_MAX_S)
        self.snapshot_sent = False                      # on this connection
        self.snapshot_acked = False                     # the last snapshot sent was acknowledged whole
        self.pending: deque[Request] = deque()          # sent, answer awaited (the plugin answers in order)
        self.by_mid: dict[int, Request] = {}            # ... by packet id, until Mosquitto's PUBACK
        self.resync_at: float | None = None
        self.resync_backoff = Backoff(RESYNC_MIN_S, RESYNC_MAX_S)
        self.stats_at = 0.0
        self.answered_at = float("-inf")
        self.out_of_sync_since: float | None = time.monotonic()
        self.log_after: dict[str, float] = {}
        figures.up = self.mosquitto_up
        figures.sync_age = self.sync_age
        figures.memory_limit, figures.max_queued_messages = s.memory_limit, s.max_queued_messages
        self.consumer = consumer or Consumer({
            "bootstrap.servers": s.kafka_bootstrap, "client.id": s.client_id,
            # Never joined or committed (partitions are assigned); librdkafka requires the name.
            "group.id": f"{s.client_id}-no-commits", "enable.auto.commit": False,
            "enable.auto.offset.store": False, "auto.offset.reset": "earliest", "enable.partition.eof": True,
            "statistics.interval.ms": 5000, "stats_cb": self._kafka_stats, "error_cb": self._kafka_error,
            **kafka_auth.internal_config(),         # its own principal: READ on the credentials topic only
        })

    # ------------------------------------------------------------ Kafka

    def _assign(self) -> None:
        topic = self.s.credentials_topic
        try:
            meta = self.consumer.list_topics(topic, timeout=2.0).topics.get(topic)
        except KafkaException as err:
            meta, problem = None, str(err.args[0])
        else:
            problem = meta.error.str() if meta is not None and meta.error else "no partitions"
        if meta is None or meta.error is not None or not meta.partitions:
            self.assign_at = time.monotonic() + ASSIGN_RETRY_S
            self._log_rarely("assign", logging.WARNING, "cannot read the device table's topic yet; retrying",
                             topic=topic, bootstrap=self.s.kafka_bootstrap, problem=problem,
                             fix="the topics role creates it at each edge site; the agent's principal needs READ")
            return
        self.kafka_ok_at = time.monotonic()
        self.partitions = sorted(meta.partitions)
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in self.partitions])
        log.info("reading the device table", extra=kv(topic=topic, partitions=len(self.partitions)))

    def _read(self) -> int:
        """Consume what is there without waiting; returns records handled."""
        if self.partitions is None:
            if time.monotonic() >= self.assign_at:
                self._assign()
            return 0
        handled = 0
        for _ in range(READ_CALLS):
            batch = self.consumer.consume(READ_BATCH, timeout=0)
            for msg in batch:
                err = msg.error()
                if err is None:
                    self.kafka_ok_at = time.monotonic()
                    self.apply(msg.key(), msg.value())
                    handled += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    self.kafka_ok_at = time.monotonic()
                    self._reached_end(msg.partition())
                elif err.code() not in (KafkaError.GROUP_AUTHORIZATION_FAILED,):
                    self._log_rarely(f"consume-{err.code()}", logging.WARNING, "Kafka consumer error",
                                     error=err.str(), topic=self.s.credentials_topic)
            if len(batch) < READ_BATCH:
                break
        return handled

    def _reached_end(self, partition: int) -> None:
        self.at_end.add(partition)
        if not self.caught_up and self.partitions is not None and self.at_end >= set(self.partitions):
            self.caught_up = True
            log.info("device table read to its end", extra=kv(
                devices=len(self.table), took_s=round(time.monotonic() - self.read_started, 3)))

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """One record: set or remove its device's line; queued for the plugin once a snapshot went."""
        try:
            device = (key or b"").decode()
        except UnicodeDecodeError:
            log.error("device-credentials record with a key that is not UTF-8; ignored", extra=kv(key=repr(key)))
            return
        line = None
        if value is not None:
            try:
                line = protocol.device_line(device, parse_credential(device, value))
            except CredentialError as err:
                log.error("unreadable device record: the device is shut out until a valid record comes",
                          extra=kv(device=device, error=err,
                                   fix="write the device again with iot-devices (rotate, or remove and add)"))
        if self.table.get(device) == line:
            return
        if line is None:
            del self.table[device]
        else:
            self.table[device] = line
        if self.snapshot_sent:
            self.changes[device] = line
        self._mark_out_of_sync()

    def _kafka_stats(self, raw: str) -> None:
        brokers = json.loads(raw).get("brokers", {}).values()
        if any(b.get("state") == "UP" and b.get("nodeid", -1) >= 0 for b in brokers):
            self.kafka_ok_at = time.monotonic()

    def _kafka_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            return      # the unused group's coordinator lookup: the principal has no group rights, by design
        self._log_rarely(f"kafka-{err.code()}", logging.WARNING, "Kafka client error", error=err.str(),
                         bootstrap=self.s.kafka_bootstrap)

    # ------------------------------------------------------------ MQTT

    def _new_client(self) -> MqttSession:
        client = MqttSession(self.s.mqtt_host, self.s.mqtt_port, self.s.client_id, keepalive=self.s.keepalive_s,
                             username=self.s.mqtt_username, password=self.s.mqtt_password, session_expiry=0,
                             receive_maximum=100, tls=tls_context(self.s.mqtt_ca_file))
        client.on_connect, client.on_disconnect = self._on_connect, self._on_disconnect
        client.on_message, client.on_suback, client.on_puback = self._on_message, self._on_suback, self._on_puback
        return client

    def _reconnect(self) -> None:
        self.client = self._new_client()      # nothing of the old connection is resent (see the module doc)
        try:
            self.client.connect()
        except OSError as err:
            self.client = None
            delay = self.backoff.next()
            self.reconnect_at = time.monotonic() + delay
            self._log_rarely("mqtt-connect", logging.WARNING, "Mosquitto unreachable, retrying",
                             host=self.s.mqtt_host, port=self.s.mqtt_port, error=err, retry_in_s=delay)

    def _on_connect(self, _session_present: bool, code: int, _props: dict) -> None:
        if code >= 0x80:
            log.error("Mosquitto refused the agent's login", extra=kv(
                reason=reason_name(code), user=self.s.mqtt_username, client_id=self.s.client_id,
                fix="the mqtt_services file needs the agent account (kind agent, prefix mosquitto-agent-) with "
                    "the hash of the mqtt_password secret"))
            return
        self.connected = True
        self.backoff.reset()
        log.info("MQTT connected", extra=kv(host=self.s.mqtt_host, client_id=self.s.client_id))
        self.client.subscribe([SYS_FILTER, names.MQTT_GATE_RESPONSE], qos=1)
        self.stats_at = 0.0

    def _on_suback(self, _mid: int, codes: list[int]) -> None:
        for topic, code in zip([SYS_FILTER, names.MQTT_GATE_RESPONSE], codes, strict=False):
            if code >= 0x80:
                log.error("subscription refused", extra=kv(
                    filter=topic, reason=reason_name(code),
                    fix="the agent account must be of kind agent in the mqtt_services file"))

    def _on_disconnect(self, why: str) -> None:
        was = self.connected
        self.connected = self.snapshot_sent = self.snapshot_acked = False
        self.pending.clear()
        self.by_mid.clear()
        self.changes.clear()                 # the next snapshot carries them
        self.resync_at = None
        self.figures.forget_broker()
        self._mark_out_of_sync()
        delay = self.backoff.next()
        self.reconnect_at = time.monotonic() + delay
        if was:
            log.warning("MQTT disconnected", extra=kv(reason=why, retry_in_s=delay))
        else:
            self._log_rarely("mqtt-closed", logging.WARNING, "MQTT connection closed before it was up",
                             reason=why, retry_in_s=delay)

    def _on_message(self, topic: str, payload: bytes, mid: int, qos: int, _user) -> None:
        if qos:
            self.client.ack(mid)
        if topic == names.MQTT_GATE_RESPONSE:
            self.on_answer(payload)
        elif topic.startswith("$SYS/"):
            self.figures.set_sys(topic, payload)

    def _on_puback(self, mid: int, code: int) -> None:
        request = self.by_mid.pop(mid, None)
        if request is None or code < 0x80:
            return
        if request in self.pending:
            self.pending.remove(request)     # no answer will come for it
        metrics.PLUGIN_ERRORS.labels(request.command).inc()
        log.error("Mosquitto refused a control request", extra=kv(
            command=request.command, devices=request.devices, reason=reason_name(code),
            fix="the agent account may publish only to " + names.MQTT_GATE_CONTROL + "; a request larger than "
                "max_packet_size is refused (lower MOSQUITTO_AGENT_SNAPSHOT_CHUNK)"))
        if request.command in CHANGES:
            self._schedule_resync()

    # ------------------------------------------------------------ requests and answers

    def _publish(self, payload: bytes, request: Request) -> None:
        request.sent_at = time.monotonic()
        mid = self.client.publish(names.MQTT_GATE_CONTROL, payload, qos=1)
        self.pending.append(request)
        self.by_mid[mid] = request

    def _max_body(self) -> int:
        limit = self.client.server_max_packet if self.client is not None else None
        if not limit:
            return protocol.MAX_REQUEST_BYTES
        return min(protocol.MAX_REQUEST_BYTES, limit - protocol.PACKET_OVERHEAD)

    def send_snapshot(self) -> None:
        lines = [self.table[d] for d in sorted(self.table)]
        token = f"{int(time.time() * 1000):x}"
        requests = protocol.snapshot_requests(lines, token, self.s.snapshot_chunk, self._max_body())
        for i, payload in enumerate(requests, start=1):
            self._publish(payload, Request(protocol.SNAPSHOT, protocol.request_size(payload),
                                           final=i == len(requests), table_size=len(lines)))
        self.snapshot_sent, self.snapshot_acked = True, False
        self.changes.clear()
        log.info("snapshot sent", extra=kv(devices=len(lines), parts=len(requests), token=token))

    def send_changes(self) -> None:
        upserts = [line for line in self.changes.values() if line is not None]
        removes = [device for device, line in self.changes.items() if line is None]
        self.changes.clear()
        limit = self._max_body()
        for payload in protocol.remove_requests(removes, self.s.snapshot_chunk, limit):
            self._publish(payload, Request(protocol.REMOVE, protocol.request_size(payload)))
        for payload in protocol.upsert_requests(upserts, self.s.snapshot_chunk, limit):
            self._publish(payload, Request(protocol.UPSERT, protocol.request_size(payload)))

    def on_answer(self, payload: bytes) -> None:
        now = time.monotonic()
        try:
            answer = protocol.parse_answer(payload)
        except ValueError as err:
            log.error("unreadable answer from the iot_gate plugin", extra=kv(error=err))
            return
        self.answered_at = now
        self.figures.set_answer(answer)
        request = None
        while self.pending:
            candidate = self.pending.popleft()
            if candidate.command == answer.command:
                request = candidate
                break
            log.warning("no answer came to a request; a snapshot follows", extra=kv(command=candidate.command))
            if candidate.command in CHANGES:
                self._schedule_resync()
        if request is None:
            log.warning("answer to no request of this connection", extra=kv(command=answer.command, ok=answer.ok))
            return
        took_ms = round((now - request.sent_at) * 1000, 1)
        if not answer.ok:
            metrics.PLUGIN_ERRORS.labels(answer.command).inc()
            log.error("the iot_gate plugin refused a request", extra=kv(
                command=answer.command, error=answer.error, devices=request.devices,
                fix="see Mosquitto's log; a full snapshot follows"))
            if answer.command in CHANGES:
                self._schedule_resync()
        elif request.command == protocol.SNAPSHOT and request.final:
            self.snapshot_acked = True
            self.figures.devices_synced = request.table_size
            self.resync_backoff.reset()
            metrics.SNAPSHOTS.inc()
            log.info("snapshot acknowledged", extra=kv(devices=request.table_size, plugin_devices=answer.devices,
                                                       took_ms=took_ms))
        elif request.command in (protocol.UPSERT, protocol.REMOVE):
            log.info("device changes applied", extra=kv(command=request.command, devices=request.devices,
                                                        plugin_devices=answer.devices, took_ms=took_ms))
        self._check_in_sync()

    def _schedule_resync(self) -> None:
        if self.resync_at is None:
            delay = self.resync_backoff.next()
            self.resync_at = time.monotonic() + delay
            log.warning("full snapshot scheduled", extra=kv(in_s=delay))
        self._mark_out_of_sync()

    def _mark_out_of_sync(self) -> None:
        if self.out_of_sync_since is None:
            self.out_of_sync_since = time.monotonic()

    def _check_in_sync(self) -> None:
        if self.snapshot_acked and not self.changes and self.resync_at is None \
                and not any(r.command in CHANGES for r in self.pending):
            self.out_of_sync_since = None

    # ------------------------------------------------------------ loop

    def _due(self) -> None:
        """Requests whose time has come: the snapshot, changes, a resync, stats."""
        if not self.connected:
            return
        now = time.monotonic()
        if self.caught_up:
            if self.resync_at is not None and now >= self.resync_at:
                self.resync_at = None
                self.send_snapshot()
            elif not self.snapshot_sent:
                self.send_snapshot()
            elif self.changes:
                self.send_changes()
        if now >= self.stats_at:
            # One stats request at a time; one unanswered for 3 intervals is given up (mosquitto_up says 0).
            stale = now - 3 * self.s.stats_interval_s
            waiting = [r for r in self.pending if r.command == protocol.STATS]
            for request in waiting:
                if request.sent_at < stale:
                    self.pending.remove(request)
            if not any(r.sent_at >= stale for r in waiting):
                self.stats_at = now + self.s.stats_interval_s
                self._publish(protocol.STATS_REQUEST, Request(protocol.STATS, 0))

    def _io(self, timeout: float) -> None:
        client = self.client
        if client is None or client.sock is None:
            if not self.stop.is_set() and time.monotonic() >= self.reconnect_at:
                self._reconnect()
            else:
                time.sleep(min(timeout, 0.05))
            return
        wlist = [client.sock] if client.want_write() else []
        # Buffered work first: select does not wake for bytes TLS has already taken off the socket.
        readable = client.has_backlog() or select.select([client.sock], wlist, [], timeout)[0]
        if readable:
            client.read(1000)
        if client.sock is not None and client.want_write():
            client.write()
        client.misc()

    def mosquitto_up(self) -> bool:
        return self.connected and time.monotonic() - self.answered_at < 3 * self.s.stats_interval_s

    def sync_age(self) -> float:
        since = self.out_of_sync_since
        return 0.0 if since is None else round(time.monotonic() - since, 3)

    def health(self) -> tuple[bool, str]:
        kafka_age = time.monotonic() - self.kafka_ok_at
        ok = self.connected and self.snapshot_acked and kafka_age < KAFKA_HEALTHY_WITHIN_S
        return ok, (f"{'ok' if ok else 'unhealthy'} mqtt_connected={self.connected} "
                    f"table_read={self.caught_up} snapshot_acknowledged={self.snapshot_acked} "
                    f"kafka_last_answer_s={kafka_age:.1f} devices={len(self.table)} "
                    f"sync_age_s={self.sync_age():.1f}")

    def run(self) -> int:
        log.info("mosquitto-agent starting", extra=kv(
            client_id=self.s.client_id, mqtt=f"{self.s.mqtt_host}:{self.s.mqtt_port}", kafka=self.s.kafka_bootstrap,
            topic=self.s.credentials_topic))
        try:
            while not self.stop.is_set():
                busy = self._read() >= READ_BATCH
                self._due()
                self._io(0 if busy else 0.05)
        finally:
            self._drain()
            if self.client is not None:
                self.client.disconnect()
            self.consumer.close()
            log.info("mosquitto-agent stopped", extra=kv(unanswered=len(self.pending)))
        return 0

    def _drain(self) -> None:
        """On stop: wait (at most DRAIN_S) for the answers to what was sent, so the plugin does not answer a
        client that has just left: in the integration tests, Mosquitto 2.0.11 with the iot_gate plugin
        sometimes served nobody any more after the agent left with an answer outstanding."""
        deadline = time.monotonic() + DRAIN_S
        while self.connected and self.pending and time.monotonic() < deadline:
            self._io(0.05)

    def _log_rarely(self, key: str, level: int, msg: str, **fields) -> None:
        now = time.monotonic()
        if now >= self.log_after.get(key, 0.0):
            self.log_after[key] = now + 10.0
            log.log(level, msg, extra=kv(**fields))


def main(argv: list[str] | None = None) -> int:
    try:
        s = agent_settings.from_args(argv)
        setup_logging("mosquitto-agent", s.log_level)
        kafka_auth.internal_config()     # KAFKA_USERNAME without its password file, a missing CA: say so now
        if not s.mqtt_password:
            raise SettingsError("secret mqtt_password not found (mount it at /run/secrets/mqtt_password or set "
                                "MQTT_PASSWORD_FILE): the agent account's password")
    except SettingsError as err:
        print(f"iot-mosquitto-agent: {err}", file=sys.stderr)
        return 2
    stop = StopFlag()
    agent = Agent(s, stop)
    if s.metrics_port:
        serve_http(s.metrics_port, agent.health, metrics.exposition,
                   tls=metrics_tls(s.metrics_keystore, s.metrics_client_ca))
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
