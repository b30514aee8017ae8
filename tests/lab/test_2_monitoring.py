"""Every site's and the datacenter's own Prometheus, from the lab network as an operator's browser
reaches it: HTTPS with the deployment's CA (the certificate names the apps node's address) and the
operator's login only; every component it scrapes answers (the JMX exporter of each ZooKeeper, Kafka,
Cassandra and MirrorMaker JVM, the bridge's and adapter's /metrics); the alert rules are loaded, with the
end dates of the site's certificates; and the status page /consoles/iot-stack.html shows the site's
figures, with readings flowing at the edge sites (the lab's simulated devices publish throughout), also as
headless Chromium renders it, trusting only the deployment's CA (a screenshot per site is left in the lab
directory, screenshots/). The services' /metrics answer only Prometheus: from a service container on the
overlay, neither clear text nor TLS without the scrapers CA's certificate reads them."""
from __future__ import annotations

import base64
import json
import re
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tooling.lab import chaos, lab

pytestmark = pytest.mark.smoke     # a minute or two on a running lab: part of the lab smoke

USER = "operator"                  # stack_prometheus_user's default
JOBS = {"edge": {"prometheus", "zookeeper", "kafka", "cassandra", "bridge", "adapter", "spark", "mosquitto-agent"},
        "datacenter": {"prometheus", "zookeeper", "kafka", "cassandra", "mirrormaker", "adapter", "spark", "federate"}}
SPARK_JOB = {"edge": "threshold-detector", "datacenter": "notifier"}      # the lab's (tooling/lab/lab.py LAB_JOBS)


def _apps_nodes(hosts: list[lab.LabHost]) -> dict[str, lab.LabHost]:
    return {h.site: h for h in hosts if h.variables.get("apps_node")}


def _password(site: str) -> str:
    return (lab.pki_dir() / site / f"prometheus-{USER}.password").read_text().strip()


def _get(site: str, address: str, path: str, login: bool = True, port: int = 9090) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(lab.pki_dir() / "ca.crt"))   # verifies the name too
    request = urllib.request.Request(f"https://{address}:{port}{path}")
    if login:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{_password(site)}".encode()).decode())
    try:
        with urllib.request.urlopen(request, context=context, timeout=20) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


def _query(site: str, address: str, expr: str) -> list[dict]:
    status, body = _get(site, address, "/api/v1/query?query=" + urllib.parse.quote(expr))
    assert status == 200, f"{site}: query {expr} answered {status}"
    return json.loads(body)["data"]["result"]


@pytest.fixture(scope="module")
def apps(lab_hosts):
    return {site: lab.host_ip(host) for site, host in _apps_nodes(lab_hosts).items()}


def _tier(site: str) -> str:
    return "datacenter" if site == "datacenter" else "edge"


@pytest.mark.parametrize("site", ["site-a", "site-b", "datacenter"])
def test_prometheus_answers_only_its_operator_over_tls(apps, site):
    assert _get(site, apps[site], "/-/ready", login=False)[0] == 401
    with pytest.raises(urllib.error.URLError):      # plain HTTP is refused: the port speaks only TLS
        urllib.request.urlopen(f"http://{apps[site]}:9090/-/ready", timeout=10).read()
    assert _get(site, apps[site], "/-/ready")[0] == 200


@pytest.mark.parametrize("site", ["site-a", "site-b", "datacenter"])
def test_every_component_of_the_site_is_scraped_and_up(apps, site):
    deadline = time.monotonic() + 240     # the first scrapes of a freshly deployed site
    while True:
        up = {(r["metric"]["job"], r["metric"]["instance"]): float(r["value"][1])
              for r in _query(site, apps[site], "up")}
        jobs = {job for job, _ in up}
        down = sorted(target for target, value in up.items() if value != 1)
        if jobs >= JOBS[_tier(site)] and not down:
            break
        want = sorted(JOBS[_tier(site)])
        assert time.monotonic() < deadline, f"{site}: jobs {sorted(jobs)} (want {want}), down {down}"
        time.sleep(10)
    kafka = [t for t in up if t[0] == "kafka"]
    assert len(kafka) == (2 if site == "site-a" else 1), f"{site}: one kafka target per broker, got {kafka}"
    assert {r["metric"]["site"] for r in _query(site, apps[site], 'up{job!="federate"}')} == {site}
    if site == "datacenter":     # the fleet page's federation: one target per edge site, over HTTPS, up
        federated = _query(site, apps[site], 'up{job="federate"} == 1')
        assert {r["metric"]["site"] for r in federated} == {"site-a", "site-b"}, federated
    # The Spark job's streaming queries, renamed by the scrape configuration (one series per query), once the
    # job has run a micro-batch: in a loaded lab's CI run (2026-11-29) that came after its target was up.
    query = f'spark_streaming_latency{{spark_job="{SPARK_JOB[_tier(site)]}"}}'
    while not (queries := _query(site, apps[site], query)) and time.monotonic() < deadline + 120:
        time.sleep(10)
    assert queries and all(r["metric"]["query"] for r in queries), queries


# Run in a service container on the overlay: GET /metrics from host:port in clear, then over TLS without a
# certificate; "no connection" when the port cannot be reached at all (so a refusal is the endpoint's doing).
METRICS_PROBE = """
import socket, ssl, sys
host, port = sys.argv[1], int(sys.argv[2])
def ask(wrap):
    try:
        raw = socket.create_connection((host, port), timeout=10)
    except OSError:
        return "no-connection"
    try:
        with wrap(raw) as conn:
            conn.sendall(b"GET /metrics HTTP/1.0\\r\\n\\r\\n")
            return "answered" if conn.recv(4096) else "closed"
    except OSError:
        return "refused"
context = ssl.create_default_context()
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
print(ask(lambda s: s), ask(lambda s: context.wrap_socket(s)))
"""


def test_a_service_container_on_the_overlay_cannot_read_the_services_metrics(lab_hosts):
    hosts = [h for h in lab_hosts if h.site == "site-a"]
    found = [(h, c) for h in hosts for c in lab.host_exec(h, "docker", "ps", "-q", *chaos.service_filter(
        "site-a", "mosquitto-agent"), check=False).stdout.split()]
    assert found, "no mosquitto-agent container on site-a's nodes"
    host, container = found[0]
    for target, port in (("bridge", 9102), ("cassandra-adapter", 9102)):
        probe = lab.host_exec(host, "docker", "exec", container, "python", "-c", METRICS_PROBE, target, str(port),
                              check=False, timeout=60)
        assert probe.returncode == 0, probe.stderr[-500:]
        clear, tls = probe.stdout.split()
        assert clear == "closed", f"{target}:{port}/metrics in clear from the overlay: {clear}"
        assert tls in ("refused", "closed"), f"{target}:{port}/metrics over TLS without a certificate: {tls}"


@pytest.mark.parametrize("site", ["site-a", "site-b", "datacenter"])
def test_the_alert_rules_are_loaded_and_nothing_critical_fires(apps, site):
    status, body = _get(site, apps[site], "/api/v1/rules")
    assert status == 200
    names = {rule["name"] for group in json.loads(body)["data"]["groups"] for rule in group["rules"]}
    assert {"KafkaBrokerDown", "CassandraNodeDown", "ServiceDown", "RelayLagging"} <= names
    firing = [r["metric"]["alertname"] for r in _query(site, apps[site], 'ALERTS{alertstate="firing"}')]
    assert not [a for a in firing if a.endswith("Down")], f"{site}: firing {firing}"


@pytest.mark.parametrize("site", ["site-a", "site-b", "datacenter"])
def test_the_sites_certificates_have_their_end_dates_in_prometheus(apps, site):
    """The rule file the stack role rendered from the pki role's certificates (deploy/certificates.py) is
    loaded and evaluated: the brokers', ZooKeeper's, the exporters' and the CAs' end dates, years away in a
    fresh lab, and no alert."""
    deadline = time.monotonic() + 90          # a recording rule's first evaluation after Prometheus started
    while not (series := _query(site, apps[site], "iot_certificate_not_after_timestamp_seconds")):
        assert time.monotonic() < deadline, f"{site}: no iot_certificate_not_after_timestamp_seconds series"
        time.sleep(5)
    found = {s["metric"]["certificate"]: (s["metric"]["kind"], float(s["value"][1])) for s in series}
    assert {s["metric"]["site"] for s in series} == {site}
    assert f"kafka-1.{site}" in found and [k for k, _ in found.values()].count("ca") >= 2, found   # CA, clients CA
    # The site CAs' leaves too: ZooKeeper's server, the exporters' and the scraper's (CertificateExpiresSoon).
    assert {"zookeeper-1", "metrics-exporter", "scraper-prometheus"} <= set(found), found
    assert min(end for _, end in found.values()) > time.time() + 300 * 86400, found
    firing = [r["metric"]["alertname"] for r in _query(site, apps[site], 'ALERTS{alertstate="firing"}')]
    assert not [a for a in firing if a.startswith("Certificate")], f"{site}: firing {firing}"


def _positive(figure: str) -> bool:
    """A figure of the page above 0 ("no data" is not)."""
    try:
        return float(figure) > 0
    except ValueError:
        return False


def _figure(page: str, figure_id: str) -> str:
    match = re.search(rf'id="{figure_id}">([^<]*)<', page)
    assert match, f"figure {figure_id} missing from the page"
    return match[1].strip()


@pytest.mark.parametrize("site", ["site-a", "site-b", "datacenter"])
def test_the_status_page_shows_the_sites_figures(apps, site):
    deadline = time.monotonic() + 180     # rates need two scrapes of a counter that moved
    while True:
        status, page = _get(site, apps[site], "/consoles/iot-stack.html")
        assert status == 200, f"{site}: the status page answered {status}"
        figures = {f: _figure(page, f) for f in ("kafka-in", "rows-per-s", "rows-written", "dead-letters",
                                                 "under-replicated", "relay-lag", "bridge-acked", "disk-free",
                                                 "devices-connected")}
        # Edge: readings arrive and are written. Datacenter: MirrorMaker reports its lag per flow (its
        # adapter writes only when a site sends an event or a registration, so it may show no rows).
        # "no data" until a rate has two scrapes in its window: a loaded lab's CI run met it (2026-11-29).
        flowing = (all(_positive(figures[f]) for f in ("kafka-in", "bridge-acked", "rows-written", "devices-connected"))
                   if _tier(site) == "edge" else figures["relay-lag"] != "no data")
        if flowing:
            break
        assert time.monotonic() < deadline, f"{site}: figures {figures}"
        time.sleep(15)
    assert f'<span class="site">{site}</span>' in page
    assert figures["under-replicated"] == "0.0"
    assert re.fullmatch(r"\d+\.\d", figures["dead-letters"]), figures
    # Every node's exporter is scraped: the fullest node's free disk, a percentage.
    assert figures["disk-free"] != "no data" and 0 < float(figures["disk-free"]) <= 100, figures
    if _tier(site) == "datacenter":
        assert figures["bridge-acked"] == "no data"     # no bridge at the datacenter


BROWSER = "chromium-headless-shell"     # Debian's package of the same name; scripts/test installs it


@pytest.fixture(scope="module")
def browser_home():
    """A HOME whose NSS database trusts the lab's CA and nothing else: Chromium then checks Prometheus'
    certificate as an operator's browser that imported the CA would."""
    assert shutil.which(BROWSER) and shutil.which("certutil"), \
        f"{BROWSER} and certutil are missing: apt-get install {BROWSER} libnss3-tools (scripts/test does)"
    with tempfile.TemporaryDirectory() as home:
        nssdb = Path(home) / ".pki" / "nssdb"
        nssdb.mkdir(parents=True)
        subprocess.run(["certutil", "-N", "-d", f"sql:{nssdb}", "--empty-password"], check=True)
        subprocess.run(["certutil", "-A", "-d", f"sql:{nssdb}", "-t", "C,,", "-n", "iot-stack-lab-ca",
                        "-i", str(lab.pki_dir() / "ca.crt")], check=True)
        yield home


def _browse(home: str, url: str, *how: str) -> str:
    # The login rides in the URL (Chromium has no flag for it); the lab's password, on the controller.
    result = subprocess.run([BROWSER, "--no-sandbox", "--disable-gpu", "--window-size=1100,1300", *how, url],
                            env={"HOME": home, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.parametrize("site", ["site-a", "site-b", "datacenter"])
def test_the_status_page_renders_in_a_browser_that_trusts_only_the_deployments_ca(apps, browser_home, site):
    page = f"https://{apps[site]}:9090/consoles/iot-stack.html"
    rendered = _browse(browser_home, page.replace("https://", f"https://{USER}:{_password(site)}@"), "--dump-dom")
    assert f'<span class="site">{site}</span>' in rendered, rendered[-2000:]
    for figure in ("kafka-in", "rows-written", "dead-letters", "under-replicated", "relay-lag"):
        value = _figure(rendered, figure)
        assert value == "no data" or re.fullmatch(r"\d+\.\d", value), (figure, value)
    if _tier(site) == "edge":
        assert float(_figure(rendered, "rows-written")) > 0
    # Without the login Prometheus answers 401 and the browser shows none of the page.
    assert '<span class="site">' not in _browse(browser_home, page, "--dump-dom")
    shots = lab.lab_dir() / "screenshots"
    shots.mkdir(exist_ok=True)
    shot = shots / f"{site}-status.png"
    shot.unlink(missing_ok=True)
    _browse(browser_home, page.replace("https://", f"https://{USER}:{_password(site)}@"), f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000, shot


def test_the_fleet_page_shows_both_sites_live_with_their_trends(apps, browser_home):
    """The datacenter's fleet page over HTTPS and the operator's login, as a browser that trusts only the
    deployment's CA renders it: both edge sites federated and live, each trend drawn from query_range
    (the page's script reuses the login of the page; tests/integration/test_fleet.py shows a cut-off site)."""
    page = f"https://{USER}:{_password('datacenter')}@{apps['datacenter']}:9090/consoles/fleet.html"
    rendered = _browse(browser_home, page, "--virtual-time-budget=20000", "--dump-dom")
    assert 'data-trends="drawn"' in rendered, rendered[-3000:]
    assert "2 sites, none cut off" in rendered, rendered[:3000]
    for site in ("site-a", "site-b"):
        row = re.search(rf'<tr id="site-{site}".*?</tr>', rendered, re.S)
        assert row and 'class="state live">live' in row[0], (site, row and row[0][:2000])
        points = [int(n) for n in re.findall(r'data-points="(\d+)"', row[0])]
        assert points and max(points) >= 3, (site, points)
