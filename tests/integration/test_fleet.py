"""One view of the fleet (issue 28) with the real prometheus image: two edge sites' Prometheus (HTTPS and
their logins from prometheus-web.yml.j2, the rules of monitoring/rules/ over fleet_exporter.py) and a
datacenter Prometheus with the federate job prometheus.yml.j2 renders for them. Site B's Prometheus is
then stopped: the fleet page, rendered by headless Chromium, shows site A's figures and trends and site
B as cut off, not as 0. The screenshot is left in the test's tmp dir (its path is printed)."""
from __future__ import annotations

import datetime as dt
import ipaddress
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from tests.integration.test_metrics import prometheus_query
from tooling.testbed import stack_render
from tooling.testbed.docker_lab import free_port, wait_until

SITES = {"site-a": 20, "site-b": 5}          # alias -> readings/s of its fake components
FLEET_PASSWORD = "fleet-password-0123456789"
SALT_KEY = "k" * 43
BROWSER = "chromium-headless-shell"           # Debian's package; scripts/test installs it
REPO = stack_render.REPO


def _write(path: Path, content: str | bytes) -> None:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    path.chmod(0o644)                         # the containers' app user reads them


def _pki(directory: Path) -> None:
    """One CA (ca.pem) and, per site, the certificate of its Prometheus naming its address, as the pki role
    makes them: <name>.crt (certificate, then the CA) and <name>.key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now, pem = dt.datetime.now(dt.UTC), serialization.Encoding.PEM
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "iot-stack fleet test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    _write(directory / "ca.pem", ca.public_bytes(pem))
    for site in SITES:
        name = f"prometheus-{site}"
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(name), x509.DNSName("prometheus"),
                                                            x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                               critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        _write(directory / f"{name}.crt", cert.public_bytes(pem) + ca.public_bytes(pem))
        _write(directory / f"{name}.key",
               key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _inventory() -> tuple[dict, dict]:
    """A datacenter and two one-node edge sites whose apps node is the site Prometheus' container name."""
    node = {"swarm_role": "manager", "zookeeper_id": 1, "kafka_id": 1, "cassandra_id": 1, "apps_node": True}
    hostvars = {"dc-1": {**node, "ansible_host": "127.0.0.1", "group_names": ["datacenter"]}}
    groups = {"datacenter": ["dc-1"], "edge": [], "all": ["dc-1"]}
    for site in SITES:
        host, group = f"{site}-1", site.replace("-", "_")
        hostvars[host] = {**node, "mqtt_node": True, "ansible_host": f"prometheus-{site}",
                          "group_names": ["edge", group]}
        groups[group] = [host]
        groups["edge"].append(host)
        groups["all"].append(host)
    return hostvars, groups


def _site_config(site: str) -> dict:
    """A site's Prometheus, as far as the fleet rules need: its fake components, labelled as the stack role
    labels them (the real scrape configuration is tests/unit/roles/test_monitoring_stack.py's)."""
    target = {"targets": [f"exporter-{site}:9102"], "labels": {"site": site}}
    return {"global": {"scrape_interval": "5s", "evaluation_interval": "5s", "external_labels": {"site": site}},
            "rule_files": ["/etc/prometheus/rules/*.yml"],
            "scrape_configs": [{"job_name": "bridge", "static_configs": [target]},
                               {"job_name": "node", "metrics_path": "/node", "static_configs": [target]}]}


FLAGS = ["--storage.tsdb.path=/var/lib/prometheus/data", "--web.listen-address=0.0.0.0:9090",
         "--web.console.templates=/etc/prometheus/consoles",
         "--web.console.libraries=/etc/prometheus/console_libraries"]
# This checkout's rules and pages over the image's, so the image need not be rebuilt for the test.
CHECKOUT = {str(REPO / "monitoring/rules"): "/etc/prometheus/rules:ro",
            str(REPO / "monitoring/consoles"): "/etc/prometheus/consoles:ro"}


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    """{'port': the datacenter Prometheus' host port, 'dir': the module's tmp dir}; both sites federated."""
    hostvars, groups = _inventory()
    work = tmp_path_factory.mktemp("fleet")
    work.chmod(0o755)
    _pki(work)
    shutil.copy(Path(__file__).with_name("fleet_exporter.py"), work / "fleet_exporter.py")
    (work / "fleet_exporter.py").chmod(0o644)
    for site, rate in SITES.items():
        lab.run("services", f"exporter-{site}", "python3", "/fleet/fleet_exporter.py", memory="128m",
                env={"RATE": str(rate)}, volumes={str(work): "/fleet:ro"})
        web = stack_render.render_role_template(
            "prometheus-web.yml.j2", hostvars, groups, site.replace("-", "_"), "edge", iot_site_alias=site,
            __stack_prometheus_password="operator-password-0123456789",
            __stack_prometheus_fleet_password=FLEET_PASSWORD, pki_password_salt_key=SALT_KEY)
        secrets = work / f"secrets-{site}"
        secrets.mkdir(mode=0o755)
        _write(secrets / "prometheus_web.yml", web)
        shutil.copy(work / f"prometheus-{site}.crt", secrets / "prometheus_tls_cert")
        shutil.copy(work / f"prometheus-{site}.key", secrets / "prometheus_tls_key")
        _write(work / f"{site}.yml", yaml.safe_dump(_site_config(site)))
        lab.run("prometheus", f"prometheus-{site}", "--config.file=/fleet/" + site + ".yml",
                "--web.config.file=/run/secrets/prometheus_web.yml", *FLAGS, memory="256m",
                volumes={str(work): "/fleet:ro", str(secrets): "/run/secrets:ro", **CHECKOUT})
    # The datacenter: the scrape configuration the stack role renders, less the jobs of components
    # this test does not run; plain HTTP here (the sites' side is what federation secures).
    config = yaml.safe_load(stack_render.render_role_template(
        "prometheus.yml.j2", hostvars, groups, "datacenter", "datacenter", iot_site_alias="datacenter",
        stack_prometheus_scrape_interval="5s"))
    config["scrape_configs"] = [job for job in config["scrape_configs"] if job["job_name"] == "federate"]
    _write(work / "datacenter.yml", yaml.safe_dump(config))
    dc_secrets = work / "secrets-datacenter"
    dc_secrets.mkdir(mode=0o755)
    shutil.copy(work / "ca.pem", dc_secrets / "ca.pem")
    _write(dc_secrets / "prometheus_fleet_password", FLEET_PASSWORD + "\n")
    port = free_port()
    lab.run("prometheus", "datacenter", "--config.file=/fleet/datacenter.yml", *FLAGS, memory="256m",
            ports={port: 9090}, volumes={str(work): "/fleet:ro", str(dc_secrets): "/run/secrets:ro", **CHECKOUT})

    def both_federated() -> bool:
        readings = {r["metric"]["site"]: float(r["value"][1])
                    for r in prometheus_query(port, 'site:readings_per_second:rate1m{job="federate"}')}
        alerts = prometheus_query(port, 'site:alerts_firing:count{job="federate", site="site-a"} > 0')
        return (set(readings) == set(SITES) and all(readings[s] >= 0.75 * rate for s, rate in SITES.items())
                and bool(alerts))

    # rate() over 1m reads low until a minute of samples is in. Site A's DeadLettersDropped (no `for`)
    # fires once its counter has moved: alerts firing then reads 1.
    wait_until("both sites' readings/s federated, site A's alert among them", both_federated, timeout=180,
               interval=3, on_timeout=lambda: f"{prometheus_query(port, 'up')}\n{lab.all_logs(20)}")
    return {"port": port, "dir": work}


def test_the_datacenter_federates_only_the_sites_recorded_series_with_the_fleet_login(fleet):
    port = fleet["port"]
    up = {r["metric"]["site"]: r["value"][1] for r in prometheus_query(port, 'up{job="federate"}')}
    assert up == {"site-a": "1", "site-b": "1"}
    # Only the site:* recorded series, and the scrape's own (up, scrape_*): never the sites' raw series.
    names = {r["metric"]["__name__"] for r in prometheus_query(port, '{job="federate"}')}
    assert {n for n in names if n != "up" and not n.startswith(("site:", "scrape_"))} == set(), names
    assert "site:readings_per_second:rate1m" in names


class _Cells(HTMLParser):
    """The fleet table as {site: {"_state": row's data-state, "site"|"state"|"<figure>": {"text": ...,
    "points": svg's data-points, "lines": polylines drawn}}}."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict] = {}
        self._row: dict | None = None
        self._cell: dict | None = None
        self._svg = False                     # its <title> (min, max) is not the cell's text

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and (a.get("id") or "").startswith("site-") and "class" in a:
            self._row = self.rows.setdefault(a["id"].removeprefix("site-"), {"_state": a.get("data-state")})
        elif tag == "td" and self._row is not None:
            self._cell = {"text": "", "points": None, "lines": 0}
            self._row[a.get("data-figure") or (a.get("class") or "site").split()[0]] = self._cell
        elif tag == "svg" and self._cell is not None:
            self._cell["points"] = a.get("data-points")
            self._svg = True
        elif tag == "polyline" and self._cell is not None:
            self._cell["lines"] += 1

    def handle_endtag(self, tag):
        if tag == "svg":
            self._svg = False
        elif tag == "td":
            self._cell = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._cell is not None and not self._svg:
            self._cell["text"] += data.strip()


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(BROWSER):
        subprocess.run(["bash", "-c", f'source scripts/_apt.sh && apt_install "the fleet page test" {BROWSER}'],
                       cwd=REPO, check=False, timeout=600)
    assert shutil.which(BROWSER), f"{BROWSER} is missing and could not be installed: apt-get install {BROWSER}"
    return BROWSER


def _browse(home: Path, url: str, *how: str) -> str:
    # Virtual time runs the page's script and waits for its query_range requests before the DOM or shot.
    result = subprocess.run([BROWSER, "--no-sandbox", "--disable-gpu", "--window-size=1500,520",
                             "--virtual-time-budget=20000", *how, url],
                            env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_the_fleet_page_shows_site_a_and_site_b_cut_off_not_zero(fleet, lab, browser):
    port = fleet["port"]
    lab.stop("prometheus-site-b")
    wait_until("site B's federation failing", lambda: prometheus_query(
        port, 'up{job="federate", site="site-b"} == 0') != [], timeout=60, interval=2)
    url = f"http://127.0.0.1:{port}/consoles/fleet.html?hours=0.1"
    dom = _browse(fleet["dir"], url, "--dump-dom")
    assert 'data-trends="drawn"' in dom, dom[-3000:]
    assert re.search(r"2 sites, <span class=\"cut-off\">1 cut off</span>", dom), dom[:3000]
    parser = _Cells()
    parser.feed(dom)
    rows = parser.rows
    assert set(rows) == set(SITES), rows

    a = rows["site-a"]
    assert a["_state"] == "live" and a["state"]["text"] == "live"
    assert 15 <= float(a["readings"]["text"]) <= 25, (a["readings"], prometheus_query(port, "{job='federate'}"))
    assert float(a["adapter-behind"]["text"]) > 0                          # the adapter takes 90 %
    assert a["spark-behind"]["text"] == "no data"                           # no Spark job here
    assert a["relay-lag"]["text"] == "no data"                              # no MirrorMaker here
    assert int(a["dead-letters"]["text"]) >= 1
    assert a["disk-free"]["text"] == "40%"
    assert a["alerts"]["text"] == "1"                                       # DeadLettersDropped
    assert a["last-reading"]["text"].endswith("ago"), a["last-reading"]
    for figure in ("readings", "adapter-behind", "dead-letters", "disk-free", "alerts"):
        assert int(a[figure]["points"]) >= 3 and a[figure]["lines"] >= 1, (figure, a[figure])

    b = rows["site-b"]
    assert b["_state"] == "cut-off"
    assert re.fullmatch(r"cut off since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d.*", b["state"]["text"]), b
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d.*", b["last-reading"]["text"]), b["last-reading"]
    for figure in ("readings", "adapter-behind", "spark-behind", "dead-letters", "disk-free", "alerts"):
        assert b[figure]["text"] == "cut off", (figure, b[figure])
    # Its trend still shows what came before the cut.
    assert int(b["readings"]["points"]) >= 2 and b["readings"]["lines"] >= 1, b["readings"]

    shot = fleet["dir"] / "fleet.png"
    _browse(fleet["dir"], url, f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000, shot
    print(f"fleet page screenshot: {shot}")
