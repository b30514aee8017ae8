"""rollups: temperature-data -> temperature-rollups-1m (one-minute windows per sensor).

Environment: KAFKA_BOOTSTRAP_SERVERS, SITE, CHECKPOINT_DIR required;
STARTING_OFFSETS, ROLLUP_WATERMARK ('30 seconds'), READINGS_TOPIC[_PATTERN],
ROLLUPS_TOPIC, TRIGGER_INTERVAL, KAFKA_OPTION_*. Invalid readings are skipped
here: the threshold-detector dead-letters them (once, not once per job).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # spark/: the iot_jobs package

from iot_jobs import readings, rollups, runtime  # noqa: E402

from services.common import names  # noqa: E402

JOB = "rollups"


def run() -> None:
    runtime.configure_logging()
    kafka = runtime.KafkaSettings.from_env()
    site = runtime.env("SITE")
    watermark = runtime.env("ROLLUP_WATERMARK", "30 seconds")
    source = runtime.Source.from_env("READINGS", names.TEMPERATURE_DATA)
    rollups_topic = runtime.env("ROLLUPS_TOPIC", names.ROLLUPS_1M)
    checkpoint = runtime.checkpoint(JOB, "rollups-1m")

    spark = runtime.session(JOB)
    parsed = readings.parse_readings(runtime.read_kafka(spark, kafka, source), site)
    windows = rollups.rollup_1m(readings.valid_readings(parsed), watermark)
    writer = runtime.write_kafka(rollups.rollups_to_kafka(windows), kafka, "rollups-1m", checkpoint,
                                 topic=rollups_topic)
    runtime.run_until_stopped(spark, [writer])


if __name__ == "__main__":
    runtime.main(run)
