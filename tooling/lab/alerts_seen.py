"""Which alerts a lab site's Prometheus fires while a fault-suite case runs, and when.

The fault suite (tooling/lab/chaos.py) watches the site's Prometheus (HTTPS on the apps node, the operator's
login and the lab's CA, as an operator's browser) from the fault on, and reports each alert that started
firing after it with its delay; a case whose fault fired nothing it expects fails. Alerts already firing
before the fault are left out, so a stuck alert of an earlier case is not credited to this one; except that
an alert whose value counts events in a window (COUNTING: Mosquitto's starts, a login's offences) counts
again when its value grows, since it stays firing across consecutive cases.
"""
from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.request
from dataclasses import dataclass, field

from tooling.lab import lab

USER = "operator"               # stack_prometheus_user's default
POLL_S = 5.0
COUNTING = {"MosquittoRestarted", "MqttLoginMisused"}       # alerts whose value is a count of events


def _apps_node(hosts: list[lab.LabHost], site: str) -> lab.LabHost:
    nodes = [h for h in hosts if h.site == site and h.variables.get("apps_node")]
    if not nodes:
        raise SystemExit(f"alerts: no apps node at {site}")
    return nodes[0]


def firing(hosts: list[lab.LabHost], site: str, timeout: float = 10) -> dict[str, dict]:
    """The site's firing alerts: "<alertname>{<label>=<value>,...}" -> the alert (labels, activeAt)."""
    host = _apps_node(hosts, site)
    password = (lab.pki_dir() / site / f"prometheus-{USER}.password").read_text().strip()
    request = urllib.request.Request(f"https://{lab.host_ip(host)}:9090/api/v1/alerts")
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{password}".encode()).decode())
    context = ssl.create_default_context(cafile=str(lab.pki_dir() / "ca.crt"))
    with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
        alerts = json.loads(answer.read())["data"]["alerts"]
    return {key(a["labels"]): a for a in alerts if a.get("state") == "firing"}


def _value(alert: dict) -> float:
    try:
        return float(alert.get("value", 0))
    except (TypeError, ValueError):
        return 0.0


def key(labels: dict) -> str:
    """An alert's name and the labels that tell its instances apart (not the annotations)."""
    shown = {k: v for k, v in sorted(labels.items()) if k not in ("alertname", "severity", "instance", "job")}
    return labels["alertname"] + ("{" + ",".join(f"{k}={v}" for k, v in shown.items()) + "}" if shown else "")


@dataclass
class AlertWatch:
    """Started at the fault: records every alert that fires afterwards, and how long after."""
    hosts: list[lab.LabHost]
    site: str
    fault_at: float = 0.0
    before: dict[str, float] = field(default_factory=dict)     # alert key -> value, firing before the fault
    seen: dict[str, float] = field(default_factory=dict)      # alert key -> seconds after the fault
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> AlertWatch:
        """Call just before the fault."""
        self.before = {name: _value(alert) for name, alert in self._poll().items()}
        self.fault_at = time.time()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> dict[str, dict]:
        try:
            return firing(self.hosts, self.site)
        except OSError:
            self.errors += 1          # Prometheus may be briefly away in a fault of its own node
            return {}

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            for name, alert in self._poll().items():
                if name in self.seen:
                    continue
                again = name.split("{", 1)[0] in COUNTING and _value(alert) > self.before.get(name, 0.0)
                if name not in self.before or again:
                    self.seen[name] = time.time() - self.fault_at

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        return dict(self.seen)

    def first(self, alertname: str) -> float | None:
        """Seconds from the fault to the first alert of that name, None when it never fired."""
        delays = [d for k, d in self.seen.items() if k.split("{", 1)[0] == alertname]
        return min(delays) if delays else None

    def resolved(self, alertname: str, limit_s: float = 900) -> float | None:
        """Wait until no alert of that name fires any more; seconds waited, None past the limit."""
        start = time.time()
        while time.time() - start < limit_s:
            if not any(k.split("{", 1)[0] == alertname for k in self._poll()):
                return time.time() - start
            time.sleep(POLL_S)
        return None

    def summary(self) -> str:
        """The `alerted` cell of the fault suite's table: each alert and its delay, or none."""
        if not self.seen:
            return "none"
        return ", ".join(f"{name} +{delay:.0f}s" for name, delay in sorted(self.seen.items(), key=lambda i: i[1]))
