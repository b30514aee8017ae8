"""`scripts/lab chaos`: the fault suite's command line. It runs the faults of tooling/lab/chaos.py and the
abusive-device cases of tooling/lab/abuse.py (which builds on chaos) and prints their tables."""
from __future__ import annotations

import argparse
import sys
import time

from tooling.lab import abuse, chaos, lab
from tooling.lab.alerts_seen import AlertWatch, matches
from tooling.testbed.alert_receiver import AlertReceiver


def main(argv: list[str] | None = None) -> int:
    abusive = {f"abuse-{name}": run for name, run in abuse.CASES.items()}
    parser = argparse.ArgumentParser(prog="scripts/lab chaos", description=chaos.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", default=[], choices=[*chaos.CASES, *abusive], metavar="NAME",
                        help=f"run only this case (repeatable): {', '.join([*chaos.CASES, *abusive])}; "
                             "default: every case")
    parser.add_argument("--rate", type=float, default=200.0, help="readings/s of the steady sensor (default 200)")
    args = parser.parse_args(argv)
    hosts = lab.existing_hosts()
    if not hosts:
        raise SystemExit("lab chaos: no lab hosts exist; run `scripts/lab up` first")
    started = time.monotonic()
    outcomes, abused = [], []
    receiver = _receiver()
    if receiver:
        _age_out_failed_notifications(hosts)
    try:
        for name in args.case or [*chaos.CASES, *abusive]:
            if name in abusive:
                abused.append(abusive[name](hosts))
                print(abuse.table(abused[-1:]), flush=True)
            else:
                outcomes.append(chaos.run_case(hosts, chaos.CASES[name], args.rate, receiver=receiver))
                print(chaos.table(outcomes[-1:]), flush=True)
    finally:
        if receiver:
            receiver.close()
    print(f"\nfault suite ({time.monotonic() - started:.0f}s):")
    if outcomes:
        print(chaos.table(outcomes))
    if abused:
        print(f"\nabusive-device cases (honest devices' readings):\n{abuse.table(abused)}")
        for outcome in abused:
            for problem in abuse.violations(outcome):
                print(f"abuse-{outcome.case}: {problem}")
    return 0 if all(chaos.kept_all(o) for o in outcomes) and not any(abuse.violations(o) for o in abused) else 1


def _age_out_failed_notifications(hosts: list[lab.LabHost], limit_s: float = 900.0) -> None:
    """Notifications the lab's Alertmanagers sent while nobody listened failed, and AlertNotificationsFailing
    (rightly) says so for 10 min after the last failure: wait that out, so the healthy case starts quiet."""
    watch = AlertWatch(hosts, (chaos.SITE, chaos.DC))
    if not any(matches(k, "AlertNotificationsFailing") for k in watch.firing_now()):
        return
    print("lab chaos: AlertNotificationsFailing fires (nobody listened at the lab's webhook before); "
          f"waiting up to {limit_s:.0f}s for it to resolve", flush=True)
    waited = watch.resolved("AlertNotificationsFailing", limit_s)
    print("lab chaos: " + (f"resolved after {waited:.0f}s" if waited is not None else "still firing"), flush=True)


def _receiver() -> AlertReceiver | None:
    """The webhook the lab's Alertmanagers notify (lab.lab_alert_receivers), so each case's alert is seen
    reaching a person; None (and said) when the port is taken, e.g. by a lab test."""
    host, port = lab.lab_alert_receiver_address()
    try:
        return AlertReceiver(host, port)
    except OSError as err:
        print(f"lab chaos: not listening at {host}:{port} for notifications ({err})", flush=True)
        return None


if __name__ == "__main__":
    sys.exit(main())
