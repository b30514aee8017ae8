"""The fault suite (tooling/lab/chaos.py): one fault per case while a real MQTT client publishes; count what was kept.

Runs on its own with `pytest tests/lab -k faults` (or `scripts/lab chaos`); not in
the CI smoke. Every case asserts that nothing acknowledged was lost, except the
Mosquitto crash of the project's own device (which resends on PUBACK 0x10), whose
loss is reported as a figure and bounded by the window docs/architecture.md states;
the same crash with an MQTT 3.1.1 device and with a v5 device that ignores reason
codes may lose only what was in flight at the instant of the kill. The datacenter
cut-off also asserts that the relay lost none of the backlog written during the cut,
and reports (does not assert) the rate it drained at against the rate it was written
at. The abusive-device cases (tooling/lab/abuse.py) assert that the honest devices lost
nothing acknowledged and the site kept ingesting. Each fault case asserts that the alert
naming its cause fired, and the first case, `healthy`, that no alert fired. The tables
of every case are printed at the end.
"""
from __future__ import annotations

import pytest

from tooling.lab import abuse, chaos
from tooling.lab.alerts_seen import matches

OUTCOMES: list[chaos.Outcome] = []
ABUSED: list[abuse.Outcome] = []
MOSQUITTO_WINDOW_S = 10.0     # docs/architecture.md: the loss window is below this, at the case's rate


@pytest.fixture(scope="module", autouse=True)
def fault_table():
    yield
    if OUTCOMES:
        print("\nfault suite:\n" + chaos.table(OUTCOMES))
    if ABUSED:
        print("\nabusive-device cases:\n" + abuse.table(ABUSED))


@pytest.fixture(scope="module")
def receiver(lab_hosts):
    """The lab's webhook, listened to while the cases run (scripts/lab chaos does the same)."""
    with chaos.notifications(lab_hosts) as listening:
        yield listening


@pytest.mark.parametrize("name", [name for name in chaos.CASES if name != "rolling-upgrade"])  # test_6_upgrade
def test_faults(lab_hosts, receiver, name, capsys, record_property):
    case = chaos.CASES[name]
    outcome = chaos.run_case(lab_hosts, case, rate=RATE, receiver=receiver)
    OUTCOMES.append(outcome)
    with capsys.disabled():
        print("\n" + chaos.table([outcome]))
        if case.relay:       # a figure against the target, like recovery_s: the suite asserts what was kept
            print(f"{name}: relay backlog of {outcome.relay_backlog} drained at {outcome.drain_ratio}x the ingest "
                  f"rate (target {chaos.DRAIN_TARGET:g}x)")
    if case.relay:
        record_property("drain_ratio", outcome.drain_ratio)
    assert outcome.acknowledged > 0.9 * case.rate(RATE) * case.seconds * 0.5, "the device could hardly publish"
    if case.in_flight_s is not None:
        assert outcome.lost == outcome.lost_in_flight, \
            (f"{outcome.lost - outcome.lost_in_flight} acknowledged readings of the {case.variant} device lost beyond "
             f"the {outcome.lost_in_flight} in flight at the kill")
    elif case.allowed_loss < 0:
        assert outcome.lost <= MOSQUITTO_WINDOW_S * case.rate(RATE), f"Mosquitto's window lost {outcome.lost} readings"
    else:
        assert outcome.lost == 0, f"{outcome.lost} acknowledged readings never reached site-a's Cassandra"
    assert outcome.events_lost == 0, f"{outcome.events_lost} threshold events never reached the datacenter"
    assert not [n for n in outcome.notes if "threshold events" in n], outcome.notes
    assert outcome.announced_twice == 0, f"{outcome.announced_twice} notifications repeated at the datacenter"
    assert not any(outcome.restarted.values()), f"a consumer exited on data: {outcome.restarted}"
    if case.alert:
        assert any(matches(k, case.alert) for k in outcome.alerted), \
            f"{case.alert} did not fire within {chaos.ALERT_WAIT_S:g}s (alerted: {outcome.alerted or 'none'})"
    else:
        assert not outcome.alerted, f"alerts fired without a fault: {outcome.alerted}"
    if case.watch:
        consumed = {"temperature-data", "temperature-threshold-events", "device-registration",
                    "sensor-registration", "sensor-type-registration", "device-commands"}
        missing = {t for t in consumed if outcome.dead_lettered.get(t, 0) < 4}
        assert not missing, f"poison records not dead-lettered from {sorted(missing)}: {outcome.dead_lettered}"
    if case.relay:
        assert outcome.relay_backlog > 0, f"no relay load was written during the cut: {outcome.notes}"
        assert outcome.relay_lost == 0, \
            f"{outcome.relay_lost} of {outcome.relay_backlog} relayed rollups never reached the datacenter"


@pytest.mark.parametrize("name", list(abuse.CASES))
def test_abusive_device(lab_hosts, name, capsys):
    outcome = abuse.CASES[name](lab_hosts)
    ABUSED.append(outcome)
    with capsys.disabled():
        print("\n" + abuse.table([outcome]))
    assert not abuse.violations(outcome), abuse.violations(outcome)


RATE = 200.0
