"""The notifier's foreachBatch: join with the registries, write to Kafka, call the webhook."""
from __future__ import annotations

import json
import logging
import time

from pyspark.sql import DataFrame

from iot_jobs import notifier
from iot_jobs.runtime import KafkaSettings
from iot_jobs.webhook import Webhook
from services.common import contracts
from services.common.dead_letter import dead_letter_headers

log = logging.getLogger("iot_stack.notifier")
WEBHOOK_FAILED = "webhook_failed"      # dead-letter reason code of a notification the webhook never took


def dead_letter_rows(failed: list, topic: str, now_ms: int) -> list[tuple]:
    """(notification record, why the webhook failed) pairs -> dead-letter rows (key, value, headers):
    the notification's key, value and headers plus the dlq_* headers of services.common.dead_letter
    (source `webhook:<topic>`; no dlq_offset: the record was never read from Kafka)."""
    return [(record["key"], record["value"], dead_letter_headers(
        f"webhook:{topic}", WEBHOOK_FAILED, reason, now_ms,
        [(h["key"], bytes(h["value"])) for h in record["headers"] or ()])) for record, reason in failed]


class BatchSink:
    def __init__(self, kafka: KafkaSettings, sensors: dict[str, str], devices: dict[str, str],
                 default_site: str, topic: str, dead_letter_topic: str, webhook: Webhook | None) -> None:
        self.kafka, self.kafka_options, self.sensors, self.devices = kafka, kafka.options, sensors, devices
        self.default_site, self.topic, self.dead_letter_topic = default_site, topic, dead_letter_topic
        self.webhook = webhook

    def registry(self, events: DataFrame, subscription: dict[str, str], contract) -> DataFrame:
        records = (events.sparkSession.read.format("kafka")
                   .options(**self.kafka.source_options(subscription,
                                                        {"startingOffsets": "earliest", "endingOffsets": "latest"}))
                   .load())
        return notifier.latest_registrations(records, contract, self.default_site)

    def __call__(self, events: DataFrame, batch_id: int) -> None:
        if events.isEmpty():
            return
        rows = notifier.notifications(events, self.registry(events, self.sensors, contracts.SENSOR),
                                      self.registry(events, self.devices, contracts.DEVICE))
        records = notifier.notifications_to_kafka(rows).collect()   # a handful per batch: events are rare
        spark = events.sparkSession
        frame = spark.createDataFrame(records, "key STRING, value STRING, "
                                      "headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
        frame.write.format("kafka").options(**self.kafka_options).option("topic", self.topic).save()
        log.info("batch=%d notifications=%d", batch_id, len(records))
        if self.webhook is None:
            return
        texts = [(record, json.loads(record["value"])["text"]) for record in records]
        failed = self.webhook.send_all(texts)
        if failed and self.dead_letter_topic != "none":
            dead = dead_letter_rows(failed, self.topic, int(time.time() * 1000))
            (spark.createDataFrame(dead, "key STRING, value STRING, headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
             .write.format("kafka").options(**self.kafka_options).option("topic", self.dead_letter_topic).save())
            log.warning("batch=%d webhook_failed=%d dead_lettered=true", batch_id, len(failed))
