"""What Docker Swarm and Cassandra report to the health gates, parsed; the stack's files, hashed; an overlay
attach that timed out, recognised for the tasks that retry it."""
from __future__ import annotations

import hashlib
import hmac
import json

from deploy.topology import CASSANDRA_REPLICAS


def stack_files(spec: dict, home: str, key: str) -> dict:
    """{configs|secrets: {name: content}} -> {configs|secrets: {name: {path, hash}}} for the stack template.
    The hash names the Swarm object, so a changed file becomes a new object and its services roll. A config's
    hash is the SHA-256 of its content; a secret's is keyed (HMAC-SHA-256 with `key`, the deployment's
    salt key): anyone who may list the Swarm's secrets, or read the deployment's output, sees the names, and an
    unkeyed hash of a human-chosen password can be tried against guesses offline."""
    def digest(kind: str, name: str, content) -> str:
        data = str(content).encode()
        if kind == "configs":
            return hashlib.sha256(data).hexdigest()
        return hmac.new(str(key).encode(), b"swarm-secret\0" + name.encode() + b"\0" + data,
                        hashlib.sha256).hexdigest()
    return {kind: {name: {"path": f"{home}/{kind}/{name}", "hash": digest(kind, name, content)}
                   for name, content in spec.get(kind, {}).items()}
            for kind in ("configs", "secrets")}


def unconverged(lines: list[str]) -> list[str]:
    """Services of `docker stack services --format '{{.Name}} {{.Replicas}}'` not running all replicas."""
    pending = []
    for line in lines:
        parts = line.split()
        if len(parts) < 2:
            continue
        running, _, wanted = parts[1].partition("/")
        if running != wanted:
            pending.append(parts[0])
    return pending


def replication_short(lines: list[str], dc: str, nodes: int, keyspaces: list[str]) -> list[str]:
    """Keyspaces of `keyspaces` with fewer than min(nodes, 3) replicas in `dc`, from cqlsh's output of
    `SELECT JSON keyspace_name, replication FROM system_schema.keyspaces` (one JSON row per line).
    A keyspace not in the output does not exist yet and is not short; more replicas are not short
    either (replication is only ever raised; cassandra-auth-setup)."""
    wanted = min(nodes, CASSANDRA_REPLICAS)
    found: dict[str, int] = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        found[row["keyspace_name"]] = int(row["replication"].get(dc, 0))
    return [k for k in keyspaces if k in found and found[k] < wanted]


def updating(lines: list[str]) -> list[str]:
    """Services whose rolling update (or rollback) is not finished, from
    `docker service inspect --format '{{.Spec.Name}} {{.UpdateStatus.State}}'` lines."""
    busy = ("updating", "paused", "rollback_started", "rollback_paused")
    return [parts[0] for parts in (line.split() for line in lines) if len(parts) > 1 and parts[1] in busy]


def rolled_back(lines: list[str]) -> list[str]:
    """Services whose last update Swarm rolled back (its new tasks failed their health within the update's
    monitor window): they run their previous spec, not the stack file's. Same lines as `updating`."""
    return [parts[0] for parts in (line.split() for line in lines)
            if len(parts) > 1 and parts[1] == "rollback_completed"]



def services_converged(lines: list, stack: str = "") -> str:
    """`docker stack services --format '{{.Name}} {{.Replicas}}'` -> `converged/all`, followed by the services
    that do not run all their replicas with their running/desired counts: `11/12 (bridge 0/2)`."""
    services = [line.split() for line in lines or [] if len(str(line).split()) >= 2]
    if not services:
        return "none"
    pending = set(unconverged([" ".join(parts) for parts in services]))
    text = f"{len(services) - len(pending)}/{len(services)}"
    if pending:
        prefix = f"{stack}_" if stack else ""
        text += " (" + ", ".join(f"{name.removeprefix(prefix)} {replicas}"
                                 for name, replicas, *_ in services if name in pending) + ")"
    return text


# What ansible/filter_plugins/deploy_filters.py registers, by function name.
def overlay_attach_timed_out(result: dict) -> bool:
    """Whether a registered `docker run --network <overlay>` failed only because the Swarm manager did not
    attach the container to the overlay in time: docker's exit 125 with the daemon's "Could not attach to
    network ...: context deadline exceeded" or "attaching to network failed ... context deadline exceeded".
    A busy manager (a site's services all starting at once on a small machine) answers that way for minutes,
    and running the same command again then works; the tasks that run a tool on the overlay retry while this
    is true. Any other failure, "not manually attachable" or "network not found" among them, is the tool's or
    the deployment's and is not retried."""
    if not isinstance(result, dict) or result.get("rc") != 125:
        return False
    stderr = str(result.get("stderr", ""))
    timed_out = "context deadline exceeded" in stderr or "DeadlineExceeded" in stderr
    return timed_out and ("Could not attach to network" in stderr or "attaching to network failed" in stderr)


FILTERS = {f.__name__: f for f in (stack_files, unconverged, replication_short, updating, rolled_back,
                                   overlay_attach_timed_out)}
