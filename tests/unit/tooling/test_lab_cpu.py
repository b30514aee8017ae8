"""tooling/lab/cpu.py: a lab's CPU per service from cgroup counters, read on a fake cgroup tree."""
from __future__ import annotations

from tooling.lab import cpu

A = cpu.Container("site-a-1", "site-a_kafka-1", "aaa")
B = cpu.Container("site-a-2", "site-a_bridge", "bbb")
B2 = cpu.Container("site-a-1", "site-a_bridge", "ccc")


def test_the_counter_is_read_from_cgroup_v1_and_v2_and_a_gone_container_is_none(tmp_path):
    v1 = tmp_path / "cpuacct" / "docker" / "aaa"
    v1.mkdir(parents=True)
    (v1 / "cpuacct.usage").write_text("1500000000\n")
    v2 = tmp_path / "system.slice" / "docker-bbb.scope"
    v2.mkdir(parents=True)
    (v2 / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    assert cpu.cpu_ns("aaa", tmp_path) == 1_500_000_000
    assert cpu.cpu_ns("bbb", tmp_path) == 2_500_000_000
    assert cpu.cpu_ns("gone", tmp_path) is None


def test_docker_ps_lines_name_the_swarm_service_or_else_the_container():
    text = "aaa\tsite-a_kafka-1.1.xyz\tsite-a_kafka-1\nddd\tfervent_agnesi\t\n\n"
    assert cpu.parse_ps("site-a-1", text) == [A, cpu.Container("site-a-1", "fervent_agnesi", "ddd")]


def test_replicas_of_a_service_add_up_and_a_container_that_started_meanwhile_is_left_out():
    before = {A: 0, B: 1_000_000_000}
    after = {A: 30_000_000_000, B: 4_000_000_000, B2: 9_000_000_000}
    assert cpu.cores(before, after, 60.0) == {"site-a_kafka-1": 0.5, "site-a_bridge": 0.05}
    before[B2] = 3_000_000_000
    assert round(cpu.cores(before, after, 60.0)["site-a_bridge"], 9) == 0.15


def test_the_table_ranks_the_busiest_first_sums_the_rest_and_totals():
    text = cpu.table({"x": 0.1, "y": 0.3, "z": 0.05}, 60, top=2)
    assert text.splitlines() == ["lab CPU over 60 s, cores (core-seconds per second), busiest first:",
                                 "   0.300  y", "   0.100  x", "   0.050  1 others", "   0.450  total of 3"]


def test_the_last_minute_spans_at_least_the_window_from_the_newest_sample():
    now = [0.0]
    counts = {"aaa": 0}
    minute = cpu.LastMinute([A], window_s=60, read=counts.get, clock=lambda: now[0])
    assert minute.table() is None
    for step in range(9):          # a sample every 15 s for 120 s, A busy 0.5 core throughout
        now[0] = step * 15.0
        counts["aaa"] = int(step * 15.0 * 0.5e9)
        minute.take()
    assert [at for at, _ in minute.samples] == [60.0, 75.0, 90.0, 105.0, 120.0]
    assert minute.table().splitlines()[:2] == ["lab CPU over 60 s, cores (core-seconds per second), busiest first:",
                                               "   0.500  site-a_kafka-1"]
