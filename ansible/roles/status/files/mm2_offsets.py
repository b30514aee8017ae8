"""Status probe at the datacenter: every committed record of MirrorMaker's offsets topics, read to the end, as
`key<TAB>value` lines, oldest first per partition. A console consumer cannot do this: MirrorMaker's heartbeat
connector writes these topics every second, so "stop after N seconds without a record" never stops.

    python mm2_offsets.py BOOTSTRAP TOPIC...   (stdin: {"user": ..., "password": ...}, the login)

It runs in the services image: inside TLS to SERVICES with KAFKA_CA_FILE (kafka_auth.overlay_config).
"""
import json
import sys
import time

from confluent_kafka import Consumer, TopicPartition

from services.common import kafka_auth

bootstrap, topics = sys.argv[1], sys.argv[2:]
login = json.load(sys.stdin)
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "iot-status", "enable.auto.commit": False,
                     "isolation.level": "read_committed", "socket.timeout.ms": 10000,
                     **kafka_auth.overlay_config(login["user"], login["password"])})
metadata = consumer.list_topics(timeout=30).topics
partitions = [TopicPartition(t, p, 0) for t in topics if t in metadata for p in metadata[t].partitions]
# The end offset of each partition now; the last record read may be one short of it: the marker that commits
# MirrorMaker's transaction takes an offset too.
ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions}
last = dict.fromkeys(ends, -1)
consumer.assign(partitions)
deadline = time.monotonic() + 60
while time.monotonic() < deadline and any(end > 0 and last[k] < end - 2 for k, end in ends.items()):
    for msg in consumer.consume(1000, timeout=1.0):
        if msg.error() is None and msg.offset() < ends[(msg.topic(), msg.partition())]:
            key, value = (msg.key() or b"").decode(), (msg.value() or b"").decode()
            print(f"{key}\t{value}")
            last[(msg.topic(), msg.partition())] = msg.offset()
consumer.close()
if any(end > 0 and last[k] < end - 2 for k, end in ends.items()):
    sys.exit("MirrorMaker's offsets topics not read to the end in 60 s")
