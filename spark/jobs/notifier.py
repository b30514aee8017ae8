"""notifier (datacenter): <site>.temperature-threshold-events -> notifications (+ webhook).

Environment: runtime.COMMON_OPTIONS and OPTIONS below (spark/README.md's tables are made from them).
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

from services.common import names, settings  # noqa: E402
from services.common.settings import Option, integer  # noqa: E402

JOB = "notifier"

SITE = Option("site", "SITE", "datacenter", "site of events on topics without a '<site>.' prefix")
THRESHOLD_EVENTS = runtime.topic_options("THRESHOLD_EVENTS", "the sites' threshold events",
                                         pattern=rf".+\.{names.THRESHOLD_EVENTS}")
SENSOR_REGISTRATION = runtime.topic_options("SENSOR_REGISTRATION", "the sites' sensor registrations",
                                            pattern=rf".+\.{names.SENSOR_REGISTRATION}")
DEVICE_REGISTRATION = runtime.topic_options("DEVICE_REGISTRATION", "the sites' device registrations",
                                            pattern=rf".+\.{names.DEVICE_REGISTRATION}")
NOTIFICATIONS_TOPIC = Option("notifications_topic", "NOTIFICATIONS_TOPIC", names.NOTIFICATIONS,
                             "topic the notifications are written to")
DEAD_LETTER_TOPIC = Option("dead_letter_topic", "DEAD_LETTER_TOPIC", names.DEAD_LETTER,
                           "topic of the notifications the webhook finally failed to take ('none': drop them)")
WEBHOOK_URL = Option("webhook_url", "WEBHOOK_URL", "", "webhook the notifications are posted to (empty: none)")
WEBHOOK_URL_FILE = Option("webhook_url_file", "WEBHOOK_URL_FILE", "",
                          "file holding the webhook URL, instead of WEBHOOK_URL (a secret: the Telegram URL "
                          "contains the bot token)")
WEBHOOK_CHAT_ID = Option("webhook_chat_id", "WEBHOOK_CHAT_ID", "", "chat_id sent with each message (Telegram's chat)")
WEBHOOK_ATTEMPTS = Option("webhook_attempts", "WEBHOOK_ATTEMPTS", 5, "attempts per notification", integer(1))
WEBHOOK_TIMEOUT_SECONDS = Option("webhook_timeout_seconds", "WEBHOOK_TIMEOUT_SECONDS", 10,
                                 "seconds one webhook request may take", integer(1))
WEBHOOK_BACKOFF_SECONDS = Option("webhook_backoff_seconds", "WEBHOOK_BACKOFF_SECONDS", 1.0,
                                 "seconds before the first retry of a webhook request", float)
ANNOUNCED_TTL_SECONDS = Option("announced_ttl_seconds", "ANNOUNCED_TTL_SECONDS", 7 * 24 * 3600,
                               "seconds an announced event is remembered (so it is announced once)", integer(1))
OPTIONS: tuple[Option, ...] = (
    SITE, *THRESHOLD_EVENTS, *SENSOR_REGISTRATION, *DEVICE_REGISTRATION, NOTIFICATIONS_TOPIC, DEAD_LETTER_TOPIC,
    WEBHOOK_URL, WEBHOOK_URL_FILE, WEBHOOK_CHAT_ID, WEBHOOK_ATTEMPTS, WEBHOOK_TIMEOUT_SECONDS,
    WEBHOOK_BACKOFF_SECONDS, ANNOUNCED_TTL_SECONDS)


def webhook_from_env() -> Webhook | None:
    url = settings.value(WEBHOOK_URL)
    path = settings.value(WEBHOOK_URL_FILE)
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
    return Webhook(url=url, chat_id=settings.value(WEBHOOK_CHAT_ID),
                   attempts=settings.value(WEBHOOK_ATTEMPTS),
                   timeout=float(settings.value(WEBHOOK_TIMEOUT_SECONDS)),
                   backoff=float(settings.value(WEBHOOK_BACKOFF_SECONDS)))


def run() -> None:
    runtime.configure_logging()
    kafka = runtime.KafkaSettings.from_env()
    site = settings.value(SITE)
    events_source = runtime.Source.from_env(THRESHOLD_EVENTS)
    sensors_source = runtime.Source.from_env(SENSOR_REGISTRATION)
    devices_source = runtime.Source.from_env(DEVICE_REGISTRATION)
    out_topic = settings.value(NOTIFICATIONS_TOPIC)
    dead_letter_topic = settings.value(DEAD_LETTER_TOPIC)
    hook = webhook_from_env()
    ttl_ms = settings.value(ANNOUNCED_TTL_SECONDS) * 1000
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
