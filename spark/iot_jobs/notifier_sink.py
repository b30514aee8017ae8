"""The notifier's foreachBatch: join with the registries, write to Kafka, call the webhook."""
from __future__ import annotations

import json
import logging
import time

from pyspark.sql import DataFrame

from iot_jobs import notifier
from iot_jobs.webhook import Webhook
from services.common import contracts, names

log = logging.getLogger("iot_stack.notifier")


class BatchSink:
    def __init__(self, kafka_options: dict[str, str], sensors: dict[str, str], devices: dict[str, str],
                 default_site: str, topic: str, dead_letter_topic: str, webhook: Webhook | None) -> None:
        self.kafka_options, self.sensors, self.devices = kafka_options, sensors, devices
        self.default_site, self.topic, self.dead_letter_topic = default_site, topic, dead_letter_topic
        self.webhook = webhook

    def registry(self, events: DataFrame, subscription: dict[str, str], contract) -> DataFrame:
        records = (events.sparkSession.read.format("kafka")
                   .options(**self.kafka_options, **subscription)
                   .option("startingOffsets", "earliest").option("endingOffsets", "latest")
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
            now = str(int(time.time() * 1000)).encode()
            dead = [(record["key"], record["value"], [
                (names.HEADER_DLQ_SOURCE, f"webhook:{self.topic}".encode()),
                (names.HEADER_DLQ_REASON, reason.encode()),
                (names.HEADER_DLQ_TIME_MS, now)]) for record, reason in failed]
            (spark.createDataFrame(dead, "key STRING, value STRING, headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
             .write.format("kafka").options(**self.kafka_options).option("topic", self.dead_letter_topic).save())
            log.warning("batch=%d webhook_failed=%d dead_lettered=true", batch_id, len(failed))
