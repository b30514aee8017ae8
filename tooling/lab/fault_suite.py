"""`scripts/lab chaos`: the fault suite's command line. It runs the faults of tooling/lab/chaos.py and the
abusive-device cases of tooling/lab/abuse.py (which builds on chaos) and prints their tables."""
from __future__ import annotations

import argparse
import sys
import time

from tooling.lab import abuse, chaos, lab


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
    with chaos.notifications(hosts) as receiver:
        for name in args.case or [*chaos.CASES, *abusive]:
            if name in abusive:
                abused.append(abusive[name](hosts))
                print(abuse.table(abused[-1:]), flush=True)
            else:
                outcomes.append(chaos.run_case(hosts, chaos.CASES[name], args.rate, receiver=receiver))
                print(chaos.table(outcomes[-1:]), flush=True)
    print(f"\nfault suite ({time.monotonic() - started:.0f}s):")
    if outcomes:
        print(chaos.table(outcomes))
    if abused:
        print(f"\nabusive-device cases (honest devices' readings):\n{abuse.table(abused)}")
        for outcome in abused:
            for problem in abuse.violations(outcome):
                print(f"abuse-{outcome.case}: {problem}")
    return 0 if all(chaos.kept_all(o) for o in outcomes) and not any(abuse.violations(o) for o in abused) else 1


if __name__ == "__main__":
    sys.exit(main())
