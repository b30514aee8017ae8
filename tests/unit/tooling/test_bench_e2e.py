"""Pure parts of scripts/bench e2e: the devices' hot/cold runs and the episodes they open, percentiles, and how
the rendered stack becomes the benchmark's containers (logins dropped, MirrorMaker's own settings kept)."""
from __future__ import annotations

from tooling.bench import e2e as bench_e2e
from tooling.testbed import pipeline
from tooling.testbed.kafka_cluster import KafkaCluster
from tooling.testbed.stack_render import properties


def test_each_hot_run_opens_one_episode_counted_from_the_readings_sent():
    for run in (1, 5, 25):
        for readings in range(0, 8 * run):
            temperatures = [bench_e2e.temperature(n, run) for n in range(readings)]
            openings = sum(1 for n, t in enumerate(temperatures)
                           if t == bench_e2e.HOT and (n == 0 or temperatures[n - 1] == bench_e2e.COLD))
            assert bench_e2e.episodes(readings, run) == openings, (run, readings)


def test_percentiles_pick_from_the_sorted_values_and_say_when_there_are_none():
    assert bench_e2e.percentiles([]) == {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    figures = bench_e2e.percentiles(list(range(100, 0, -1)))
    assert figures == {"n": 100, "p50": 51, "p95": 96, "p99": 100, "max": 100}


def test_the_benchmark_runs_the_rendered_services_without_their_logins():
    rendered = pipeline.render()
    env = pipeline.environment(rendered.edge["cassandra-adapter"], ADAPTER_CASSANDRA_HOSTS="cassandra")
    assert not set(env) & set(pipeline._LOGINS)
    assert env["ADAPTER_GROUP_INSTANCE_ID"] == "site-a-cassandra-adapter-1"       # Swarm's task slot
    assert env["ADAPTER_CASSANDRA_HOSTS"] == "cassandra"
    assert rendered.edge["threshold-detector"]["command"][0] == "submit"
    # Readings are relayed, so the datacenter's adapter stores them.
    assert "temperature-data" in rendered.datacenter_mappings


def test_mirrormaker_keeps_the_rendered_settings_with_one_flow_between_the_test_clusters():
    rendered = pipeline.render()
    site = KafkaCluster("zookeeper", "kafka", "kafka:9092", "127.0.0.1:1")
    dc = KafkaCluster("dc-zookeeper", "dc-kafka", "dc-kafka:9092", "127.0.0.1:2")
    mm2 = properties(pipeline.mm2_properties(rendered.mm2, site, dc))
    assert mm2["clusters"] == "site-a, datacenter"
    assert mm2["site-a.bootstrap.servers"] == "kafka:9092" and mm2["datacenter.bootstrap.servers"] == "dc-kafka:9092"
    assert "temperature-data" in mm2["site-a->datacenter.topics"]
    assert not [k for k in mm2 if k.startswith(("site-b", "datacenter->site-b"))]
    for key in ("refresh.groups.interval.seconds", "offset-syncs.topic.location", "groups.exclude",
                "datacenter.exactly.once.source.support"):
        assert mm2[key] == rendered.mm2[key], key
    assert {v for k, v in mm2.items() if k.endswith("replication.factor")} == {"1"}
    assert not [k for k in mm2 if "sasl" in k or "security" in k]
