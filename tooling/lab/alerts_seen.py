"""Which alerts the lab's Prometheuses fire while a fault-suite case runs, and when.

The fault suite (tooling/lab/chaos.py) watches the Prometheus of the faulted site and of the datacenter
(HTTPS on each apps node, the operator's login and the lab's CA, as an operator's browser) from the fault
on, and reports each alert that started firing after it with its delay; a case whose fault fired nothing it
expects fails. Alerts already firing before the fault are left out, so a stuck alert of an earlier case is
not credited to this one; except that an alert whose value counts events in a window (COUNTING: starts, a
login's offences) counts again when its value grows, since it stays firing across consecutive cases, and that
an alert that stops firing after the fault and fires again counts from then on.
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
# Alerts whose value counts events (resets, changes, offences). Not an increase(): its extrapolated value
# moves without a new event (RecordsDeadLettered was credited again to the case after the poison).
COUNTING = {"MosquittoRestarted", "MqttLoginMisused", "ServiceRestarted"}


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
    """An alert's name and the labels that tell its instances apart (not the annotations; not the
    instance, a task's address that a replaced task changes)."""
    shown = {k: v for k, v in sorted(labels.items()) if k not in ("alertname", "severity", "instance")}
    return labels["alertname"] + ("{" + ",".join(f"{k}={v}" for k, v in shown.items()) + "}" if shown else "")


def _parse(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition("{")
    return name, dict(part.split("=", 1) for part in rest.rstrip("}").split(",") if part)


def matches(alert_key: str, wanted: str) -> bool:
    """Whether an alert's key is the alert a case expects: `Name` or `Name{label=value,...}`, the labels
    a subset of the key's (ServiceRestarted{job=bridge} is the bridge's, whatever its site)."""
    name, labels = _parse(alert_key)
    want_name, want_labels = _parse(wanted)
    return name == want_name and all(labels.get(k) == v for k, v in want_labels.items())


@dataclass
class AlertWatch:
    """Started at the fault: records every alert the sites' Prometheuses fire afterwards, and how long after."""
    hosts: list[lab.LabHost]
    sites: tuple[str, ...]
    fault_at: float = 0.0
    before: dict[str, float] = field(default_factory=dict)     # alert key -> value, firing before the fault
    seen: dict[str, float] = field(default_factory=dict)      # alert key -> seconds after the fault
    errors: int = 0                                          # polls that got no answer
    last_error: str = ""
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
        return self._poll_all()[0]

    def _poll_all(self) -> tuple[dict[str, dict], bool]:
        """The watched sites' firing alerts, and whether every site answered."""
        found: dict[str, dict] = {}
        complete = True
        for site in self.sites:
            try:
                found.update(firing(self.hosts, site))
            # A Prometheus may be briefly away in a fault of its own node. Any error: one that ended the polling
            # thread (http.client.IncompleteRead is no OSError) would report "nothing fired" for the case.
            except Exception as err:  # noqa: BLE001
                self.errors += 1
                self.last_error = f"{site}: {type(err).__name__}: {err}"
                complete = False
        return found, complete

    def firing_now(self) -> dict[str, dict]:
        """The alerts firing now at the watched sites."""
        return self._poll()

    def note(self, now: dict[str, dict], complete: bool, at: float) -> None:
        """Take one poll's firing alerts (`complete` when every site answered), polled at `at` (epoch seconds)."""
        if complete:
            # Firing before the fault but not any more: its next firing is this case's own. (A counting alert
            # that fired on, through the previous case's end and this case's fault, kept its old value as the
            # bar and its new firing went uncredited.) Only a complete poll says an alert stopped firing.
            for name in [name for name in self.before if name not in now]:
                del self.before[name]
        for name, alert in now.items():
            if name in self.seen:
                continue
            again = name.split("{", 1)[0] in COUNTING and _value(alert) > self.before.get(name, 0.0)
            if name not in self.before or again:
                self.seen[name] = at - self.fault_at

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.note(*self._poll_all(), time.time())

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        return dict(self.seen)

    def first(self, wanted: str) -> float | None:
        """Seconds from the fault to the first alert that `matches` wanted, None when none fired."""
        delays = [d for k, d in self.seen.items() if matches(k, wanted)]
        return min(delays) if delays else None

    def resolved(self, wanted: str, limit_s: float = 900) -> float | None:
        """Wait until no alert that `matches` wanted fires any more; seconds waited, None past the limit."""
        start = time.time()
        while time.time() - start < limit_s:
            if not any(matches(k, wanted) for k in self._poll()):
                return time.time() - start
            time.sleep(POLL_S)
        return None

    def summary(self) -> str:
        """The `alerted` cell of the fault suite's table: each alert and its delay, or none."""
        if not self.seen:
            return "none"
        return ", ".join(f"{name} +{delay:.0f}s" for name, delay in sorted(self.seen.items(), key=lambda i: i[1]))
