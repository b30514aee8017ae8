"""iot-site-data from the services image against real Kafka and Cassandra, as ansible/remove_site.yml runs
it at the datacenter: a removed site's mirrored topics and rows are reported, then purged, and the
other site's stay."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from services.adapter import schema
from tooling.testbed.cassandra_node import start_cassandra
from tooling.testbed.docker_lab import docker, image
from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster

GONE, KEPT = "site-c", "site-a"
TABLES = {"temperature_readings": "temperature-reading", "devices": "device-registration"}
MIRRORED = ["temperature-threshold-events", "device-registration", "checkpoints.internal"]
SENSORS, DAYS = 4, 3


def day(n: int) -> dt.date:
    return dt.date(1970, 1, 1) + dt.timedelta(days=n)


@pytest.fixture(scope="module")
def datacenter(lab):
    kafka = start_kafka_cluster(lab)
    create_topics(kafka, *[f"{site}.{topic}" for site in (GONE, KEPT) for topic in MIRRORED],
                  f"mm2-offsets.{GONE}.internal", f"mm2-offsets.{KEPT}.internal", "notifications", partitions=1)
    cassandra = start_cassandra(lab, tls=True)       # CQL over TLS, as at a site
    session = cassandra.session()
    session.execute(schema.create_keyspace_cql("iot", {"dc1": 1}))
    for table, contract in TABLES.items():
        session.execute(schema.create_table_cql("iot", table, schema.layout(contract)))
    reading = session.prepare("INSERT INTO iot.temperature_readings (site, sensor_id, day, event_time, temperature) "
                              "VALUES (?, ?, ?, ?, ?)")
    device = session.prepare("INSERT INTO iot.devices (site, device_id) VALUES (?, ?)")
    for site in (GONE, KEPT):
        for sensor in range(SENSORS):
            session.execute(device, (site, f"d{sensor}"))
            for d in range(DAYS):
                for n in range(5):
                    session.execute(reading, (site, f"s{sensor}", day(d), d * schema.MS_PER_DAY + n, 20.0))
    yield kafka, cassandra, session
    session.cluster.shutdown()


def site_data(lab, kafka, cassandra, command: str, site: str = GONE, known: str = KEPT):
    # The Cassandra CA comes on stdin, as the playbook hands it (ansible/roles/stack/tasks/site_data.yml).
    ca = Path(cassandra.ca_file).read_text()
    return docker("run", "--rm", "-i", "--network", lab.network, image("services"), "iot-site-data", command,
                  "--site", site, "--known-sites", known, "--bootstrap", kafka.internal,
                  "--cassandra-hosts", cassandra.internal, "--cassandra-tls", "--keyspace", "iot",
                  "--tables", ",".join(TABLES), check=False, timeout=300, input=json.dumps({"cassandra_ca": ca}))


def rows(session, site: str) -> dict[str, int]:
    readings = sum(session.execute("SELECT count(*) FROM iot.temperature_readings WHERE site=%s AND sensor_id=%s "
                                   "AND day=%s", (site, f"s{s}", day(d))).one()[0]
                   for s in range(SENSORS) for d in range(DAYS))
    devices = session.execute("SELECT count(*) FROM iot.devices WHERE site=%s", (site,)).one()[0]
    return {"readings": readings, "devices": devices}


def test_report_lists_the_sites_topics_and_partitions_and_changes_nothing(lab, datacenter):
    kafka, cassandra, session = datacenter
    result = site_data(lab, kafka, cassandra, "report")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "site": GONE, "purged": False, "partitions": {"temperature_readings": SENSORS * DAYS, "devices": 1},
        "topics": sorted([f"{GONE}.{t}" for t in MIRRORED] + [f"mm2-offsets.{GONE}.internal"])}
    assert rows(session, GONE) == {"readings": SENSORS * DAYS * 5, "devices": SENSORS}


def test_a_site_the_inventory_still_relays_is_refused(lab, datacenter):
    kafka, cassandra, _ = datacenter
    result = site_data(lab, kafka, cassandra, "purge", known=f"{KEPT},{GONE}")
    assert result.returncode == 2 and result.stdout == ""
    assert "still one of the relayed sites" in result.stderr


def test_purge_deletes_only_the_removed_sites_topics_and_rows(lab, datacenter):
    kafka, cassandra, session = datacenter
    result = site_data(lab, kafka, cassandra, "purge")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["purged"] is True
    left = set(AdminClient(kafka.client()).list_topics(timeout=30).topics)
    assert not {t for t in left if GONE in t}, left
    assert {f"{KEPT}.{t}" for t in MIRRORED} | {f"mm2-offsets.{KEPT}.internal", "notifications"} <= left
    assert rows(session, GONE) == {"readings": 0, "devices": 0}
    assert rows(session, KEPT) == {"readings": SENSORS * DAYS * 5, "devices": SENSORS}
    again = json.loads(site_data(lab, kafka, cassandra, "report").stdout)
    assert again["topics"] == [] and again["partitions"] == {"temperature_readings": 0, "devices": 0}
