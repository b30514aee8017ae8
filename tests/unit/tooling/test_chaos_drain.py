"""tooling/lab/chaos.py without a lab: the relay drain figures, the relay load's records, the exit rule,
and the one Kafka reader (`_read_since`) against a fake consumer."""
from __future__ import annotations

import math

import confluent_kafka
import pytest

from services.common import contracts
from tests.unit.fake_kafka import FakeMessage
from tooling.lab import alerts_seen, chaos

# ---------------------------------------------------------------- drain figures


def test_a_backlog_that_arrives_whole_has_its_ratio():
    # 60000 written over 300 s (200/s); the cut lifted at t=1000, the last one seen 30 s later: 2000/s.
    arrivals = [1000.0 + 30.0 * k / 59_999 for k in range(60_000)]
    drain = chaos.drain_figures(60_000, 300.0, 1000.0, arrivals)
    assert (drain.backlog, drain.arrived, drain.lost, drain.early) == (60_000, 60_000, 0, 0)
    assert drain.ingest_per_s == pytest.approx(200.0)
    assert drain.drain_s == pytest.approx(30.0)
    assert drain.drain_per_s == pytest.approx(2000.0)
    assert drain.ratio == pytest.approx(10.0)


def test_the_drain_time_runs_from_the_lift_to_the_last_arrival_in_any_order():
    drain = chaos.drain_figures(4, 2.0, 100.0, [130.0, 101.0, 140.0, 120.0])
    assert drain.drain_s == pytest.approx(40.0)
    assert drain.ratio == pytest.approx((4 / 40) / (4 / 2))


def test_a_partial_backlog_counts_its_lost_records_and_has_no_ratio():
    drain = chaos.drain_figures(10, 5.0, 100.0, [101.0, 102.0, 110.0])
    assert (drain.arrived, drain.lost) == (3, 7)
    assert drain.drain_s == pytest.approx(10.0)
    assert drain.drain_per_s == pytest.approx(0.3)
    assert drain.ratio is None


def test_nothing_arrived():
    drain = chaos.drain_figures(10, 5.0, 100.0, [])
    assert (drain.arrived, drain.lost, drain.drain_s, drain.drain_per_s, drain.ratio) == (0, 10, None, None, None)


def test_no_backlog_has_no_ratio():
    drain = chaos.drain_figures(0, 300.0, 100.0, [])
    assert (drain.ingest_per_s, drain.lost, drain.ratio) == (0.0, 0, None)


def test_arrivals_during_the_cut_are_counted_as_early():
    # The cut did not hold: everything was there before it was lifted, so it "drained" at once.
    drain = chaos.drain_figures(3, 3.0, 100.0, [90.0, 95.0, 99.0])
    assert drain.early == 3
    assert drain.drain_s == 0.0
    assert drain.drain_per_s == math.inf


def test_a_zero_cut_has_no_ingest_rate():
    drain = chaos.drain_figures(3, 0.0, 100.0, [101.0, 102.0, 103.0])
    assert drain.ingest_per_s == 0.0
    assert drain.ratio is None


# ---------------------------------------------------------------- the relay load


def test_the_relay_load_is_a_valid_rollup_that_the_adapter_stores():
    record = chaos.rollup("chaos-x-relay", 1_700_000_040_000)
    assert contracts.ROLLUP.validate(record) == record
    assert contracts.ROLLUP.key(record) == "chaos-x-relay"
    assert record["site"] == chaos.SITE


# ---------------------------------------------------------------- the exit rule and the table


def outcome(case: str, lost: int = 0, **figures) -> chaos.Outcome:
    """The case's outcome; its expected alert fired 40 s after the fault unless `alerted` says otherwise."""
    expected = chaos.CASES[case].alert
    figures.setdefault("alerted", {expected: 40.0} if expected else {})
    return chaos.Outcome(case, acknowledged=100, stored=100 - lost, lost=lost, duplicated=0, recovery_s=1.0,
                         **figures)


def test_a_relay_case_fails_on_a_lost_relay_record_or_no_load():
    assert chaos.kept_all(outcome("dc-cut-off", relay_backlog=60_000, drain_ratio=12.0))
    assert not chaos.kept_all(outcome("dc-cut-off", relay_backlog=60_000, relay_lost=1))
    assert not chaos.kept_all(outcome("dc-cut-off"))           # the drain was never measured


def test_the_exit_rule_of_the_other_cases_is_unchanged():
    assert chaos.kept_all(outcome("bridge-kill"))
    assert not chaos.kept_all(outcome("bridge-kill", lost=1))
    alerted = {"MosquittoRestarted{site=site-a}": 40.0}
    assert chaos.kept_all(outcome("mosquitto-kill", lost=10, alerted=alerted))   # within a documented window
    assert not chaos.kept_all(outcome("mosquitto-kill", lost=10, alerted={}))    # but its alert must fire


def test_every_fault_expects_the_alert_naming_it_and_the_healthy_case_none():
    assert [name for name, case in chaos.CASES.items() if not case.alert] == ["healthy"]
    assert chaos.kept_all(outcome("healthy"))
    assert not chaos.kept_all(outcome("healthy", alerted={"ServiceRestarted{job=bridge,site=site-a}": 30.0}))
    # The expected alert, with its labels: another job's restart is not the bridge's.
    assert chaos.kept_all(outcome("bridge-kill", alerted={"ServiceRestarted{job=bridge,site=site-a}": 30.0}))
    assert not chaos.kept_all(outcome("bridge-kill", alerted={"ServiceRestarted{job=adapter,site=site-a}": 30.0}))
    assert not chaos.kept_all(outcome("dc-adapter-down", alerted={"ServiceNotRunning{job=adapter,site=site-a}": 9.0}))
    assert chaos.kept_all(outcome("dc-adapter-down", alerted={"ServiceNotRunning{job=adapter,site=datacenter}": 9.0}))


def test_an_alert_key_matches_a_name_and_a_subset_of_its_labels():
    key = alerts_seen.key({"alertname": "ServiceRestarted", "job": "spark", "spark_job": "rollups",
                           "site": "site-a", "severity": "info", "instance": "10.0.2.5:4040"})
    assert key == "ServiceRestarted{job=spark,site=site-a,spark_job=rollups}"
    assert alerts_seen.matches(key, "ServiceRestarted")
    assert alerts_seen.matches(key, "ServiceRestarted{spark_job=rollups}")
    assert not alerts_seen.matches(key, "ServiceRestarted{spark_job=threshold-detector}")
    assert not alerts_seen.matches(key, "ServiceRestart")


def test_a_mosquitto_kill_with_other_devices_keeps_all_but_the_readings_in_flight():
    alerted = {"MosquittoRestarted{site=site-a}": 40.0}
    assert chaos.kept_all(outcome("mosquitto-kill-v3.1.1", lost=3, lost_in_flight=3, alerted=alerted))
    assert not chaos.kept_all(outcome("mosquitto-kill-v3.1.1", lost=4, lost_in_flight=3, alerted=alerted))


def test_a_missing_or_repeated_threshold_event_fails_the_case():
    assert chaos.kept_all(outcome("detector-kill", events_expected=60, events_site=60, events_dc=60))
    assert not chaos.kept_all(outcome("detector-kill", events_expected=60, events_site=59))
    assert not chaos.kept_all(outcome("detector-kill", events_expected=60, events_site=60, events_lost=1))
    assert not chaos.kept_all(outcome("detector-kill", events_expected=60, events_site=60, announced_twice=1))


def test_only_the_cut_off_loads_the_relay():
    assert [c.name for c in chaos.CASES.values() if c.relay] == ["dc-cut-off"]


def test_the_table_shows_the_drain_ratio_and_a_dash_where_there_is_none():
    text = chaos.table([outcome("dc-cut-off", relay_backlog=5, drain_ratio=12.5),
                        outcome("bridge-kill", alerted={})])
    header, cut, kill = text.splitlines()
    assert header.split()[-4:] == ["relay_lost", "drain_ratio", "alerted", "notes"]
    assert cut.split()[-4:] == ["0", "12.5", "FleetSiteCutOff{site=site-a}", "+40s"]
    assert kill.split()[-3:] == ["0", "-", "none"]


def test_the_table_names_each_alert_with_its_delay():
    text = chaos.table([outcome("mosquitto-kill", alerted={"MosquittoRestarted{site=site-a}": 41.6,
                                                            "MosquittoDown{site=site-a}": 12.2})])
    assert "MosquittoDown{site=site-a} +12s, MosquittoRestarted{site=site-a} +42s" in text.splitlines()[1]


# ---------------------------------------------------------------- _read_since against a fake consumer


def Msg(partition: int, offset: int, key: bytes = b"k", value: bytes = b"{}", error=None) -> FakeMessage:
    return FakeMessage(partition=partition, offset=offset, key=key, value=value, error=error, headers=[])


class FakeConsumer:
    """One topic: `logs` maps partition -> records; offsets are list indexes; timestamps are `times`."""
    made: list[FakeConsumer] = []

    def __init__(self, config):
        self.config, self.assigned, self.closed = config, [], False
        self.positions: dict[int, int] = {}
        FakeConsumer.made.append(self)

    def list_topics(self, topic, timeout):
        meta = type("M", (), {})()
        meta.topics = {topic: type("T", (), {"partitions": {p: None for p in LOGS}})()}
        return meta

    def get_watermark_offsets(self, tp, timeout):
        return 0, len(LOGS[tp.partition])

    def offsets_for_times(self, tps, timeout):
        out = []
        for tp in tps:
            later = [i for i, t in enumerate(TIMES[tp.partition]) if t >= tp.offset]
            out.append(confluent_kafka.TopicPartition(tp.topic, tp.partition, later[0] if later else -1))
        return out

    def assign(self, tps):
        self.assigned = [(tp.partition, tp.offset) for tp in tps]
        self.positions = dict(self.assigned)

    def consume(self, batch, timeout):
        out = []
        for p in list(self.positions):
            while self.positions[p] < len(LOGS[p]) and len(out) < batch:
                out.append(LOGS[p][self.positions[p]])
                self.positions[p] += 1
        return out

    def position(self, tps):
        return [confluent_kafka.TopicPartition(tp.topic, tp.partition, self.positions.get(tp.partition, -1))
                for tp in tps]

    def close(self):
        self.closed = True


LOGS: dict[int, list[Msg]] = {}
TIMES: dict[int, list[int]] = {}


@pytest.fixture
def kafka(monkeypatch):
    monkeypatch.setattr(confluent_kafka, "Consumer", FakeConsumer)
    # No lab here: plain settings instead of the operator's SASL_SSL login.
    monkeypatch.setattr(chaos, "_client", lambda bootstrap, **config: {"bootstrap.servers": bootstrap, **config})
    FakeConsumer.made.clear()
    LOGS.clear()
    TIMES.clear()
    LOGS.update({0: [Msg(0, 0, b"a"), Msg(0, 1, b"b"), Msg(0, 2, b"a", error="boom"), Msg(0, 3, b"a")],
                 1: [Msg(1, 0, b"a")],
                 2: []})
    TIMES.update({0: [10, 20, 30, 40], 1: [5], 2: []})
    return FakeConsumer.made


def test_to_end_reads_the_wanted_records_from_the_time_on_and_stops_at_the_ends(kafka):
    got = list(chaos._read_since("b:9094", "t", 15, lambda m: m.key() == b"a", to_end=True, limit_s=5))
    assert [(m.partition(), m.offset()) for m in got] == [(0, 3)]          # not before 15, no errors, key a
    (consumer,) = kafka
    assert consumer.assigned == [(0, 1)]            # partition 1 has nothing since 15, partition 2 nothing at all
    assert consumer.config["isolation.level"] == "read_committed" and consumer.closed


def test_until_quiet_assigns_every_partition_from_its_end_if_nothing_is_newer(kafka):
    got = list(chaos._read_since("b:9094", "t", 15, quiet_s=0.01, committed=False, group="g"))
    assert [(m.partition(), m.offset()) for m in got] == [(0, 1), (0, 3)]
    (consumer,) = kafka
    assert sorted(consumer.assigned) == [(0, 1), (1, 1), (2, 0)]        # ends, never "latest at assign time"
    assert "isolation.level" not in consumer.config and consumer.config["group.id"].startswith("g-")


def test_a_reader_left_early_closes_its_consumer(kafka):
    records = chaos._read_since("b:9094", "t", 0, limit_s=5)
    next(records)
    records.close()
    assert kafka[0].closed


class Clock:
    """time for chaos: every look at the clock is a second later, so a quiet reader ends at once."""
    now = 0.0

    @classmethod
    def monotonic(cls) -> float:
        cls.now += 1.0
        return cls.now


def test_kafka_records_and_dead_letters_keep_their_results(kafka, monkeypatch):
    monkeypatch.setattr(chaos, "time", Clock)
    LOGS[0][3] = Msg(0, 3, b"a", b'{"timestamp": 1}')
    assert chaos.kafka_records("b:9094", "t", {"a", "z"}, 15) == {"a": [{"timestamp": 1}], "z": []}
    assert chaos.dead_letters("b:9094", 15) == {"?": 2}


def _watch_with(before: dict[str, float]) -> alerts_seen.AlertWatch:
    watch = alerts_seen.AlertWatch(hosts=[], sites=("site-a",), fault_at=1000.0)
    watch.before = dict(before)
    return watch


def test_an_alert_firing_before_the_fault_counts_only_once_it_resolved_and_fired_again():
    kafka = "ServiceRestarted{job=kafka,site=site-a}"
    bridge = "ServiceRestarted{job=bridge,site=site-a}"
    firing = {"value": "2"}
    watch = _watch_with({kafka: 2.0})
    watch.note({kafka: firing}, complete=True, at=1010.0)               # the previous case's, still firing
    assert watch.seen == {}
    watch.note({}, complete=False, at=1020.0)                           # a site did not answer: says nothing
    watch.note({kafka: firing}, complete=True, at=1030.0)
    assert watch.seen == {}
    watch.note({bridge: {"value": "1"}}, complete=True, at=1040.0)      # kafka's resolved; bridge's is new
    assert watch.seen == {bridge: 40.0}
    watch.note({kafka: firing, bridge: {"value": "1"}}, complete=True, at=1050.0)   # same value, but a new firing
    assert watch.seen == {bridge: 40.0, kafka: 50.0}


def test_a_counting_alert_that_stays_firing_counts_when_its_value_grows():
    mqtt = "MqttLoginMisused{login=site-a-dev-9,offence=share,site=site-a}"
    watch = _watch_with({mqtt: 3.0})
    watch.note({mqtt: {"value": "3"}}, complete=True, at=1005.0)
    assert watch.seen == {}
    watch.note({mqtt: {"value": "4"}}, complete=True, at=1015.0)
    assert watch.seen == {mqtt: 15.0}
    # Not a counting alert: firing on from before the fault is never this case's.
    disk = "DiskFillingUp{site=site-a}"
    watch = _watch_with({disk: 1.0})
    watch.note({disk: {"value": "9"}}, complete=True, at=1005.0)
    assert watch.seen == {}
