"""One local SparkSession for every Spark test module (local[2], 2 shuffle partitions): the JVM
starts once per test run, not once per module."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "spark"))


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    from iot_jobs import runtime
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    runtime.ship_package()
    session = (SparkSession.builder.master("local[2]").appName("test-spark-jobs")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.stateStore.providerClass",
                       "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
