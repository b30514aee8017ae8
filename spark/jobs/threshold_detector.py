"""threshold-detector: temperature-data -> temperature-threshold-events (+ dead-letter).

Environment: runtime.COMMON_OPTIONS and OPTIONS below (spark/README.md's tables are made from them).
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # spark/: the iot_jobs package

from iot_jobs import detector, legacy_state, readings, runtime  # noqa: E402
from iot_jobs.hysteresis import THRESHOLD_OPTIONS, ConfigError, ThresholdConfig  # noqa: E402

from services.common import names, settings  # noqa: E402
from services.common.settings import Option, integer  # noqa: E402

JOB = "threshold-detector"

SITE = runtime.READINGS_SITE
STATE_TTL_SECONDS = Option("state_ttl_seconds", "STATE_TTL_SECONDS", 24 * 3600,
                           "seconds a sensor's state is kept after its last reading", integer(1))
READINGS = runtime.topic_options("READINGS", "the readings", names.TEMPERATURE_DATA)
SENSOR_REGISTRATION = runtime.topic_options("SENSOR_REGISTRATION", "the sensor registrations",
                                            names.SENSOR_REGISTRATION,
                                            topic_note="'none': every sensor gets the default limits")
THRESHOLD_EVENTS_TOPIC = Option("threshold_events_topic", "THRESHOLD_EVENTS_TOPIC", names.THRESHOLD_EVENTS,
                                "topic the threshold events are written to")
DEAD_LETTER_TOPIC = Option("dead_letter_topic", "DEAD_LETTER_TOPIC", names.DEAD_LETTER,
                           "topic of the invalid readings ('none': no dead-letter query)")
OPTIONS: tuple[Option, ...] = (SITE, *THRESHOLD_OPTIONS, STATE_TTL_SECONDS, *READINGS, *SENSOR_REGISTRATION,
                               THRESHOLD_EVENTS_TOPIC, DEAD_LETTER_TOPIC, runtime.DEAD_LETTER_TRIGGER_INTERVAL)


def run() -> None:
    runtime.configure_logging()
    kafka = runtime.KafkaSettings.from_env()
    site = settings.value(SITE)
    try:
        config = ThresholdConfig.from_env()
    except ConfigError as err:
        raise runtime.SettingsError(str(err)) from None
    ttl_ms = settings.value(STATE_TTL_SECONDS) * 1000
    source = runtime.Source.from_env(READINGS)
    registry = runtime.Source.from_env(SENSOR_REGISTRATION)
    events_topic = settings.value(THRESHOLD_EVENTS_TOPIC)
    dead_letter_topic = settings.value(DEAD_LETTER_TOPIC)   # "none" disables
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
