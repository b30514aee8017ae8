"""Create a site's Kafka SCRAM users and make the ACLs of the principals it manages exactly the given ones.

  echo '{"operator": "<password>", "relay": "<password>"}' | iot-kafka-access ensure \\
      --bootstrap kafka-1:9092,kafka-2:9092 \\
      --acls '[{"principal": "User:relay", "resource": "topic", "name": "device-registration",
                "pattern": "literal", "operation": "READ"}]'

The stack role runs it after each deploy, on the site's overlay (SERVICES, inside TLS) as a super user,
passwords on stdin.
The login, the inputs, what it changes and never touches, the output and the exit codes: at the end of --help
(EPILOG). Tests: tests/unit/commands/test_kafka_access.py, tests/integration/test_kafka_security.py.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

from services.commands import topics
from services.common import kafka_auth, settings

PROG = "iot-kafka-access"
# The long help (`--help` ends with it).
EPILOG = """\
The site's brokers take SCRAM-SHA-512 logins on both listeners and run the ACL authorizer
(images/kafka/bin/entrypoint). This tool runs on the site's overlay as a super user,
inside TLS to SERVICES when KAFKA_CA_FILE names the site's brokers CA (else in clear to INTERNAL):
--login names the user (the site's admin principal, which the brokers create as they start) whose
password is the one for it on stdin; that user is only logged in as, not managed. Without --login it
connects without a login (a test cluster whose INTERNAL is plaintext).

- stdin is a JSON object {user: password}. Passwords never go on a command line. A user without a
  SCRAM-SHA-512 credential gets one (8192 iterations, a random salt); an existing one is left alone,
  unless --rotate, which sets every given user's password again.
- --acls is a JSON list of ALLOW entries {principal ("User:<name>"), resource (topic | group |
  cluster | transactional_id), name (cluster: kafka-cluster), pattern (literal | prefixed), operation
  (READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS, ...)}, host "*". The tool owns every ALLOW ACL of each
  principal the list names: it creates the missing ones and deletes the others, so revoking is an
  inventory change too. DENY entries and other principals' ACLs are never touched.

It waits (up to --wait-seconds) until a broker answers, retrying while brokers restart. stdout is
exactly one JSON line, lists sorted, each ACL as "User:relay READ topic:device-registration":
  {"users_created": [...], "users_updated": [...], "acls_created": [...], "acls_deleted": [...]}
With --dry-run nothing changes and the lists say what would. Progress and errors go to stderr.
Exit codes: 0 done; 1 Kafka did not answer in time or refused a change; 2 bad arguments or bad input.
"""
MECHANISM_ITERATIONS = 8192
RESOURCES = ("topic", "group", "cluster", "transactional_id")
PATTERNS = ("literal", "prefixed")
OPERATIONS = ("ALL", "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "CLUSTER_ACTION",
              "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE")
CLUSTER_NAME = "kafka-cluster"     # the one name of the cluster resource
RETRY_DELAY_S = 5.0


class InputError(ValueError):
    """stdin or a flag is wrong; the message names the entry and what it should be."""


class AccessError(RuntimeError):
    """Kafka did not answer in time or refused a change."""


@dataclass(frozen=True, order=True)
class Acl:
    principal: str
    resource: str
    name: str
    pattern: str
    operation: str

    def describe(self) -> str:
        return f"{self.principal} {self.operation} {self.resource}:{self.name}" + \
            (" (prefixed)" if self.pattern == "prefixed" else "")


def parse_users(text: str) -> dict[str, str]:
    try:
        users = json.loads(text or "{}")
    except json.JSONDecodeError as err:
        raise InputError(f"stdin is not JSON ({err}); give an object {{\"<user>\": \"<password>\"}}") from None
    if not isinstance(users, dict):
        raise InputError("stdin must be a JSON object {\"<user>\": \"<password>\"}")
    for user, password in users.items():
        if not user or not isinstance(password, str) or not password:
            raise InputError(f"stdin: user {user!r} needs a non-empty password string")
    return users


def parse_acls(text: str) -> list[Acl]:
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"--acls is not JSON ({err}); give a list of ACL objects") from None
    if not isinstance(entries, list):
        raise InputError("--acls must be a JSON list of {principal, resource, name, pattern, operation}")
    acls = []
    for i, entry in enumerate(entries):
        where = f"--acls[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"principal", "resource", "name", "pattern", "operation"}:
            raise InputError(f"{where} must have exactly principal, resource, name, pattern, operation; got {entry!r}")
        acl = Acl(**{k: str(v) for k, v in entry.items()})
        if not acl.principal.startswith("User:") or acl.principal == "User:":
            raise InputError(f"{where}: principal {acl.principal!r} must be User:<name>")
        if acl.resource not in RESOURCES:
            raise InputError(f"{where}: resource {acl.resource!r} must be one of {', '.join(RESOURCES)}")
        if acl.pattern not in PATTERNS:
            raise InputError(f"{where}: pattern {acl.pattern!r} must be literal or prefixed")
        if acl.operation not in OPERATIONS:
            raise InputError(f"{where}: operation {acl.operation!r} must be one of {', '.join(OPERATIONS)}")
        if not acl.name or (acl.resource == "cluster" and acl.name != CLUSTER_NAME):
            raise InputError(f"{where}: name {acl.name!r} must be set (the cluster's is {CLUSTER_NAME})")
        acls.append(acl)
    return acls


def acl_changes(wanted: list[Acl], existing: list[Acl]) -> tuple[list[Acl], list[Acl]]:
    """(to create, to delete): the ALLOW ACLs of the principals `wanted` names become exactly `wanted`.
    `existing` holds the current ALLOW ACLs of those principals."""
    principals = {a.principal for a in wanted}
    have = {a for a in existing if a.principal in principals}
    return sorted(set(wanted) - have), sorted(have - set(wanted))


def result_line(users_created, users_updated, acls_created, acls_deleted) -> str:
    return json.dumps({"users_created": sorted(users_created), "users_updated": sorted(users_updated),
                       "acls_created": sorted(a.describe() for a in acls_created),
                       "acls_deleted": sorted(a.describe() for a in acls_deleted)})


# ------------------------------------------------------------------ Kafka


def _binding(acl: Acl, filter_: bool = False):
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )
    kind = AclBindingFilter if filter_ else AclBinding
    return kind(ResourceType.BROKER if acl.resource == "cluster" else ResourceType[acl.resource.upper()], acl.name,
                ResourcePatternType[acl.pattern.upper()], acl.principal, "*", AclOperation[acl.operation],
                AclPermissionType.ALLOW)


def existing_acls(admin, principals: set[str]) -> list[Acl]:
    """Every ALLOW ACL of `principals` for any host ("*"); one for a particular host is left alone
    (and reported on stderr), as the stacks never write one."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )
    found = []
    for principal in sorted(principals):
        query = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, None,
                                 AclOperation.ANY, AclPermissionType.ALLOW)
        for b in admin.describe_acls(query, request_timeout=30).result(timeout=60):
            resource = "cluster" if b.restype == ResourceType.BROKER else b.restype.name.lower()
            acl = Acl(b.principal, resource, b.name, b.resource_pattern_type.name.lower(), b.operation.name)
            if b.host == "*":
                found.append(acl)
            else:
                print(f"{PROG}: left alone: {acl.describe()} for host {b.host}", file=sys.stderr)
    return found


def users_without_credential(admin, users: list[str]) -> list[str]:
    """Those of `users` that have no SCRAM-SHA-512 credential."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import ScramMechanism
    if not users:
        return []
    missing = []
    for user, future in admin.describe_user_scram_credentials(users, request_timeout=30).items():
        try:
            description = future.result(timeout=60)
        except KafkaException as err:
            if err.args[0].code() == KafkaError.RESOURCE_NOT_FOUND:
                missing.append(user)
                continue
            raise
        if not any(info.mechanism == ScramMechanism.SCRAM_SHA_512
                   for info in description.scram_credential_infos):
            missing.append(user)
    return missing


def set_passwords(admin, users: dict[str, str]) -> None:
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, MECHANISM_ITERATIONS)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(user, info, password.encode()) for user, password in sorted(users.items())],
        request_timeout=30)
    for future in futures.values():
        future.result(timeout=60)


def apply_acls(admin, create: list[Acl], delete: list[Acl]) -> None:
    if create:
        for future in admin.create_acls([_binding(a) for a in create], request_timeout=30).values():
            future.result(timeout=60)
    if delete:
        for future in admin.delete_acls([_binding(a, filter_=True) for a in delete], request_timeout=30).values():
            future.result(timeout=60)


def split_login(users: dict[str, str], login_user: str) -> tuple[dict[str, str], dict[str, str]]:
    """(the users to manage, the librdkafka settings of the tool's own login): --login's user and
    password come out of the stdin users."""
    if not login_user:
        return users, {}
    if login_user not in users:
        raise InputError(f"--login {login_user}: stdin has no password for {login_user!r}; add it to the JSON object")
    managed = {u: p for u, p in users.items() if u != login_user}
    return managed, kafka_auth.overlay_config(login_user, users[login_user])


def ensure(args: argparse.Namespace, users: dict[str, str], wanted: list[Acl], login: dict[str, str]) -> int:
    from confluent_kafka import KafkaException

    quiet = topics._LastMessage()
    admin = topics.admin_client(args.bootstrap, quiet, login)
    deadline = time.monotonic() + args.wait_seconds
    while True:
        try:
            topics.wait_for_brokers(admin, args.bootstrap, 1, max(1.0, deadline - time.monotonic()), quiet)
            missing = users_without_credential(admin, list(users))
            to_set = dict(users) if args.rotate else {u: users[u] for u in missing}
            create, delete = acl_changes(wanted, existing_acls(admin, {a.principal for a in wanted}))
            if not args.dry_run:
                if to_set:
                    set_passwords(admin, to_set)
                apply_acls(admin, create, delete)
            break
        except topics.TopicsError as err:
            raise AccessError(str(err)) from None
        except KafkaException as err:
            # Brokers restart one by one after a deploy: retry until the deadline.
            error = err.args[0] if err.args else err
            if time.monotonic() + RETRY_DELAY_S >= deadline:
                raise AccessError(f"Kafka at {args.bootstrap} refused: {error}") from None
            print(f"{PROG}: {error}; retrying in {RETRY_DELAY_S:.0f}s", file=sys.stderr, flush=True)
            time.sleep(RETRY_DELAY_S)
    created = [u for u in to_set if u in missing]
    updated = [u for u in to_set if u not in missing]
    for acl in create:
        print(f"{PROG}: {'would create' if args.dry_run else 'created'} {acl.describe()}", file=sys.stderr)
    for acl in delete:
        print(f"{PROG}: {'would delete' if args.dry_run else 'deleted'} {acl.describe()}", file=sys.stderr)
    print(result_line(created, updated, create, delete))
    return 0


# ------------------------------------------------------------------ CLI

OPTIONS: tuple[settings.Option, ...] = (
    settings.Option("bootstrap", "KAFKA_ACCESS_BOOTSTRAP", None,
                    "the site's overlay bootstrap servers, e.g. kafka-1:9095,kafka-2:9095 (SERVICES)", required=True),
    settings.Option("acls", "KAFKA_ACCESS_ACLS", "[]",
                    'JSON list of {"principal": "User:<name>", "resource", "name", "pattern", "operation"}'),
    settings.Option("wait_seconds", "KAFKA_ACCESS_WAIT_SECONDS", 600.0,
                    "how long to wait for the brokers to answer", float),
    settings.Option("login", "KAFKA_ACCESS_LOGIN", "",
                    "log in as this user, with its password from stdin (empty: no login)"),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("ensure", help="create missing SCRAM users (stdin) and make the listed principals' ACLs exact",
                       epilog=settings.epilog(OPTIONS), formatter_class=argparse.RawDescriptionHelpFormatter)
    settings.add_options(e, OPTIONS)
    e.add_argument("--rotate", action="store_true", help="set every given user's password again")
    e.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    args = p.parse_args(argv)
    try:
        return settings.apply(e, OPTIONS, args)
    except settings.SettingsError as err:   # a bad variable: a usage error too (exit 2)
        e.error(str(err))


def main(argv: list[str] | None = None, stdin=None) -> int:
    args = parse_args(argv)
    try:
        users, login = split_login(parse_users((stdin or sys.stdin).read()), args.login)
        wanted = parse_acls(args.acls)
        return ensure(args, users, wanted, login)
    except InputError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    except AccessError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
