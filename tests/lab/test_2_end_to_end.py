"""End to end through the lab: devices -> site Cassandra, hot sensor -> datacenter and notification."""
from __future__ import annotations

import json
import queue
import re
import statistics
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime

import pytest
from confluent_kafka import Consumer

from services.common import names
from tooling.build import images, pins
from tooling.lab import lab

pytestmark = pytest.mark.smoke     # scripts/test runs this module in its lab smoke

READINGS_PER_SITE = 300
RUN = uuid.uuid4().hex[:6]
EDGE_SITES = ["site-a", "site-b"]


def publish(site_host: lab.LabHost, site: str, sensor: str, temperatures: list[float], unit: str = "C") -> int:
    """Publish readings at QoS 1 with Debian's mosquitto_pub, as a device outside the site would: the site's
    test device, over TLS, its id as client id, `sensor` registered to it first. Returns the first reading's
    event time (ms)."""
    device = lab.test_device(site)
    # The bridge dead-letters readings of sensors not registered to their device (unregistered_sensor).
    lab.register_sensors(site, device, [sensor], bootstrap=f"{lab.host_ip(site_host)}:9094")
    cmd = ["docker", "run", "-i", "--rm", "--network", lab.NETWORK, "-v", f"{lab.pki_dir() / 'ca.crt'}:/ca.crt:ro",
           images.tag("mosquitto", pins.load()),
           # -d says when the CONNACK came; stdbuf: line by line, as it happens, into the pipe
           "stdbuf", "-oL", "mosquitto_pub", "-h", lab.host_ip(lab.mosquitto_host(lab.existing_hosts(), site)),
           "-p", "8883", "--cafile", "/ca.crt", "-d",
           "-u", device, "-P", lab.device_password(device), "-i", device, "-V", "mqttv5", "-q", "1", "-l",
           "-t", names.MQTT_READINGS.format(site=site, device_id=device, sensor_id=sensor)]
    device_process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
    said: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(said.put, device_process.stdout), said.put(None)], daemon=True).start()
    output: list[str] = []
    try:
        # The readings are stamped once the device has its CONNACK (-d prints it), not before `docker run`
        # starts its container (1-2 s on a busy lab, which the latencies below then counted).
        while not output or "CONNACK" not in output[-1]:
            line = said.get(timeout=120)
            assert line is not None, f"mosquitto_pub ended before it connected:\n{''.join(output)}"
            output.append(line)
        # Event times 1 ms apart (distinct rows) starting now; mosquitto_pub sends the lines faster than that,
        # so latencies read from Cassandra err by < len/1000 s.
        start_ms = int(time.time() * 1000)
        device_process.stdin.write("".join(json.dumps({"timestamp": start_ms + i, "temperature": t, "unit": unit})
                                           + "\n" for i, t in enumerate(temperatures)))
        device_process.stdin.close()
        code = device_process.wait(timeout=300)
        while (line := said.get(timeout=60)) is not None:      # the rest of its output, to EOF
            output.append(line)
    finally:
        if device_process.poll() is None:
            device_process.kill()
    assert code == 0, "".join(output[-40:])
    return start_ms


def wait_for(what: str, probe, timeout: float = 300, interval: float = 5.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what} did not happen within {timeout:.0f}s (last: {last!r})")


def rows(host: lab.LabHost, site: str, query: str) -> list[list[str]]:
    """Rows of a cqlsh result table: the lines between the header rule and the blank line."""
    lines = lab.cql(host, site, query).splitlines()
    start = next((i for i, line in enumerate(lines) if set(line.strip()) <= set("-+") and line.strip()), None)
    if start is None:
        return []
    table = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        table.append([c.strip() for c in line.split("|")])
    return table


def percentiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100) if len(values) > 1 else values * 99
    return f"p50={q[49]:.0f} ms p99={q[98]:.0f} ms (n={len(values)})"


@pytest.mark.parametrize("site", EDGE_SITES)
def test_readings_published_at_qos1_give_exactly_that_many_rows_at_the_site(lab_hosts, site, capsys):
    managers = lab.site_managers(lab_hosts)
    sensor = f"e2e-{RUN}-{site}"
    start_ms = publish(managers[site], site, sensor, [20.0 + (i % 7) * 0.1 for i in range(READINGS_PER_SITE)])
    day = datetime.fromtimestamp(start_ms / 1000, UTC).strftime("%Y-%m-%d")
    where = f"WHERE site='{site}' AND sensor_id='{sensor}' AND day='{day}'"

    def counted():
        out = rows(managers[site], site, f"SELECT count(*) FROM iot.temperature_readings {where};")
        return int(out[0][0]) if out and out[0][0].isdigit() and int(out[0][0]) >= READINGS_PER_SITE else None

    count = wait_for(f"{READINGS_PER_SITE} rows in {site}'s Cassandra", counted)
    assert count == READINGS_PER_SITE
    # write_latency_ms: taken as the adapter binds the row; stored: the row's WRITETIME, the coordinator's
    # clock as it applied the write (docs/architecture.md, "Inside the adapter").
    found = [r for r in rows(managers[site], site,
                             "SELECT write_latency_ms, WRITETIME(temperature) / 1000 - toUnixTimestamp(event_time) "
                             f"FROM iot.temperature_readings {where};")
             if len(r) == 2 and all(re.match(r"^-?\d+(\.\d+)?$", v) for v in r)]
    assert len(found) == READINGS_PER_SITE
    with capsys.disabled():     # the report the lab run exists for: shown, not captured
        print(f"\ndevice -> {site} Cassandra latency, bound: {percentiles([float(r[0]) for r in found])}; "
              f"stored: {percentiles([float(r[1]) for r in found])}")


# `slow`, outside CI's smoke (`scripts/test tests/lab -m smoke` runs it): hot reading -> threshold event in the
# datacenter's Cassandra took 142 s (CI) and 115 s (a lab) on 2026-11-27, then over 600 s in a fresh-clone run
# the same day, cause not found (the Spark jobs' first stateful micro-batch on a loaded host is the suspect: the
# notifier's took 227 s). A failure now shows the detector's, MirrorMaker's, adapter's and notifier's logs.
@pytest.mark.slow
@pytest.mark.timeout(1500)     # up to 600 s for the events at the datacenter, 600 s more for the notification
def test_hot_sensor_events_reach_the_datacenter_and_produce_a_notification(lab_hosts, capsys):
    managers = lab.site_managers(lab_hosts)
    site, sensor = "site-a", f"hot-{RUN}"
    # Above any configured threshold, then back to normal: one opening and one closing event.
    publish(managers[site], site, sensor, [150.0] * 20 + [20.0] * 20)
    dc = managers["datacenter"]

    def events_at_datacenter():
        query = ("SELECT sensor_id, is_first, is_last, write_latency_ms FROM iot.temperature_threshold_events "
                 f"WHERE sensor_id='{sensor}' ALLOW FILTERING;")
        found = rows(dc, "datacenter", query)
        return found if len(found) >= 2 else None

    try:
        events = wait_for("threshold events in the datacenter's Cassandra", events_at_datacenter, timeout=600)
    except AssertionError as err:
        reports = [lab.service_report(managers[site], f"{site}_threshold-detector")] + [
            lab.service_report(dc, f"datacenter_{name}") for name in ("mirrormaker", "cassandra-adapter")]
        raise AssertionError("\n".join([str(err), *reports])) from None
    assert {(e[1], e[2]) for e in events} == {("True", "False"), ("False", "True")}
    with capsys.disabled():
        print(f"\nhot reading -> threshold event in the datacenter's Cassandra (through Spark and MirrorMaker): "
              f"{percentiles([float(e[3]) for e in events if re.match(r'^-?[0-9.]+$', e[3])])}")

    consumer = Consumer(lab.kafka_client(f"{lab.host_ip(dc)}:9094", **{"group.id": f"e2e-{RUN}",
                                                                        "auto.offset.reset": "earliest"}))
    consumer.subscribe([names.NOTIFICATIONS])
    try:
        def notification():
            for msg in consumer.consume(200, timeout=2.0):
                if msg.error() is None and sensor in msg.value().decode(errors="replace"):
                    return msg.value().decode()
            return None
        try:
            # 600 s: in CI of 2026-11-27 no notification came within 300 s of the events reaching the
            # datacenter's Cassandra; in the lab the same day the notifier's first micro-batch with events
            # took 227 s (its Python worker's first start on a loaded host). A failure shows its logs.
            text = wait_for("a notification about the hot sensor", notification, timeout=600, interval=0.1)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{lab.service_report(dc, 'datacenter_notifier')}") from None
    finally:
        consumer.close()
    assert "site-a" in text
