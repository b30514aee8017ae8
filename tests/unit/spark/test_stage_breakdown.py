"""scripts/bench spark's per-stage breakdown, read back from the fields the job logs (iot_jobs.runtime)."""
from __future__ import annotations

import datetime

from iot_jobs import runtime

from tooling.bench import spark as bench_spark

PROGRESS = {"batchId": 7, "numInputRows": 900,
            "durationMs": {"latestOffset": 3, "queryPlanning": 40, "walCommit": 20, "getBatch": 0,
                           "addBatch": 700, "commitOffsets": 25, "triggerExecution": 800},
            "stateOperators": [{"numRowsTotal": 10, "commitTimeMs": 300}]}


def _line(when: datetime.datetime, fields: str, rows: int = 900) -> str:
    stamp = when.strftime("%Y-%m-%d %H:%M:%S,") + f"{when.microsecond // 1000:03d}"
    return (f"{stamp} level=INFO logger=iot_stack.jobs progress query=threshold-events batch=1 rows={rows} "
            f"input_rate=1 processed_rate=1 state_rows=10 {fields}")


def test_the_job_logs_every_stage_spark_reports_in_the_order_they_run():
    assert runtime.stage_fields(PROGRESS) == ("offsets_ms=3 planning_ms=40 wal_ms=20 get_batch_ms=0 add_batch_ms=700 "
                                             "commit_ms=25 trigger_ms=800 state_commit_ms=300")
    assert runtime.stage_fields({"durationMs": {"triggerExecution": 5}}) == "trigger_ms=5"


def test_the_breakdown_averages_the_batches_with_rows_inside_the_window_only():
    t0 = datetime.datetime(2026, 11, 26, 5, 0, 0, tzinfo=datetime.UTC)
    second = datetime.timedelta(seconds=1)
    fields = runtime.stage_fields(PROGRESS)
    lines = [
        _line(t0 - second, "add_batch_ms=9999 trigger_ms=9999"),           # before the window
        _line(t0, fields),
        _line(t0 + second, fields.replace("add_batch_ms=700", "add_batch_ms=900")),
        _line(t0 + 2 * second, "add_batch_ms=5 trigger_ms=5", rows=0),       # an empty batch
        "2026-11-26T05:00:01.000Z level=WARN logger=Other something else",
        _line(t0 + 10 * second, "add_batch_ms=9999 trigger_ms=9999"),       # after it
    ]
    stages = bench_spark.stage_breakdown(lines, t0.timestamp(), (t0 + 5 * second).timestamp())
    assert stages["batches"] == 2
    assert stages["add_batch_ms"] == 800 and stages["trigger_ms"] == 800 and stages["state_commit_ms"] == 300
    assert bench_spark.stage_breakdown(lines, 0, 1) == {}
