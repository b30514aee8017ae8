"""notifier (datacenter): <site>.temperature-threshold-events -> notifications (+ webhook).

Environment: KAFKA_BOOTSTRAP_SERVERS, CHECKPOINT_DIR required; SITE (site of
unprefixed topics, default 'datacenter'), STARTING_OFFSETS,
THRESHOLD_EVENTS_TOPIC_PATTERN, SENSOR_REGISTRATION_TOPIC_PATTERN,
DEVICE_REGISTRATION_TOPIC_PATTERN, NOTIFICATIONS_TOPIC, DEAD_LETTER_TOPIC,
WEBHOOK_URL or WEBHOOK_URL_FILE (a secret), WEBHOOK_CHAT_ID, WEBHOOK_ATTEMPTS,
WEBHOOK_TIMEOUT_SECONDS, WEBHOOK_BACKOFF_SECONDS, ANNOUNCED_TTL_SECONDS, TRIGGER_INTERVAL,
KAFKA_OPTION_*.
An event repeated by a site's detector is announced once (notifier.announce_once).
The notifier's own delivery is at least once: a micro-batch interrupted by a
crash of the notifier is sent again.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # spark/: the iot_jobs package

from iot_jobs import notifier, runtime  # noqa: E402
from iot_jobs.notifier_sink import BatchSink  # noqa: E402
from iot_jobs.webhook import Webhook  # noqa: E402

from services.common import names  # noqa: E402

JOB = "notifier"


def webhook_from_env() -> Webhook | None:
    url = runtime.env("WEBHOOK_URL", "")
    path = runtime.env("WEBHOOK_URL_FILE", "")
    if url and path:
        raise runtime.SettingsError("set WEBHOOK_URL or WEBHOOK_URL_FILE, not both")
    if path:
        try:
            url = Path(path).read_text(encoding="utf-8").strip()
        except OSError as err:
            raise runtime.SettingsError(f"WEBHOOK_URL_FILE={path}: cannot read it ({err.strerror})") from None
    if not url:
        return None
    if not url.startswith(("http://", "https://")):
        raise runtime.SettingsError("WEBHOOK_URL must start with http:// or https://")
    return Webhook(url=url, chat_id=runtime.env("WEBHOOK_CHAT_ID", ""),
                   attempts=runtime.env_int("WEBHOOK_ATTEMPTS", 5, minimum=1),
                   timeout=float(runtime.env_int("WEBHOOK_TIMEOUT_SECONDS", 10, minimum=1)),
                   backoff=float(runtime.env("WEBHOOK_BACKOFF_SECONDS", "1")))


def run() -> None:
    runtime.configure_logging()
    kafka = runtime.KafkaSettings.from_env()
    site = runtime.env("SITE", "datacenter")
    events_source = runtime.Source.from_env("THRESHOLD_EVENTS",
                                            default_pattern=rf".+\.{names.THRESHOLD_EVENTS}")
    sensors_source = runtime.Source.from_env("SENSOR_REGISTRATION",
                                             default_pattern=rf".+\.{names.SENSOR_REGISTRATION}")
    devices_source = runtime.Source.from_env("DEVICE_REGISTRATION",
                                             default_pattern=rf".+\.{names.DEVICE_REGISTRATION}")
    out_topic = runtime.env("NOTIFICATIONS_TOPIC", names.NOTIFICATIONS)
    dead_letter_topic = runtime.env("DEAD_LETTER_TOPIC", names.DEAD_LETTER)
    hook = webhook_from_env()
    ttl_ms = runtime.env_int("ANNOUNCED_TTL_SECONDS", 7 * 24 * 3600, minimum=1) * 1000
    # "-once": the query gained a stateful step; an older "notifications" checkpoint has no state for it.
    checkpoint = runtime.checkpoint(JOB, "notifications-once")

    spark = runtime.session(JOB, notifier.SESSION_CONF)
    events = notifier.announce_once(notifier.parse_events(
        runtime.read_kafka(spark, kafka, events_source), site), ttl_ms)
    sink = BatchSink(kafka, sensors_source.options(), devices_source.options(), site,
                              out_topic, dead_letter_topic, hook)
    writer = (events.writeStream.queryName("notifications")
              .foreachBatch(sink)
              .option("checkpointLocation", checkpoint)
              .trigger(**(runtime.trigger_options() or {"processingTime": "0 seconds"})))
    runtime.run_until_stopped(spark, [writer])


if __name__ == "__main__":
    runtime.main(run)
