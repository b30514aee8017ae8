"""Kafka's ACLs of a site's principals (iot-kafka-access --acls) and the SCRAM logins of Kafka's Java clients."""
from __future__ import annotations

from services.common import kafka_auth


def scram_jaas_config(user: str, password: str) -> str:
    """sasl.jaas.config of a Java client (MirrorMaker) logging in with SCRAM, as the value of a .properties line."""
    return kafka_auth.properties_value(kafka_auth.jaas_config(user, password))


def kafka_client_properties(login: dict, ca_file: str = "") -> str:
    """The --command-config of Kafka's tools for `login` ({user, password}) on the site's overlay (topics, health,
    status): inside TLS to SERVICES with `ca_file`, the brokers CA as the tool's container sees it."""
    return kafka_auth.client_properties(str(login["user"]), str(login["password"]), str(ca_file or ""))


def relay_acls(user: str, topics: list, groups: list) -> list[dict]:
    """The relay principal's ACLs on an edge site (iot-kafka-access --acls): MirrorMaker may list,
    read and copy the configuration of the relayed topics, and read the committed offsets of the
    groups it checkpoints; nothing else, so it can neither write nor see another topic."""
    principal = f"User:{user}"
    acls = [{"principal": principal, "resource": "topic", "name": topic, "pattern": "literal", "operation": op}
            for topic in topics for op in ("READ", "DESCRIBE", "DESCRIBE_CONFIGS")]
    acls += [{"principal": principal, "resource": "group", "name": group, "pattern": "literal",
              "operation": "DESCRIBE"} for group in groups]
    return acls


def service_acls(services: list, relayed_from: list | None = None) -> list[dict]:
    """The ACLs of a site's own Kafka clients on SERVICES (iot-kafka-access --acls), one principal per
    service. Each entry of `services` (templates/kafka-services.yml.j2) names its `user` and what it
    does: `reads` and `writes` (topics), `groups` (consumer groups it commits in), `group_prefixes`
    (the Spark jobs' generated groups) and `group_lookups` (group ids of readers that never join or commit,
    whose coordinator librdkafka still looks up: DESCRIBE only); MirrorMaker's also `owns` (topics, groups and
    transactional ids it creates and runs under, by prefix) and `cluster` (operations on the cluster). At the
    datacenter (`relayed_from`: the edge sites' aliases) every topic in `reads` is a relayed one,
    read as "<site>.<topic>" for each site. READ, WRITE and ALL imply DESCRIBE (Kafka's rule)."""
    acls = []

    def allow(user: str, resource: str, name: str, pattern: str, operation: str) -> None:
        acl = {"principal": f"User:{user}", "resource": resource, "name": name, "pattern": pattern,
               "operation": operation}
        if acl not in acls:
            acls.append(acl)

    for service in services:
        user = service["user"]
        reads = service.get("reads", [])
        if relayed_from is not None:
            reads = [f"{site}.{topic}" for topic in reads for site in relayed_from]
        for topic in reads:
            allow(user, "topic", topic, "literal", "READ")
        for topic in service.get("writes", []):
            allow(user, "topic", topic, "literal", "WRITE")
        for group in service.get("groups", []):
            allow(user, "group", group, "literal", "READ")
        for prefix in service.get("group_prefixes", []):
            allow(user, "group", prefix, "prefixed", "READ")
        for prefix in service.get("group_lookups", []):
            allow(user, "group", prefix, "prefixed", "DESCRIBE")
        for owned in service.get("owns", []):
            allow(user, owned["resource"], owned["name"], owned.get("pattern", "prefixed"), "ALL")
        for operation in service.get("cluster", []):
            allow(user, "cluster", "kafka-cluster", "literal", operation)
    return acls


# What ansible/filter_plugins/deploy_filters.py registers, by function name.
FILTERS = {f.__name__: f for f in (scram_jaas_config, kafka_client_properties, relay_acls, service_acls)}
