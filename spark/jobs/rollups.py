"""rollups: temperature-data -> temperature-rollups-1m (one-minute windows per sensor).

Environment: runtime.COMMON_OPTIONS and OPTIONS below (spark/README.md's tables are made from them).
Invalid readings are skipped here: the threshold-detector dead-letters them (once, not once per job).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # spark/: the iot_jobs package

from iot_jobs import readings, rollups, runtime  # noqa: E402

from services.common import names, settings  # noqa: E402
from services.common.settings import Option  # noqa: E402

JOB = "rollups"

SITE = runtime.READINGS_SITE
ROLLUP_WATERMARK = Option("rollup_watermark", "ROLLUP_WATERMARK", "30 seconds",
                          "how late a reading may arrive and still count in its one-minute window")
READINGS = runtime.topic_options("READINGS", "the readings", names.TEMPERATURE_DATA)
ROLLUPS_TOPIC = Option("rollups_topic", "ROLLUPS_TOPIC", names.ROLLUPS_1M, "topic the rollups are written to")
OPTIONS: tuple[Option, ...] = (SITE, ROLLUP_WATERMARK, *READINGS, ROLLUPS_TOPIC)


def run() -> None:
    runtime.configure_logging()
    kafka = runtime.KafkaSettings.from_env()
    site = settings.value(SITE)
    watermark = settings.value(ROLLUP_WATERMARK)
    source = runtime.Source.from_env(READINGS)
    rollups_topic = settings.value(ROLLUPS_TOPIC)
    checkpoint = runtime.checkpoint(JOB, "rollups-1m")

    spark = runtime.session(JOB)
    parsed = readings.parse_readings(runtime.read_kafka(spark, kafka, source), site)
    windows = rollups.rollup_1m(readings.valid_readings(parsed), watermark)
    writer = runtime.write_kafka(rollups.rollups_to_kafka(windows), kafka, "rollups-1m", checkpoint,
                                 topic=rollups_topic)
    runtime.run_until_stopped(spark, [writer])


if __name__ == "__main__":
    runtime.main(run)
