"""Pure parts of scripts/bench site: cgroup counters read from their files (v1 and v2), cores from two reads,
the cost per 1,000 readings/s, the pacer's arithmetic, the devices' readings, and which of the rendered
stack's settings the site's JVMs get."""
from __future__ import annotations

import json

import pytest

from tooling.bench import cgroup
from tooling.bench import site as bench_site
from tooling.testbed import pipeline


def test_proc_cgroup_lines_give_each_controller_its_path_and_v2_its_unified_one():
    v1 = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"
    assert cgroup.cgroup_paths(v1) == {"memory": "/docker/abc", "cpu": "/docker/abc", "cpuacct": "/docker/abc",
                                       "name=systemd": "/docker/abc"}
    assert cgroup.cgroup_paths("0::/system.slice/docker-abc.scope\n") == {"": "/system.slice/docker-abc.scope"}


def test_stat_value_reads_one_key_and_is_zero_when_absent():
    text = "usage_usec 1500\nuser_usec 1000\n"
    assert cgroup.stat_value(text, "usage_usec") == 1500
    assert cgroup.stat_value(text, "usage") == 0


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_read_takes_v1_cpuacct_and_memory_less_inactive_file(tmp_path, monkeypatch):
    _write(tmp_path / "cpuacct/docker/abc/cpuacct.usage", "2500000000\n")
    _write(tmp_path / "memory/docker/abc/memory.usage_in_bytes", str(300 * 2**20))
    _write(tmp_path / "memory/docker/abc/memory.stat", f"cache 5\ntotal_inactive_file {100 * 2**20}\n")
    monkeypatch.setattr(cgroup, "Path", _proc(tmp_path, "4:cpu,cpuacct:/docker/abc\n9:memory:/docker/abc\n"))
    assert cgroup.read(42, tmp_path) == cgroup.Counters(2_500_000_000, 200 * 2**20)


def test_read_takes_v2_usage_usec_and_memory_current(tmp_path, monkeypatch):
    scope = tmp_path / "system.slice/docker-abc.scope"
    _write(scope / "cpu.stat", "usage_usec 3000000\nuser_usec 2000000\n")
    _write(scope / "memory.current", str(50 * 2**20))
    _write(scope / "memory.stat", f"anon 1\ninactive_file {10 * 2**20}\n")
    monkeypatch.setattr(cgroup, "Path", _proc(tmp_path, "0::/system.slice/docker-abc.scope\n"))
    assert cgroup.read(42, tmp_path) == cgroup.Counters(3_000_000_000, 40 * 2**20)


def _proc(tmp_path, text):
    """A Path that serves /proc/42/cgroup from `text` and everything else from the file system."""
    from pathlib import Path

    _write(tmp_path / "proc-42-cgroup", text)

    def path(name):
        return tmp_path / "proc-42-cgroup" if str(name) == "/proc/42/cgroup" else Path(name)
    return path


def test_cores_are_cpu_nanoseconds_per_second_of_wall_time():
    before, after = cgroup.Counters(1_000_000_000, 0), cgroup.Counters(31_000_000_000, 0)
    assert cgroup.cores(before, after, 60) == pytest.approx(0.5)


def test_cost_per_thousand_readings_is_the_least_squares_slope():
    assert bench_site.per_thousand({0: 0.2, 1000: 0.6, 2000: 1.0}) == pytest.approx(0.4)
    # Noise around the line: the slope of the best fit, not of the end points.
    assert bench_site.per_thousand({0: 0.2, 500: 0.5, 1000: 0.6, 2000: 1.0}) == pytest.approx(837.5 / 2187.5)
    assert bench_site.per_thousand({0: 0.2}) is None
    assert bench_site.per_thousand({}) is None


def test_the_pacer_sends_what_the_rate_owes_and_never_a_negative_count():
    assert bench_site.due(1.0, 500, 0) == 500
    assert bench_site.due(1.0, 500, 480) == 20
    assert bench_site.due(0.5, 500, 300) == 0


def test_a_devices_readings_alternate_hot_and_cold_runs_with_the_publish_time():
    values = [json.loads(bench_site.reading(n, 3, 1_700_000_000_000)) for n in range(7)]
    assert [v["temperature"] for v in values] == [35.0] * 3 + [20.0] * 3 + [35.0]
    assert {v["timestamp"] for v in values} == {1_700_000_000_000}
    assert {v["unit"] for v in values} == {"C"}


def test_site_jvms_get_the_rendered_heaps_and_options_and_the_exporter_only_when_asked():
    rendered = pipeline.render()
    for role in ("zookeeper", "kafka", "cassandra"):
        service = rendered.edge[f"{role}-1"]
        with_exporter = pipeline.jvm_environment(service, exporters=True)
        assert with_exporter, role
        assert set(with_exporter) <= set(service["environment"])
        assert "JMX_EXPORTER_PORT" in with_exporter
        assert "JMX_EXPORTER_PORT" not in pipeline.jvm_environment(service, exporters=False)
    assert pipeline.jvm_environment(rendered.edge["kafka-1"], exporters=False)["KAFKA_HEAP_OPTS"]
    assert pipeline.jvm_environment(rendered.edge["cassandra-1"], exporters=False)["CASSANDRA_HEAP"]


def test_every_service_in_the_table_is_a_container_the_site_starts():
    rendered = pipeline.render()
    for service in ("mosquitto", "bridge", "cassandra-adapter", *bench_site.SPARK_JOBS):
        assert service in rendered.edge, service
    assert set(bench_site.SERVICES) >= {"zookeeper", "kafka", "cassandra", *bench_site.SPARK_JOBS}


def test_env_overrides_name_a_site_jvm_and_a_variable():
    assert bench_site.jvm_overrides(["kafka:KAFKA_JVM_OPTS=-XX:TieredStopAtLevel=1 -Xss1m", "kafka:A=",
                                     "cassandra:JVM_EXTRA_OPTS=-Dx=y"]) == {
        "kafka": {"KAFKA_JVM_OPTS": "-XX:TieredStopAtLevel=1 -Xss1m", "A": ""},
        "cassandra": {"JVM_EXTRA_OPTS": "-Dx=y"}}
    for bad in ("bridge:A=1", "kafka:A", "kafka:=1", "KAFKA_JVM_OPTS=1"):
        with pytest.raises(ValueError, match="zookeeper|kafka|cassandra:NAME=VALUE"):
            bench_site.jvm_overrides([bad])


def test_conf_items_are_spark_settings_with_a_value():
    assert bench_site.spark_conf(["spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -Da=b", "spark.x="]) == {
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -Da=b", "spark.x": ""}
    for bad in ("spark.x", "ui.enabled=false", "=1"):
        with pytest.raises(ValueError, match="spark.KEY=VALUE"):
            bench_site.spark_conf([bad])


def test_busy_ticks_are_the_cpu_line_less_idle_and_iowait():
    stat = "cpu  100 5 50 1000 40 1 2 3 0 0\ncpu0 50 2 25 500 20 0 1 1 0 0\n"
    assert bench_site.busy_ticks(stat) == 100 + 5 + 50 + 1 + 2 + 3


def test_kafka_request_counts_sum_api_versions_per_request_type():
    metrics = ('# HELP kafka_network_requests_total x\n'
               'kafka_network_requests_total{request="Fetch",version="12",} 10.0\n'
               'kafka_network_requests_total{request="Fetch",version="13",} 5.0\n'
               'kafka_network_requests_total{request="Produce",version="9",} 7.0\n'
               'kafka_server_brokertopicmetrics_messagesin_total 99.0\n')
    assert bench_site.request_counts(metrics) == {"Fetch": 15.0, "Produce": 7.0}


def _result(rate, machine, cores):
    services = {s: {"cores": cores / len(bench_site.SERVICES), "memory_mib": 10.0} for s in bench_site.SERVICES}
    return {"rate": rate, "machine_cores": machine, "services": services, "kafka_requests": {}, "sent": rate * 60,
            "events_expected": 0, "generator_cores": 0.01, "devices": [],
            "paths": {k: bench_site.percentiles([5] * rate * 60) for k in "abe"}}


def test_the_table_fits_the_cost_per_reading_only_through_rates_that_left_cpu_to_spare(capsys):
    results = [_result(0, 0.2, 0.1), _result(500, 1.0, 0.6), _result(1000, 1.99, 0.9)]
    bench_site.print_table(results, {s: 1.0 for s in bench_site.SERVICES}, cpus=2)
    out = capsys.readouterr().out
    assert "1000/s*" in out and "500/s*" not in out
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert total.split()[4] == "1.000"          # (0.6 - 0.1) / 500 per reading/s, not the saturated 1000/s
    assert bench_site.saturated(results[2], 2) and not bench_site.saturated(results[1], 2)


def test_a_jobs_extra_conf_goes_before_its_file_and_the_baseline_undoes_the_cuts():
    service = pipeline.render().edge["threshold-detector"]
    command = pipeline._spark_command(service, "1g", bench_site.BASELINE["job_conf"])
    assert command[-1] == service["command"][-1] and command[-1].endswith(".py")
    assert command[-3:-1] == ["--conf", "spark.sql.streaming.pollingDelay=10ms"]
    assert pipeline._spark_command(service, "1g")[-1] == command[-1]
    # The stack gives the job a trigger; the baseline's empty one counts as unset (back to back).
    assert service["environment"]["TRIGGER_INTERVAL"]
    assert bench_site.BASELINE["job_env"] == {"TRIGGER_INTERVAL": ""}


def test_ratios_compare_the_stacks_site_with_the_baseline_rate_by_rate(capsys):
    baseline = [_result(0, 0.5, 0.5), _result(100, 1.0, 1.0)]
    stack = [_result(0, 0.1, 0.1), _result(100, 0.8, 0.8)]
    stack[1]["paths"]["e"] = bench_site.percentiles([1000])
    baseline[1]["paths"]["e"] = bench_site.percentiles([4000])
    bench_site.print_ratios(baseline, stack)
    out = capsys.readouterr().out
    assert "0/s  cores 0.20x" in out
    assert "100/s  cores 0.80x" in out and "e p50 0.25x" in out and "a p50 1.00x" in out
