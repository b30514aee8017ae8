"""Every Kafka read of every Spark job reads committed records only and skips (and reports) lost data
the same way (issue 12, case 6): one place builds the source options, without a SparkSession."""
from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from iot_jobs import notifier, notifier_sink, runtime  # noqa: E402

from services.common import contracts  # noqa: E402


class _Reader:
    """Stands in for spark.read / spark.readStream: records the options of one Kafka read."""

    def __init__(self):
        self.given: dict[str, str] = {}

    def format(self, name):
        assert name == "kafka"
        return self

    def options(self, **options):
        self.given.update(options)
        return self

    def option(self, key, value):
        self.given[key] = value
        return self

    def load(self):
        return "records"


class _Spark:
    def __init__(self):
        self.read, self.readStream = _Reader(), _Reader()


def test_source_options_read_committed_and_keep_headers_and_skip_lost_data():
    options = runtime.source_options({"kafka.bootstrap.servers": "k:9092"}, {"subscribe": "t"},
                                     {"startingOffsets": "earliest"})
    assert options == {"kafka.bootstrap.servers": "k:9092", "subscribe": "t", "startingOffsets": "earliest",
                       "kafka.isolation.level": "read_committed", "failOnDataLoss": "false", "includeHeaders": "true"}


def test_no_setting_can_make_a_job_read_uncommitted_records(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "k:9092")
    monkeypatch.setenv("KAFKA_OPTION_ISOLATION_LEVEL", "read_uncommitted")
    kafka = runtime.KafkaSettings.from_env()
    options = runtime.source_options(kafka.options, {"subscribe": "t"}, {})
    assert options["kafka.isolation.level"] == "read_committed"


@pytest.mark.parametrize("whole_topic", [False, True])
def test_every_stream_reads_with_the_fixed_source_options(monkeypatch, whole_topic):
    spark = _Spark()
    kafka = runtime.KafkaSettings({"kafka.bootstrap.servers": "k:9092"}, "latest", "site-a-rollups")
    source = runtime.Source(pattern=r".+\.temperature-threshold-events")
    assert runtime.read_kafka(spark, kafka, source, whole_topic=whole_topic) == "records"
    assert spark.readStream.given == runtime.source_options(
        {**kafka.options, "groupIdPrefix": "site-a-rollups"}, source.options(),
        {"startingOffsets": "earliest" if whole_topic else "latest"})


def test_the_notifiers_registry_batches_read_with_the_same_options(monkeypatch):
    monkeypatch.setattr(notifier, "latest_registrations", lambda records, contract, site: records)
    spark = _Spark()
    events = type("Events", (), {"sparkSession": spark})()
    kafka = runtime.KafkaSettings({"kafka.bootstrap.servers": "k:9092"}, "latest", "dc-notifier")
    sink = notifier_sink.BatchSink(kafka, {"subscribePattern": "s"},
                                   {"subscribePattern": "d"}, "dc", "notifications", "dead-letter", None)
    assert sink.registry(events, {"subscribePattern": "s"}, contracts.SENSOR) == "records"
    assert spark.read.given == runtime.source_options(
        {"kafka.bootstrap.servers": "k:9092", "groupIdPrefix": "dc-notifier"}, {"subscribePattern": "s"},
        {"startingOffsets": "earliest", "endingOffsets": "latest"})


@pytest.mark.parametrize(("start", "end", "found"), [
    ('{"a": {"0": 5, "1": 7}}', '{"a": {"0": 9, "1": 7}}', []),
    ('{"a": {"0": 5}, "b": {"0": 3}}', '{"a": {"0": 9}}', ["b[0] is gone at offset 3"]),
    ('{"a": {"0": 500}}', '{"a": {"0": 2}}', ["a[0] went back from offset 500 to 2"]),
    ({"a": {"0": 500}}, "{'a': {'0': 2}}", ["a[0] went back from offset 500 to 2"]),     # dict / str(dict)
    ('{"a": {"0": 5}}', "{}", ["a[0] is gone at offset 5"]),
    (None, '{"a": {"0": 2}}', []), ('{"a": {"0": 5}}', "garbage", []), ("", "", []), ("{}", "{}", []),
])
def test_offset_regressions_name_gone_and_reset_partitions(start, end, found):
    assert runtime.offset_regressions(start, end) == found


class _Query:
    name = "notifications"

    def __init__(self, progress, recent=()):
        self.lastProgress, self.recentProgress = progress, list(recent)


def test_a_batch_that_skipped_data_is_logged_with_a_running_count(caplog):
    progress = {"batchId": 7, "sources": [{"startOffset": '{"site-x.e": {"0": 4}}', "endOffset": "{}"},
                                          {"startOffset": '{"site-a.e": {"0": 4}, "site-b.e": {"0": 1}}',
                                           "endOffset": '{"site-a.e": {"0": 6}}'}]}
    runtime._skipped.clear()
    with caplog.at_level("WARNING", logger="iot_stack.jobs"):
        runtime._log_progress(_Query(progress), {})
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "kafka data skipped query=notifications batch=7 skipped_total=1: site-x.e[0] is gone at offset 4 "
        "(failOnDataLoss=false)",
        "kafka data skipped query=notifications batch=7 skipped_total=2: site-b.e[0] is gone at offset 1 "
        "(failOnDataLoss=false)"]


def test_batches_between_two_progress_checks_are_checked_too(caplog):
    def batch(n, end):
        return {"batchId": n, "sources": [{"startOffset": '{"site-a.e": {"0": 10}}', "endOffset": end}]}
    recent = [batch(5, '{"site-a.e": {"0": 10}}'), batch(6, '{"site-a.e": {"0": 3}}'),
              batch(7, '{"site-a.e": {"0": 11}}')]
    runtime._skipped.clear()
    with caplog.at_level("WARNING", logger="iot_stack.jobs"):
        runtime._log_progress(_Query(recent[-1], recent), {"notifications": 5})
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "kafka data skipped query=notifications batch=6 skipped_total=1: site-a.e[0] went back from offset 10 to 3 "
        "(failOnDataLoss=false)"]


def test_the_dead_letter_query_runs_every_10s_and_the_event_query_back_to_back_by_default(monkeypatch):
    for variable in ("TRIGGER_INTERVAL", "DEAD_LETTER_TRIGGER_INTERVAL"):
        monkeypatch.delenv(variable, raising=False)
    assert runtime.trigger_options() == {}
    assert runtime.trigger_options(runtime.DEAD_LETTER_TRIGGER_INTERVAL) == {"processingTime": "10 seconds"}
    monkeypatch.setenv("TRIGGER_INTERVAL", "2 seconds")
    monkeypatch.setenv("DEAD_LETTER_TRIGGER_INTERVAL", "0 seconds")
    assert runtime.trigger_options() == {"processingTime": "2 seconds"}
    assert runtime.trigger_options(runtime.DEAD_LETTER_TRIGGER_INTERVAL) == {"processingTime": "0 seconds"}
