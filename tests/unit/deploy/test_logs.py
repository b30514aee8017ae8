"""deploy/logs.py: iot-logs' options, names, filtering and formatting, and the retention refusals of preflight."""
from __future__ import annotations

import json

import pytest

from deploy import logs

# `docker service logs --timestamps` of a one-node Swarm (Docker 20.10) whose task failed and was restarted
# by Swarm: Docker prints task by task, not in time order; the third line is a newer task's.
OUTPUT = (
    '2026-11-27T06:57:32.828888776Z site-a_bridge.1.wqhuo14phqpc@node-1    | '
    'ts=2026-11-27T06:57:32 level=error service=bridge msg="MQTT connection refused"\n'
    '2026-11-27T06:57:48.347305130Z site-a_bridge.1.pdwdi48tyjex@node-1    | '
    'ts=2026-11-27T06:57:48 level=info service=bridge msg="bridge starting"\n'
) + """\
2026-11-27T06:57:24.834467175Z site-a_bridge.1.fnab46yk7t6a@node-1    | ts=2026-11-27T06:57:24 level=ERROR msg=older
2026-11-27T06:57:50.000000000Z site-a_bridge.2.abcdefabcdef@node-2    |
not a log line
"""


def test_a_stack_service_is_named_after_the_site_alias():
    assert logs.stack_service("site-a", "bridge") == "site-a_bridge"


def test_site_services_keeps_only_the_sites_stack_without_its_prefix():
    names = ["site-a_kafka-1", "site-a_bridge", "site-ab_bridge", "other"]
    assert logs.site_services(names, "site-a") == ["bridge", "kafka-1"]


def test_a_line_gives_its_time_task_node_and_message():
    line = logs.parse_line(OUTPUT.splitlines()[0])
    assert line == logs.LogLine("2026-11-27T06:57:32.828888776Z", "site-a_bridge.1.wqhuo14phqpc", "node-1",
                                'ts=2026-11-27T06:57:32 level=error service=bridge msg="MQTT connection refused"')
    assert logs.parse_line("not a log line") is None
    assert logs.parse_line(OUTPUT.splitlines()[3]).message == ""


def test_grep_ignores_case_by_default_and_searches_only_the_message():
    found = logs.select(OUTPUT, "error")
    assert [line.task for line in found] == ["site-a_bridge.1.fnab46yk7t6a", "site-a_bridge.1.wqhuo14phqpc"]
    assert [line.task for line in logs.select(OUTPUT, "ERROR", ignore_case=False)] == ["site-a_bridge.1.fnab46yk7t6a"]
    assert logs.select(OUTPUT, "node-1") == []          # the task and node are no part of the message


def test_lines_come_oldest_first_across_tasks_and_tail_keeps_the_last():
    times = [line.time[11:19] for line in logs.select(OUTPUT, None)]
    assert times == ["06:57:24", "06:57:32", "06:57:48", "06:57:50"]
    assert [line.time[11:19] for line in logs.select(OUTPUT, None, tail=2)] == ["06:57:48", "06:57:50"]


def test_a_printed_line_names_its_task_and_node():
    line = logs.select(OUTPUT, "starting")[0]
    assert logs.format_line(line) == ('2026-11-27T06:57:48.347305130Z site-a_bridge.1.pdwdi48tyjex@node-1 '
                                      'ts=2026-11-27T06:57:48 level=info service=bridge msg="bridge starting"')


RESULT = {"sites": ["datacenter", "site-a"], "services": ["site-a_bridge", "site-a_kafka-1"], "rc": "0",
          "stdout": OUTPUT, "stderr": ""}


def test_an_unknown_site_names_the_known_ones():
    assert logs.problems(RESULT, "site-z", "bridge") == [
        "unknown site 'site-z' in this inventory (sites: datacenter, site-a)"]


def test_an_unknown_service_names_the_sites_services():
    assert logs.problems(RESULT, "site-a", "brige") == ["unknown service 'brige' at site-a (services: bridge, kafka-1)"]


def test_a_manager_that_did_not_answer_and_a_failed_read_are_named():
    assert "did not answer" in logs.problems({"sites": ["site-a"]}, "site-a", "bridge")[0]
    failed = dict(RESULT, rc="1", stderr="Error response from daemon: no such task or service")
    assert logs.problems(failed, "site-a", "bridge") == [
        "docker service logs site-a_bridge failed (exit 1): Error response from daemon: no such task or service"]
    assert logs.problems(RESULT, "site-a", "bridge") == []


def test_a_read_that_ran_out_of_time_names_the_limit_and_the_option():
    timed_out = dict(RESULT, rc="124", stderr="", timeout_s="120")
    [problem] = logs.problems(timed_out, "site-a", "bridge")
    assert "site-a_bridge did not finish within 120 s on site-a's manager" in problem and "--timeout" in problem


@pytest.mark.parametrize("argv", [
    [],                                                                   # nothing
    ["-i", "inv", "--site", "site-a"],                                    # no service
    ["-i", "inv", "--site", "site-a", "--service", "bridge", "--since", "ten minutes"],
    ["-i", "inv", "--site", "site-a", "--service", "bridge", "--tail", "0"],
    ["-i", "inv", "--site", "site-a", "--service", "bridge", "--grep", "("],
    ["-i", "inv", "--site", "site-a", "--service", "bridge", "--colour"],
    ["-i", "inv", "--site", "site-a", "--service", "bridge", "--timeout", "0"],
])
def test_bad_options_print_the_usage_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        logs.parse_args(argv)
    assert exit_.value.code == 2
    assert "usage: iot-logs" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["10m", "1h30m", "90s", "1795762644", "2026-11-27", "2026-11-27T06:00:00Z",
                                   "2026-11-27T06:00:00.5+01:00"])
def test_since_takes_what_docker_takes(value):
    args, _ = logs.parse_args(["-i", "inv", "--site", "s", "--service", "b", "--since", value])
    assert args.since == value


def test_the_playbook_gets_the_names_as_one_json_extra_var_and_the_rest_after_the_double_dash(tmp_path):
    args, extra = logs.parse_args(["-i", "inv", "--site", "site-a", "--service", "bridge", "--since", "10m",
                                   "--grep", "error", "--", "--vault-password-file", "pw"])
    assert args.grep == "error" and args.tail is None and not args.case_sensitive
    cmd = logs.playbook_command(args, tmp_path / "out.json", extra)
    assert cmd[:3] == ["ansible-playbook", "-i", "inv"] and cmd[3].endswith("ansible/logs.yml")
    assert json.loads(cmd[cmd.index("-e") + 1]) == {"logs_site": "site-a", "logs_service": "bridge",
                                                    "logs_since": "10m", "logs_result_file": str(tmp_path / "out.json"),
                                                    "logs_timeout_s": 120}
    assert cmd[-2:] == ["--vault-password-file", "pw"]


def test_the_default_retention_is_accepted():
    assert logs.log_retention_refusals({"engine_log_max_size": "50m", "engine_log_max_file": 3,
                                        "stack_log_max_file": "3", "swarm_task_history_limit": 5}) == []


@pytest.mark.parametrize("name,value", [("engine_log_max_size", "50MB"), ("stack_log_max_size", "0m"),
                                        ("engine_log_max_file", 0), ("stack_log_max_file", "three"),
                                        ("swarm_task_history_limit", -1)])
def test_a_retention_docker_would_refuse_or_that_keeps_nothing_is_named(name, value):
    refusals = logs.log_retention_refusals({name: value})
    assert len(refusals) == 1 and refusals[0].startswith(f"{name} is {value!r}")
