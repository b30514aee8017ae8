"""threshold-detector: temperature-data -> temperature-threshold-events (+ dead-letter).

Environment (spark/README.md has the full list): KAFKA_BOOTSTRAP_SERVERS, SITE,
CHECKPOINT_DIR required; STARTING_OFFSETS, THRESHOLDS / THRESHOLDS_FILE,
STATE_TTL_SECONDS, READINGS_TOPIC[_PATTERN], SENSOR_REGISTRATION_TOPIC[_PATTERN],
THRESHOLD_EVENTS_TOPIC, DEAD_LETTER_TOPIC, TRIGGER_INTERVAL, DEAD_LETTER_TRIGGER_INTERVAL, KAFKA_OPTION_*.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # spark/: the iot_jobs package

from iot_jobs import detector, legacy_state, readings, runtime  # noqa: E402
from iot_jobs.hysteresis import ConfigError, ThresholdConfig  # noqa: E402

from services.common import names  # noqa: E402

JOB = "threshold-detector"


def run() -> None:
    runtime.configure_logging()
    kafka = runtime.KafkaSettings.from_env()
    site = runtime.env("SITE")
    try:
        config = ThresholdConfig.from_env()
    except ConfigError as err:
        raise runtime.SettingsError(str(err)) from None
    ttl_ms = runtime.env_int("STATE_TTL_SECONDS", 24 * 3600, minimum=1) * 1000
    source = runtime.Source.from_env("READINGS", names.TEMPERATURE_DATA)
    registry = runtime.Source.from_env("SENSOR_REGISTRATION", names.SENSOR_REGISTRATION)
    events_topic = runtime.env("THRESHOLD_EVENTS_TOPIC", names.THRESHOLD_EVENTS)
    dead_letter_topic = runtime.env("DEAD_LETTER_TOPIC", names.DEAD_LETTER)   # "none" disables
    events_checkpoint = runtime.checkpoint(JOB, detector.CHECKPOINT)
    dead_letter_checkpoint = runtime.checkpoint(JOB, "dead-letter")

    spark = runtime.session(JOB, detector.SESSION_CONF)
    start, initial = legacy_state.carry_over(spark, events_checkpoint, source.topic, source.pattern, ttl_ms)
    if start is not None:
        runtime.log.info("first start of the bucketed detector: carrying over the per-sensor checkpoint's "
                         "state and position (%s)", json.dumps(start))
    parsed = readings.parse_readings(runtime.read_kafka(spark, kafka, source, starting=start), site)
    registrations = None
    if registry.topic != "none":
        # The registry is compacted: always read all of it.
        registrations = detector.registration_rows(runtime.read_kafka(spark, kafka, registry, whole_topic=True))
    events = detector.detect_thresholds(readings.valid_readings(parsed), registrations, config, ttl_ms, initial)
    writers = [runtime.write_kafka(detector.events_to_kafka(events), kafka, "threshold-events",
                                   events_checkpoint, topic=events_topic)]
    if dead_letter_topic != "none":
        writers.append(runtime.write_kafka(readings.dead_letters(parsed, dead_letter_topic), kafka,
                                           "dead-letter", dead_letter_checkpoint,
                                           trigger=runtime.DEAD_LETTER_TRIGGER_INTERVAL))
    runtime.run_until_stopped(spark, writers)


if __name__ == "__main__":
    runtime.main(run)
