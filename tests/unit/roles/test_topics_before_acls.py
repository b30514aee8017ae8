"""A fresh site's Kafka topics, Kafka's own included, exist with the site's replication before any service may
reach Kafka: a consumer's first coordinator lookup would make a broker create __consumer_offsets with the brokers'
own replication (1), which then had to be moved (ansible/roles/stack/tasks/kafka_access.yml). Services can do
nothing before their ACLs exist, so the stack role creates the topics right before it makes the ACLs, and the
topics role, which runs after it, only spreads their replicas."""
from __future__ import annotations

from pathlib import Path

import yaml

from tests.unit.roles.role_tasks import flat

ROLES = Path(__file__).resolve().parents[3] / "ansible/roles"


def _tasks(path: str) -> list[dict]:
    return flat(yaml.safe_load((ROLES / path).read_text()))


def test_the_stack_role_creates_the_topics_with_internal_ones_before_it_makes_any_acl():
    names = [task["name"] for task in _tasks("stack/tasks/kafka_access.yml")]
    create = names.index("Create the site's Kafka topics before any service may use Kafka")
    assert create < names.index("Ensure the Kafka principals and their ACLs")
    included = _tasks("stack/tasks/kafka_access.yml")[create]["ansible.builtin.include_role"]
    assert included == {"name": "topics", "tasks_from": "create"}
    command = yaml.safe_load((ROLES / "topics/tasks/create.yml").read_text())[0]["ansible.builtin.command"]["argv"]
    assert "'--internal'" in command and "'--replication'" in command      # __consumer_offsets with the site's


def test_the_topics_role_does_not_create_them_a_second_time_in_the_run():
    main = _tasks("topics/tasks/main.yml")
    assert [task.get("ansible.builtin.import_tasks") for task in main] == ["replicas.yml"]


def test_a_service_cannot_reach_kafka_before_the_acls_because_none_is_a_super_user():
    # The brokers' own super users are the brokers, the admin tools and the operator (images/kafka/bin/entrypoint):
    # every service logs in as its own principal, which has no ACL before the stack role's task.
    entrypoint = (ROLES.parents[1] / "images/kafka/bin/entrypoint").read_text()
    assert 'super_users+=("User:$internal_user")' in entrypoint
    assert 'super_users+=("User:$KAFKA_ADMIN_USER")' in entrypoint
    assert "allow.everyone" not in entrypoint and "KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND=false" in entrypoint
