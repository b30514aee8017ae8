"""iot-topics: spec validation, plan, per-topic configs, drift warnings, waiting and the create race."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from confluent_kafka import KafkaError, KafkaException

from services.commands import topics as kt
from services.commands.topics import ExistingTopic, TopicSpec

REPO = Path(__file__).resolve().parents[3]
EDGE = [
    {"name": "temperature-data", "partitions": 6, "cleanup": "delete"},
    {"name": "device-registration", "partitions": 1, "cleanup": "compact"},
    {"name": "dead-letter", "partitions": 1, "cleanup": "delete", "retention_ms": 3_600_000},
]


def test_valid_spec_parses_into_topics():
    assert kt.parse_spec(json.dumps(EDGE)) == [
        TopicSpec("temperature-data", 6, "delete"),
        TopicSpec("device-registration", 1, "compact"),
        TopicSpec("dead-letter", 1, "delete", 3_600_000),
    ]


def test_the_role_defaults_are_a_valid_spec():
    defaults = yaml.safe_load((REPO / "ansible/roles/topics/defaults/main.yml").read_text())
    for tier in ("topics_edge", "topics_datacenter"):
        assert kt.validate_spec(defaults[tier]), tier


@pytest.mark.parametrize("item, expected", [
    ({"partitions": 1, "cleanup": "delete"}, "spec[1].name: missing"),
    ({"name": "bad name", "partitions": 1, "cleanup": "delete"},
     "spec[1] (bad name).name: 'bad name' is not a legal Kafka topic name: use only letters, digits"),
    ({"name": "..", "partitions": 1, "cleanup": "delete"}, "spec[1] (..).name: '..' is not a legal Kafka topic"),
    ({"name": "x" * 250, "partitions": 1, "cleanup": "delete"}, ".name: is 250 characters long; a Kafka topic"),
    ({"name": "", "partitions": 1, "cleanup": "delete"}, ".name: must be a non-empty string"),
    ({"name": 7, "partitions": 1, "cleanup": "delete"}, "spec[1].name: must be a non-empty string (got 7)"),
    ({"name": "t", "partitions": 0, "cleanup": "delete"},
     "spec[1] (t).partitions: must be a whole number of 1 or more (got 0)"),
    ({"name": "t", "partitions": "6", "cleanup": "delete"}, "(t).partitions: must be a whole number"),
    ({"name": "t", "partitions": True, "cleanup": "delete"}, "(t).partitions: must be a whole number"),
    ({"name": "t", "cleanup": "delete"}, "(t).partitions: must be a whole number of 1 or more (got None)"),
    ({"name": "t", "partitions": 1, "cleanup": "compacted"},
     "spec[1] (t).cleanup: must be one of delete, compact (got 'compacted')"),
    ({"name": "t", "partitions": 1}, "(t).cleanup: must be one of delete, compact (got None)"),
    ({"name": "t", "partitions": 1, "cleanup": "delete", "retention_ms": -2}, "(t).retention_ms: must be a whole"),
    ({"name": "t", "partitions": 1, "cleanup": "compact", "retention_ms": 5},
     "(t).retention_ms: applies only to cleanup=delete"),
    ({"name": "t", "partition": 1, "partitions": 1, "cleanup": "delete"}, "(t): unknown field 'partition'"),
    ("temperature-data", "spec[1]: must be an object with name, partitions, cleanup, retention_ms"),
])
def test_bad_spec_entries_name_the_field_and_what_it_should_be(item, expected):
    with pytest.raises(kt.SpecError) as err:
        kt.validate_spec([item])
    assert expected in str(err.value)


def test_every_bad_field_is_reported_at_once():
    with pytest.raises(kt.SpecError) as err:
        kt.validate_spec([EDGE[0], {"name": "a b", "partitions": 0, "cleanup": "x"}])
    lines = str(err.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["spec[2] (a b).name", "spec[2] (a b).partitions",
                                                      "spec[2] (a b).cleanup"]


def test_a_topic_listed_twice_is_an_error():
    with pytest.raises(kt.SpecError, match=r"spec\[2\] \(t\)\.name: 't' is listed twice \(also spec\[1\]\)"):
        kt.validate_spec([{"name": "t", "partitions": 1, "cleanup": "delete"}] * 2)


@pytest.mark.parametrize("text, expected", [
    ("{not json", "spec: not valid JSON"),
    ('{"name": "t"}', "spec: must be a JSON list of topics, got dict"),
])
def test_spec_must_be_a_json_list(text, expected):
    with pytest.raises(kt.SpecError, match=expected):
        kt.parse_spec(text)


def test_an_empty_spec_is_valid_and_plans_nothing():
    assert kt.validate_spec([]) == []
    assert kt.plan_topics([], {}, 3, 2, 1000) == kt.Plan()


@pytest.mark.parametrize("replication, min_insync, retention, expected", [
    (0, 1, None, "--replication must be 1 or more"),
    (3, 0, None, "--min-insync must be between 1 and --replication (3)"),
    (1, 2, None, "--min-insync must be between 1 and --replication (1)"),
    (1, 1, -5, "--retention-ms must be milliseconds"),
])
def test_bad_cluster_settings_name_the_flag(replication, min_insync, retention, expected):
    with pytest.raises(kt.SpecError) as err:
        kt.check_settings(replication, min_insync, retention)
    assert expected in str(err.value)


def test_delete_topics_get_retention_and_compact_topics_do_not():
    data, registration, dead = kt.validate_spec(EDGE)
    assert kt.topic_config(data, 2, 604_800_000) == {
        "cleanup.policy": "delete", "min.insync.replicas": "2", "retention.ms": "604800000"}
    assert kt.topic_config(registration, 2, 604_800_000) == {"cleanup.policy": "compact", "min.insync.replicas": "2"}
    # A topic's own retention_ms wins over --retention-ms.
    assert kt.topic_config(dead, 1, 604_800_000)["retention.ms"] == "3600000"
    # Without --retention-ms the broker's default applies.
    assert "retention.ms" not in kt.topic_config(data, 1, None)
    assert kt.topic_config(dead, 1, None)["retention.ms"] == "3600000"


def test_plan_creates_only_missing_topics_with_replication_and_min_insync():
    spec = kt.validate_spec(EDGE)
    plan = kt.plan_topics(spec, {"device-registration": ExistingTopic(1, "compact")}, 3, 2, 86_400_000)
    assert plan.existing == ["device-registration"]
    assert plan.warnings == []
    assert [(t.name, t.partitions, t.replication) for t in plan.create] == [
        ("temperature-data", 6, 3), ("dead-letter", 1, 3)]
    assert plan.create[0].config == {"cleanup.policy": "delete", "min.insync.replicas": "2",
                                     "retention.ms": "86400000"}
    assert plan.create[0].describe() == ("temperature-data (6 partitions, replication 3, cleanup.policy=delete, "
                                         "min.insync.replicas=2, retention.ms=86400000)")


def test_plan_with_everything_existing_creates_nothing():
    spec = kt.validate_spec(EDGE)
    existing = {t.name: ExistingTopic(t.partitions, t.cleanup) for t in spec}
    plan = kt.plan_topics(spec, existing, 1, 1, None)
    assert plan.create == [] and plan.warnings == []
    assert plan.existing == ["dead-letter", "device-registration", "temperature-data"]


def test_drift_is_a_warning_naming_topic_actual_and_wanted():
    spec = kt.validate_spec(EDGE)
    existing = {"temperature-data": ExistingTopic(3, "compact"),
                "device-registration": ExistingTopic(4, "compact,delete"),   # more partitions is fine
                "dead-letter": ExistingTopic(1, None)}                       # configs not readable: no guess
    plan = kt.plan_topics(spec, existing, 1, 1, None)
    assert plan.create == []
    assert plan.warnings == [
        "topic temperature-data has 3 partitions, the spec wants 6; left as it is (add partitions with "
        "kafka-topics --alter)",
        "topic temperature-data has cleanup.policy=compact, the spec wants delete; left as it is",
        "topic device-registration has cleanup.policy=compact,delete, the spec wants compact; left as it is",
    ]


def test_result_line_is_one_sorted_json_line():
    line = kt.result_line(["b", "a"], ["d", "c"], [])
    assert "\n" not in line
    assert json.loads(line) == {"existing": ["a", "b"], "created": ["c", "d"], "would_create": []}


@pytest.mark.parametrize("argv", [
    ["ensure", "--spec", "[]"],                                   # --bootstrap missing
    ["ensure", "--bootstrap", "k:9092", "--spec", "[]", "--replication", "three"],
    ["ensure", "--bootstrap", "k:9092", "--spec", "[]", "--bogus"],
    [],                                                           # no subcommand
])
def test_bad_flags_print_usage_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        kt.main(argv)
    assert exit_.value.code == 2
    assert "usage: iot-topics" in capsys.readouterr().err


def test_bad_spec_exits_2_before_touching_kafka(capsys, monkeypatch):
    monkeypatch.setattr(kt, "admin_client", lambda *_: pytest.fail("must not connect"))
    code = kt.main(["ensure", "--bootstrap", "k:9092", "--spec", '[{"name": "t", "partitions": 0}]'])
    err = capsys.readouterr()
    assert code == 2 and err.out == ""
    assert "iot-topics: spec[1] (t).partitions: must be a whole number of 1 or more" in err.err


# ------------------------------------------------------------------ Kafka calls against fakes


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class FakeAdmin:
    def __init__(self, clock, answers=(), create_results=()):
        self.clock, self.answers, self.create_results = clock, list(answers), list(create_results)
        self.create_calls: list[list] = []

    def list_topics(self, timeout):
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            self.clock.now += timeout
            raise answer
        return SimpleNamespace(brokers=dict.fromkeys(range(answer)), topics={})

    def poll(self, _timeout):
        return 0

    def create_topics(self, new_topics, **_kw):
        self.create_calls.append([t.topic for t in new_topics])
        results = self.create_results.pop(0)
        return {t.topic: SimpleNamespace(result=_result(results[t.topic])) for t in new_topics}


def _result(error_code):
    def result():
        if error_code is not None:
            raise KafkaException(KafkaError(error_code))
    return result


def test_waiting_reports_progress_and_returns_once_enough_brokers_are_registered(capsys):
    clock = FakeClock()
    down = KafkaException(KafkaError(KafkaError._TRANSPORT))
    admin = FakeAdmin(clock, [down, down, 1, 1, 1, 1, 1, 1, 3])
    metadata = kt.wait_for_brokers(admin, "kafka-1:9092", 3, 600, kt._LastMessage(), clock, clock.sleep)
    assert len(metadata.brokers) == 3
    err = capsys.readouterr().err
    assert "iot-topics: waiting for Kafka at kafka-1:9092 (" in err
    assert "1 of 3 brokers registered" in err


def test_librdkafka_log_lines_are_kept_without_their_thread_prefix():
    quiet = kt._LastMessage()
    quiet.error = "1/1 brokers are down"
    assert quiet.last == "1/1 brokers are down"
    record = logging.LogRecord("x", logging.ERROR, "", 0, "FAIL [rdkafka#producer-1] [thrd:kafka-1:9092/bootstrap]: "
                               "kafka-1:9092/bootstrap: Failed to resolve 'kafka-1:9092'", None, None)
    quiet.emit(record)
    assert quiet.last == "kafka-1:9092/bootstrap: Failed to resolve 'kafka-1:9092'"


def test_waiting_times_out_naming_the_bootstrap_servers():
    clock = FakeClock()
    admin = FakeAdmin(clock, [1])
    with pytest.raises(kt.TopicsError) as err:
        kt.wait_for_brokers(admin, "kafka-1:9092,kafka-2:9092", 2, 30, kt._LastMessage(), clock, clock.sleep)
    assert str(err.value).startswith("Kafka at kafka-1:9092,kafka-2:9092 did not answer with 2 broker(s) within 30s")
    assert "1 of 2 brokers registered" in str(err.value)
    assert clock.now <= 32


def _plans(*names):
    return [kt.NewTopicPlan(n, 1, 1, {"cleanup.policy": "delete"}) for n in names]


def test_all_missing_topics_go_in_one_request_and_a_race_counts_as_existing():
    clock = FakeClock()
    admin = FakeAdmin(clock, create_results=[{"a": None, "b": KafkaError.TOPIC_ALREADY_EXISTS, "c": None}])
    created, raced = kt.create_topics(admin, _plans("a", "b", "c"), 100, clock, clock.sleep)
    assert admin.create_calls == [["a", "b", "c"]]
    assert (sorted(created), raced) == (["a", "c"], ["b"])


def test_retriable_errors_are_retried_and_a_timed_out_create_that_landed_counts_as_created():
    clock = FakeClock()
    admin = FakeAdmin(clock, create_results=[{"a": None, "b": KafkaError.REQUEST_TIMED_OUT},
                                             {"b": KafkaError.TOPIC_ALREADY_EXISTS}])
    created, raced = kt.create_topics(admin, _plans("a", "b"), 100, clock, clock.sleep)
    assert admin.create_calls == [["a", "b"], ["b"]]
    assert (created, raced) == (["a", "b"], [])


def test_other_errors_fail_naming_the_topic_and_kafkas_error():
    clock = FakeClock()
    admin = FakeAdmin(clock, create_results=[{"a": None, "b": KafkaError.INVALID_REPLICATION_FACTOR}])
    with pytest.raises(kt.TopicsError, match="could not create topic b: INVALID_REPLICATION_FACTOR"):
        kt.create_topics(admin, _plans("a", "b"), 100, clock, clock.sleep)
