"""The MQTT-to-Kafka bridge: at-least-once from the device's PUBACK to Kafka's acks=all.

A message is PUBACKed only after its Kafka record (or its dead-letter record) was acknowledged, in arrival
order (window.Window); at most `window` messages are unacked, announced as MQTT v5 Receive Maximum. Input
that can never be produced goes to `dead-letter` (routing, services.common.dead_letter) and is acked once
that record is in Kafka. A Kafka or MQTT failure leaves messages unacked, so Mosquitto redelivers them:
duplicates are possible, loss is not (tests/integration/test_bridge.py; the window:
tests/unit/bridge/test_bridge.py). On SIGTERM it hands its share to a running peer (BRIDGE_PEERS_DNS) or
keeps its subscription, and stops within BRIDGE_DRAIN_S (docs/faults.md, "Bridge replicas", names the tests).

One thread does everything: MQTT I/O (services.mqtt.session, driven from this loop: select, read, write,
misc), the producer's delivery reports (`poll`) and the command consumer, so message handling, delivery
reports, PUBACKs and reconnects never race, and a PUBACK never reaches a newer connection than its message's.

Why, and every failure case: docs/architecture.md ("Inside the bridge", "Dead letters") and docs/faults.md."""
from __future__ import annotations

import json
import logging
import select
import socket
import sys
import time
from functools import partial

from confluent_kafka import KafkaError, Producer

from services.bridge import metrics
from services.bridge import settings as bridge_settings
from services.bridge.commands import CommandForwarder
from services.bridge.owners import SensorOwners
from services.bridge.routing import KAFKA_REJECTED, Record, Router
from services.bridge.rules import DEFAULT_RULES, Mapping, MappingError
from services.bridge.window import Entry, Window
from services.common import kafka_auth, names
from services.common.backoff import Backoff
from services.common.dead_letter import UNPROCESSABLE, DeadLetter, dead_letter
from services.common.observability import StopFlag, kv, metrics_tls, serve_http, setup_logging
from services.common.settings import SettingsError
from services.mqtt.codec import reason_name
from services.mqtt.session import MqttSession, tls_context

log = logging.getLogger("bridge")

# Errors no retry can fix: such a record goes to dead-letter instead, such a dead letter is dropped.
# _INVALID_ARG: produce() itself refused the record's arguments (see _send); it would again.
_PERMANENT = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE, KafkaError.RECORD_LIST_TOO_LARGE,
              KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG, KafkaError._INVALID_ARG}
_TOO_LARGE = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE, KafkaError.RECORD_LIST_TOO_LARGE}
RETRY_DELAY_S = 1.0
# MQTT reconnect backoff; why the cap is short: docs/faults.md, "Other connection faults the bridge reports".
RECONNECT_MIN_S, RECONNECT_MAX_S = 0.25, 2.0
KAFKA_HEALTHY_WITHIN_S = 30.0
HANDOVER_QUIET_S = 1.0     # hand-over: the session's queue is empty once nothing came for this long
READ_BATCH = 1000          # messages handed over per loop turn before serving Kafka again


def producer_config(s: bridge_settings.BridgeSettings) -> dict:
    return {
        "bootstrap.servers": s.kafka_bootstrap, "client.id": s.client_id,
        "enable.idempotence": True, "acks": "all",
        "linger.ms": s.kafka_linger_ms, "batch.num.messages": 10000, "batch.size": 1048576,
        "compression.type": "lz4",
        "message.timeout.ms": s.kafka_message_timeout_ms,
        # The window bounds what is queued; this only has to be larger.
        "queue.buffering.max.messages": max(100000, 4 * s.window),
        "statistics.interval.ms": 5000,
        # librdkafka refuses a record above this itself (default 1000000); the bound is BRIDGE_MAX_RECORD_BYTES.
        "message.max.bytes": max(1_000_000, s.max_record_bytes),
        **kafka_auth.internal_config(),     # its own principal: writes readings and dead letters only
    }


class Bridge:
    def __init__(self, s: bridge_settings.BridgeSettings, mapping: Mapping, stop: StopFlag,
                 producer: Producer | None = None):
        self.s, self.stop = s, stop
        self.owners = SensorOwners(s.kafka_bootstrap, s.sensor_owners_topic, s.client_id) \
            if s.sensor_owners_topic else None
        self.router = Router(mapping, s.dead_letter_topic, s.max_payload_bytes, s.site, s.max_record_bytes,
                             self.owners.owners if self.owners else None)
        self.subscriptions = [f"$share/{s.share_group}/{sub}" for sub in mapping.subscriptions()]
        self.window = Window(s.window)
        # Readings in flight and nothing to read: the loop waits for Kafka's delivery reports, which librdkafka
        # gives no file descriptor to select on, so it polls. Every 1 ms, a bridge at 20 readings/s spun about
        # 500 turns a second (strace in the lab: 4,882 pselect6 in 10 s, 0.07 core); a report cannot come much
        # sooner than the producer's linger after the last record, so that is the wait (5 ms by default), and
        # it delays a device's PUBACK by at most that.
        self.in_flight_wait_s = max(0.001, s.kafka_linger_ms / 1000)
        self.connected = False
        self.subscribed = False           # every filter granted at QoS 1 on this connection
        self.subscription_problem: str | None = None
        self.had_session = False          # a subscribed session existed in this process (to tell a lost one)
        self.fatal: str | None = None
        self.owners_loaded = False        # the sensor owners table was read to its end (or there is none)
        self.kafka_ok_at = 0.0
        self.reconnect_at = 0.0
        self.backoff = Backoff(RECONNECT_MIN_S, RECONNECT_MAX_S)     # reset only once subscribed
        self.retries: list[tuple[float, int]] = []
        self.handing_over = False         # SIGTERM with another replica up: unsubscribed, emptying the session
        self.last_message_at = 0.0
        self.log_after: dict[str, float] = {}
        # Metrics counted in plain ints on the hot path, pushed once per loop turn (_push_metrics).
        self._received = 0
        self._acked = 0
        self._produced: dict[str, int] = {}
        self._dead: dict[str, int] = {}
        self._dropped = 0                 # dead letters dropped since the last log line about it
        metrics.WINDOW_SIZE.set(s.window)
        self.producer = producer or Producer({**producer_config(s), "error_cb": self._kafka_error,
                                              "stats_cb": self._kafka_stats})
        self.client = self._mqtt_client()
        self.commands = None
        if s.commands_topic:
            self.commands = CommandForwarder(s.kafka_bootstrap, s.commands_topic, s.commands_group, s.client_id,
                                             s.dead_letter_topic, s.site, self._produce_dead_letter,
                                             group_instance_id=s.commands_group_instance_id,
                                             session_timeout_ms=s.commands_session_timeout_ms,
                                             max_record=s.max_record_bytes)
            self.client.on_puback = self.commands.on_publish

    # ------------------------------------------------------------ MQTT

    def _mqtt_client(self) -> MqttSession:
        client = MqttSession(self.s.mqtt_host, self.s.mqtt_port, self.s.client_id, keepalive=self.s.keepalive_s,
                             username=self.s.mqtt_username,
                             password=self.s.mqtt_password if self.s.mqtt_username else None,
                             session_expiry=self.s.session_expiry_s, receive_maximum=self.s.window,
                             tls=tls_context(self.s.mqtt_ca_file))
        client.on_connect, client.on_disconnect = self._on_connect, self._on_disconnect
        client.on_message, client.on_suback = self._on_message, self._on_subscribe
        return client

    def _on_connect(self, session_present: bool, reason_code: int, _props: dict) -> None:
        if reason_code >= 0x80:
            log.error("MQTT connection refused", extra=kv(
                reason=reason_name(reason_code), host=self.s.mqtt_host,
                fix="check BRIDGE_MQTT_USERNAME, the mqtt_password secret and the broker's password file/ACL"))
            return
        self.connected = True
        metrics.MQTT_CONNECTED.set(1)
        if self.had_session and not session_present:
            metrics.SESSIONS_LOST.inc()
            log.error("the MQTT broker lost the bridge's session (Session Present 0): whatever it had queued for "
                      "the bridge is gone; subscribing again", extra=kv(
                          client_id=self.s.client_id, session_expiry_s=self.s.session_expiry_s,
                          fix="check that Mosquitto's store survives restarts (persistence volume) and that the "
                              "bridge is never away longer than BRIDGE_SESSION_EXPIRY_S"))
        log.info("MQTT connected", extra=kv(client_id=self.s.client_id, session_present=session_present,
                                            subscriptions=",".join(self.subscriptions)))
        # Always: Mosquitto 2.0 restores sessions from its store without their shared subscriptions.
        self.client.subscribe(self.subscriptions, qos=1)

    def _on_subscribe(self, _mid: int, reason_codes: list[int]) -> None:
        problems = subscription_problems(self.subscriptions, reason_codes)
        for problem in problems:
            log.error("subscription not granted as asked; the bridge reports unhealthy", extra=kv(
                problem=problem, fix="allow the bridge user to read every mapped filter at QoS 1 in the ACL"))
        self.subscription_problem = "; ".join(problems) or None
        self.subscribed = not problems
        metrics.SUBSCRIBED.set(1 if self.subscribed else 0)
        if self.subscribed:
            self.had_session = True
            self.backoff.reset()

    def _on_disconnect(self, why: str) -> None:
        was = self.connected
        self.connected = self.subscribed = False
        metrics.MQTT_CONNECTED.set(0)
        metrics.SUBSCRIBED.set(0)
        dropped = self.window.reset()
        metrics.REDELIVERY_EXPECTED.inc(dropped)
        metrics.IN_FLIGHT.set(0)
        delay = self.backoff.next()
        self.reconnect_at = time.monotonic() + delay
        if was or dropped:
            log.warning("MQTT disconnected", extra=kv(reason=why, unacked_redelivered_by_broker=dropped,
                                                      retry_in_s=delay))

    def _on_message(self, topic: str, payload: bytes, mid: int, qos: int, user: list | None) -> None:
        """One incoming PUBLISH (the hot path): route it, remember it in the window, produce it."""
        self._received += 1
        now_ms = int(time.time() * 1000)
        try:
            record = self.router.route(topic, payload, user, now_ms)
        except Exception as err:          # noqa: BLE001 - a bug must not lose or crash; dead-letter it
            record = dead_letter(self.s.dead_letter_topic, topic, None, payload, UNPROCESSABLE,
                                 repr(err), now_ms, max_bytes=self.s.max_record_bytes)
        self.last_message_at = received = time.monotonic()
        entry = self.window.add(mid, qos, received, record)
        try:                              # _produce inlined for the usual case; _send handles the rest
            self.producer.produce(record.topic, record.value, record.key, headers=record.headers,
                                  on_delivery=partial(self._delivered, entry.seq))
        except Exception:                 # noqa: BLE001 - BufferError, KafkaException: _send deals with them
            self._produce(entry)

    def _io(self, read: bool, timeout: float) -> None:
        client = self.client
        sock = client.sock
        if sock is None:
            self._wait_to_reconnect(timeout)
            return
        room = min(READ_BATCH, self.window.room()) if read else 0
        if room and client.has_backlog():
            client.read(room)             # complete packets already buffered: no need to wait
        else:
            rlist = [sock] if read and client.can_read() else []
            wlist = [sock] if client.want_write() else []
            readable, _, _ = select.select(rlist, wlist, [], timeout)
            if readable:
                client.read(room)
        if client.want_write():
            client.write()
        client.misc()

    def _wait_to_reconnect(self, timeout: float) -> None:
        """Not connected: connect again once the backoff allows; otherwise wait a little."""
        if not self.stop.is_set() and time.monotonic() >= self.reconnect_at:
            self._reconnect()
        time.sleep(min(timeout, 0.05))

    def _reconnect(self) -> None:
        try:
            self.client.connect()
        except OSError as err:
            delay = self.backoff.next()
            self.reconnect_at = time.monotonic() + delay
            self._log_rarely("mqtt-connect", logging.WARNING, "MQTT broker unreachable, retrying",
                             host=self.s.mqtt_host, port=self.s.mqtt_port, error=err, retry_in_s=delay)

    # ------------------------------------------------------------ Kafka

    def _produce(self, entry: Entry) -> None:
        self._send(entry.record, partial(self._delivered, entry.seq))

    def _send(self, rec: Record, on_delivery) -> None:
        while True:
            try:
                self.producer.produce(rec.topic, rec.value, rec.key, headers=rec.headers, on_delivery=on_delivery)
                return
            except BufferError:               # local queue full: serve reports, then try again
                self.producer.poll(0.1)
            except Exception as err:          # noqa: BLE001 - e.g. KafkaException(MSG_SIZE_TOO_LARGE)
                error = err.args[0] if err.args and isinstance(err.args[0], KafkaError) else \
                    KafkaError(KafkaError._INVALID_ARG, str(err))
                on_delivery(error, None)
                return

    def _delivered(self, seq: int, err: KafkaError | None, msg) -> None:
        """Delivery report of one record (inside producer.poll/flush, on the loop thread)."""
        if err is None:
            now = self.kafka_ok_at = time.monotonic()
            topic = msg.topic()
            self._produced[topic] = self._produced.get(topic, 0) + 1
        entry = self.window.get(seq)
        if entry is None:                     # its connection is gone: the broker redelivers the message
            return
        if err is not None:
            self._failed(entry, err)
            return
        entry.delivered = True
        metrics.DELIVERY_LATENCY.observe(now - entry.received)
        reason = entry.record.reason
        if reason:
            self._dead[reason] = self._dead.get(reason, 0) + 1

    def _failed(self, entry: Entry, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = f"fatal Kafka producer error: {err}"
            return
        if err.code() in _PERMANENT:
            rec = entry.record
            if rec.reason is not None:        # a dead letter Kafka will never take: drop it, ack its message
                self._drop_dead_letter(rec, err)
                entry.delivered = True
                return
            source = _header(rec, names.HEADER_MQTT_TOPIC) or rec.topic
            entry.record = dead_letter(self.s.dead_letter_topic, source, rec.key, rec.value, KAFKA_REJECTED,
                                       f"Kafka refused the record for {rec.topic}: {err.str()}",
                                       int(time.time() * 1000), rec.headers, max_bytes=self.s.max_record_bytes)
            self._produce(entry)
            return
        metrics.KAFKA_RETRIES.inc()
        self._log_rarely("kafka-retry", logging.WARNING, "Kafka delivery failed; the message stays unacked "
                         "and is produced again", topic=entry.record.topic, error=err.str())
        self.retries.append((time.monotonic() + RETRY_DELAY_S, entry.seq))

    def _retry_due(self) -> None:
        if not self.retries or self.retries[0][0] > time.monotonic():
            return
        now, due = time.monotonic(), self.retries
        self.retries = [r for r in due if r[0] > now]
        for _, seq in (r for r in due if r[0] <= now):
            entry = self.window.get(seq)
            if entry is not None:
                self._produce(entry)

    def _drop_dead_letter(self, rec: Record, err: KafkaError) -> None:
        """A dead letter Kafka refused for good: counted, logged (at most one line a second), not retried."""
        metrics.DEAD_LETTERS_DROPPED.labels(rec.reason).inc()
        self._dropped += 1
        too_large = err.code() in _TOO_LARGE
        fix = (f"raise max.message.bytes of {rec.topic} above BRIDGE_MAX_RECORD_BYTES={self.s.max_record_bytes} "
               "or lower BRIDGE_MAX_RECORD_BYTES" if too_large else
               f"check the topic {rec.topic} (BRIDGE_DEAD_LETTER_TOPIC) and the bridge's Kafka rights on it")
        if self._log_rarely("dlq-dropped", logging.ERROR, "dead letter dropped: Kafka refused it for good; its "
                            "message is acked so the window moves on", every_s=1.0,
                            mqtt_topic=_header(rec, names.HEADER_DLQ_SOURCE) or "?", reason=rec.reason,
                            error=err.str(), dropped=self._dropped, fix=fix):
            self._dropped = 0

    def _produce_dead_letter(self, record: DeadLetter, done) -> None:
        """For the command path: produce, produce again on a transient failure, call done() once Kafka has it
        (or once it refused it for good: the dead letter is dropped, as the readings' are)."""
        def on_delivery(err, _msg):
            if err is None:
                metrics.PRODUCED.labels(record.topic).inc()
                done()
            elif err.fatal():
                self.fatal = f"fatal Kafka producer error: {err}"
            elif err.code() in _PERMANENT:
                self._drop_dead_letter(record, err)
                done()
            else:
                self._send(record, on_delivery)
        self._send(record, on_delivery)

    def _kafka_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = f"fatal Kafka producer error: {err}"
        self._log_rarely(f"kafka-{err.code()}", logging.WARNING, "Kafka client error", error=err.str(),
                         bootstrap=self.s.kafka_bootstrap)

    def _kafka_stats(self, raw: str) -> None:
        brokers = json.loads(raw).get("brokers", {}).values()
        if any(b.get("state") == "UP" and b.get("nodeid", -1) >= 0 for b in brokers):
            self.kafka_ok_at = time.monotonic()

    # ------------------------------------------------------------ loop

    def _ack(self) -> None:
        """PUBACK the delivered prefix of the window: all of it in one socket write."""
        ackable = self.window.pop_ackable()
        if ackable:
            ack, n = self.client.ack, 0
            for entry in ackable:
                if entry.qos:
                    ack(entry.mid)
                    n += 1
            self._acked += n
            self.client.write()

    def _push_metrics(self) -> None:
        """Hand the plain-int counts of this loop turn to Prometheus (one locked inc per metric)."""
        if self._received:
            metrics.RECEIVED.inc(self._received)
            self._received = 0
        if self._acked:
            metrics.ACKED.inc(self._acked)
            self._acked = 0
        if self._produced:
            for topic, n in self._produced.items():
                metrics.PRODUCED.labels(topic).inc(n)
            self._produced.clear()
        if self._dead:
            for reason, n in self._dead.items():
                metrics.DEAD_LETTERED.labels(reason).inc(n)
            self._dead.clear()
        metrics.IN_FLIGHT.set(len(self.window) if self.connected else 0)
        if self.owners is not None:
            metrics.SENSORS_REGISTERED.set(len(self.owners.owners))

    def health(self) -> tuple[bool, str]:
        kafka_age = time.monotonic() - self.kafka_ok_at
        ok = self.connected and self.subscribed and kafka_age < KAFKA_HEALTHY_WITHIN_S
        detail = f" subscription_problem={self.subscription_problem!r}" if self.subscription_problem else ""
        if self.owners is not None and not self.owners_loaded:
            detail += f" reading_sensor_owners={self.s.sensor_owners_topic}"
        return ok, (f"{'ok' if ok else 'unhealthy'} mqtt_connected={self.connected} subscribed={self.subscribed} "
                    f"kafka_last_answer_s={kafka_age:.1f} in_flight={len(self.window)}{detail}")

    def run(self) -> int:
        log.info("bridge starting", extra=kv(client_id=self.s.client_id, mqtt=f"{self.s.mqtt_host}:{self.s.mqtt_port}",
                                             mqtt_tls="on" if self.s.mqtt_ca_file else "off",
                                             kafka=self.s.kafka_bootstrap, window=self.s.window,
                                             commands=self.s.commands_topic or "off",
                                             sensor_owners=self.s.sensor_owners_topic or "off",
                                             max_record_bytes=self.s.max_record_bytes))
        drain_until = None
        try:
            # With ownership checks, subscribe (connect) only once the whole table is read.
            if self.owners is not None and not self.owners.load(self.stop.is_set):
                self.fatal = self.owners.fatal
            self.owners_loaded = True
            while self.fatal is None:
                if self.stop.is_set():
                    if drain_until is None:
                        drain_until = time.monotonic() + self.s.drain_s
                        self._begin_stop()
                    if self._stopped(drain_until):
                        break
                # Window full: only Kafka can make progress, so wait in poll (it returns on the first
                # delivery report) rather than spinning on the socket.
                full = self.connected and self.window.room() == 0
                busy = len(self.window) or self.retries
                self._io(read=drain_until is None or self.handing_over,
                         timeout=0 if full else self.in_flight_wait_s if busy else 0.05)
                self.producer.poll(0.005 if full else 0)
                self._retry_due()
                if self.owners is not None:
                    self.owners.poll()
                    self.fatal = self.fatal or self.owners.fatal
                if self.connected:
                    self._ack()
                    if self.commands and drain_until is None:
                        self.commands.pump(self.client)
                        self.fatal = self.fatal or self.commands.fatal
                self._push_metrics()
        finally:
            self._shutdown()
            self._push_metrics()
        if self.fatal:
            log.error("bridge stopped on a fatal error; unacked messages are redelivered by the broker",
                      extra=kv(error=self.fatal))
            return 1
        return 0

    def _begin_stop(self) -> None:
        """SIGTERM: hand the subscription over if another replica runs, else keep it (see the module doc)."""
        others = peers_alive(self.s.peers_dns) if self.s.peers_dns and self.connected else []
        if others:
            self.handing_over = True
            self.last_message_at = time.monotonic()
            self.client.unsubscribe(self.subscriptions)
            log.info("stopping with other replicas up: unsubscribed, taking what the broker still queued for "
                     "this session", extra=kv(peers=",".join(others)))
        else:
            log.info("stopping: the subscription stays, so the broker queues for this session meanwhile",
                     extra=kv(peers_dns=self.s.peers_dns or "unset"))

    def _stopped(self, drain_until: float) -> bool:
        now = time.monotonic()
        if now >= drain_until or not self.connected:
            return True
        if self.handing_over and now - self.last_message_at < HANDOVER_QUIET_S:
            return False
        return len(self.window) == 0

    def _shutdown(self) -> None:
        unacked = len(self.window)
        self.client.disconnect()              # session persists: the broker keeps unacked messages
        left = self.producer.flush(2.0)
        if self.commands:
            self.commands.close()
        if self.owners is not None:
            self.owners.close()
        log.info("bridge stopped", extra=kv(unacked_left_to_broker=unacked, kafka_unflushed=left))

    def _log_rarely(self, key: str, level: int, msg: str, every_s: float = 10.0, **fields) -> bool:
        """Log at most once every `every_s` per key; True if this call logged."""
        now = time.monotonic()
        if now < self.log_after.get(key, 0.0):
            return False
        self.log_after[key] = now + every_s
        log.log(level, msg, extra=kv(**fields))
        return True


def _header(rec: Record, name: str) -> str | None:
    """The first header `name` of a record, as text."""
    return next((v.decode("utf-8", "replace") for k, v in rec.headers if k == name and v is not None), None)


def peers_alive(name: str) -> list[str]:
    """Addresses `name` resolves to besides our own: the other running replicas (Swarm dnsrr lists each task)."""
    try:
        theirs = {info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return []
    try:
        mine = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP)}
    except OSError:
        mine = set()
    return sorted(theirs - mine)


def subscription_problems(filters: list[str], reason_codes: list[int]) -> list[str]:
    """What a SUBACK did not grant: refused filters, QoS below 1 (messages could be lost), missing codes."""
    problems = []
    for i, sub in enumerate(filters):
        code = reason_codes[i] if i < len(reason_codes) else None
        if code is None:
            problems.append(f"{sub}: no reason code in the SUBACK")
        elif code >= 0x80:
            problems.append(f"{sub}: refused ({reason_name(code)})")
        elif code < 1:
            problems.append(f"{sub}: granted QoS {code} instead of 1 (unacknowledged delivery could lose messages)")
    return problems


def load_mapping(path: str | None) -> Mapping:
    return Mapping.from_file(path) if path else Mapping.from_dicts(DEFAULT_RULES)


def main(argv: list[str] | None = None) -> int:
    try:
        s = bridge_settings.from_args(argv)
        setup_logging("bridge", s.log_level)
        mapping = load_mapping(s.mapping_file)
        kafka_auth.internal_config()     # KAFKA_USERNAME without its password file, a missing CA: say so now
    except (SettingsError, MappingError, ValueError) as err:
        print(f"iot-bridge: {err}", file=sys.stderr)
        return 2
    stop = StopFlag()
    bridge = Bridge(s, mapping, stop)
    if s.metrics_port:
        serve_http(s.metrics_port, bridge.health, metrics.exposition,
                   tls=metrics_tls(s.metrics_keystore, s.metrics_client_ca))
    return bridge.run()


if __name__ == "__main__":
    sys.exit(main())
