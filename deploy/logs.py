"""iot-logs: search one service's logs at one site, from the controller (docs/operations.md, "Logs").

`scripts/iot-logs -i INVENTORY --site S --service NAME [--since 10m] [--grep RE] [--tail N] [--json]`
runs ansible/logs.yml, which runs `docker service logs --timestamps --since ...` on the site's manager
and writes what it printed (with the known sites and the site's services) to a JSON file here; this
module checks the names, keeps the lines whose message matches, sorts them by time and prints them,
each with its task and node. Exit 0: lines printed; 1: none matched; 2: a usage, name or run error.
Also the preflight filter log_retention_refusals, for the inventory's retention settings.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What Docker's --since takes: a Go duration (10m, 1h30m), a Unix time or an RFC 3339 date or time.
SINCE = re.compile(r"^((\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+|\d+(\.\d+)?"
                   r"|\d{4}-\d{2}-\d{2}([T ][0-9:.]+)?(Z|[+-]\d{2}:?\d{2})?)$")
# A `docker service logs --timestamps` line: time, <service>.<slot>.<task>@<node>, padding, "| ", message.
LINE = re.compile(r"^(?P<time>\d{4}-\d{2}-\d{2}T\S+) (?P<task>\S+)@(?P<node>\S+?)\s+\| ?(?P<message>.*)$")
TIMED_OUT = 124                                # timeout(1)'s exit status: logs.yml's limit ran out
SIZE = re.compile(r"^[1-9]\d*[kmg]?$")       # json-file's max-size: bytes, or k, m, g


@dataclass(frozen=True)
class LogLine:
    time: str       # RFC 3339 with nanoseconds, UTC: sorts as text
    task: str       # <service>.<slot>.<task id>: a restarted replica is a new task of the same slot
    node: str
    message: str


def stack_service(site: str, service: str) -> str:
    """The Swarm service of a stack service: the stack is named after the site alias (the stack role)."""
    return f"{site}_{service}"


def site_services(names: list[str], site: str) -> list[str]:
    """`docker service ls` names of a site's stack -> the stack's service names, sorted."""
    prefix = stack_service(site, "")
    return sorted(name[len(prefix):] for name in names if name.startswith(prefix))


def parse_line(line: str) -> LogLine | None:
    match = LINE.match(line)
    return LogLine(**match.groupdict()) if match else None


def select(text: str, pattern: str | None, ignore_case: bool = True, tail: int | None = None) -> list[LogLine]:
    """The lines of `docker service logs --timestamps` output whose message matches `pattern` (a regular
    expression, searched; None: every line), oldest first (Docker interleaves tasks), the last `tail` only."""
    regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0) if pattern else None
    lines = [parsed for raw in text.splitlines() for parsed in [parse_line(raw)]
             if parsed and (regex is None or regex.search(parsed.message))]
    lines.sort(key=lambda line: line.time)
    return lines[-tail:] if tail else lines


def format_line(line: LogLine) -> str:
    return f"{line.time} {line.task}@{line.node} {line.message}"


def problems(result: dict, site: str, service: str) -> list[str]:
    """What keeps logs.yml's result from answering: an unknown site or service (naming the known ones),
    or `docker service logs` failing."""
    sites = sorted(result.get("sites") or [])
    if site not in sites:
        return [f"unknown site {site!r} in this inventory (sites: {', '.join(sites) or 'none'})"]
    if "services" not in result:
        return [f"the logs of {site} were not read: its manager did not answer (see the playbook's output)"]
    services = site_services(result["services"], site)
    if service not in services:
        known = ", ".join(services) or "none; is the stack deployed?"
        return [f"unknown service {service!r} at {site} (services: {known})"]
    rc = int(result.get("rc") or 0)
    if rc == TIMED_OUT:
        return [f"docker service logs {stack_service(site, service)} did not finish within "
                f"{result.get('timeout_s', '?')} s on {site}'s manager (a busy manager, or a node that does not "
                "answer: `docker node ls` there); try again, or give it longer with --timeout"]
    if rc != 0:
        return [f"docker service logs {stack_service(site, service)} failed (exit {rc}): "
                + (result.get("stderr") or "").strip()[-2000:]]
    return []


def since(value: str) -> str:
    if not SINCE.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is no duration (10m, 2h), Unix time or date "
                                         "(2026-11-27T06:00:00Z)")
    return value


def positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of 1 or more")
    return int(value)


def regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as err:
        raise argparse.ArgumentTypeError(f"{value!r} is no regular expression: {err}") from err
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="iot-logs", description=(
        "Search one service's logs at one site: every task of the service, the stopped ones Swarm keeps "
        "(swarm_task_history_limit) included, as `docker service logs` on the site's manager shows them."),
        epilog="Arguments after -- go to ansible-playbook (e.g. -- --vault-password-file FILE). "
               "Exit status: 0 lines printed, 1 none matched, 2 usage or name error.")
    p.add_argument("-i", "--inventory", required=True, help="the deployment's inventory (as for site.yml)")
    p.add_argument("--site", required=True, help="site alias, e.g. site-a or datacenter")
    p.add_argument("--service", required=True, help="stack service, e.g. bridge, kafka-1, cassandra-adapter")
    p.add_argument("--since", type=since, default="1h",
                   help="how far back: a duration (10m, 2h) or a date (2026-11-27T06:00:00Z); default 1h")
    p.add_argument("--grep", type=regex, help="print only lines whose message matches this regular expression")
    p.add_argument("--case-sensitive", action="store_true", help="match --grep's case (default: ignore case)")
    p.add_argument("--tail", type=positive, help="print only the last N matching lines")
    p.add_argument("--json", action="store_true", help="print the lines as one JSON list")
    p.add_argument("--timeout", type=positive, default=120,
                   help="seconds `docker service logs` may take on the manager; default 120")
    return p


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options, and what follows `--` (for ansible-playbook)."""
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    return parser().parse_args(own), extra


def playbook_command(args: argparse.Namespace, out: Path, extra: list[str]) -> list[str]:
    variables = {"logs_site": args.site, "logs_service": args.service, "logs_since": args.since,
                 "logs_result_file": str(out), "logs_timeout_s": args.timeout}
    return ["ansible-playbook", "-i", args.inventory, str(REPO / "ansible" / "logs.yml"),
            "-e", json.dumps(variables), *extra]


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logs.json"
        run = subprocess.run(playbook_command(args, out, extra), env=env, capture_output=True, text=True)
        result = json.loads(out.read_text()) if out.exists() else None
    if result is None:
        print(f"iot-logs: ansible/logs.yml failed (exit {run.returncode}):\n{(run.stdout + run.stderr)[-5000:]}",
              file=sys.stderr)
        return 2
    found = problems(result, args.site, args.service)
    if found:
        print("\n".join(f"iot-logs: {p}" for p in found), file=sys.stderr)
        return 2
    # Docker writes a container's stderr lines on its own stderr: both are log lines.
    lines = select(result.get("stdout", "") + "\n" + result.get("stderr", ""), args.grep,
                   ignore_case=not args.case_sensitive, tail=args.tail)
    if args.json:
        print(json.dumps([asdict(line) for line in lines], indent=1))
    elif lines:
        print("\n".join(format_line(line) for line in lines))
    return 0 if lines else 1


def log_retention_refusals(settings: dict) -> list[str]:
    """Inventory variable -> value of the log retention settings (*_max_size, *_max_file, *_limit) -> one
    message per value Docker would refuse or that keeps nothing."""
    refusals = []
    for name, value in sorted(settings.items()):
        text = str(value).strip()
        if name.endswith("_max_size") and not SIZE.match(text):
            refusals.append(f"{name} is {value!r}: a log file's size is a whole number with k, m or g (50m)")
        elif not name.endswith("_max_size") and not (text.isdigit() and int(text) >= 1):
            refusals.append(f"{name} is {value!r}: it must be a whole number of 1 or more")
    return refusals


FILTERS = {"log_retention_refusals": log_retention_refusals}

if __name__ == "__main__":
    sys.exit(main())
