"""iot-kafka-access's pure part: what it reads (stdin users, --acls) and which ACLs it changes."""
from __future__ import annotations

import io
import json

import pytest

from services.commands import kafka_access as ka

READ = {"principal": "User:relay", "resource": "topic", "name": "t", "pattern": "literal", "operation": "READ"}


def test_users_come_from_a_json_object_with_non_empty_passwords():
    assert ka.parse_users('{"relay": "pw"}') == {"relay": "pw"}
    assert ka.parse_users("") == {}
    for bad, why in (("[1]", "JSON object"), ('{"relay": ""}', "non-empty password"), ("{", "not JSON")):
        with pytest.raises(ka.InputError, match=why):
            ka.parse_users(bad)


@pytest.mark.parametrize("change, why", [
    ({"operation": "READ_ALL"}, "operation 'READ_ALL' must be one of"),
    ({"resource": "topics"}, "resource 'topics' must be one of"),
    ({"pattern": "match"}, "pattern 'match' must be literal or prefixed"),
    ({"principal": "relay"}, "must be User:<name>"),
    ({"resource": "cluster", "name": "c"}, "the cluster's is kafka-cluster"),
    ({"host": "*"}, "exactly principal, resource, name, pattern, operation"),
])
def test_a_bad_acl_is_named_with_its_index_and_the_fix(change, why):
    with pytest.raises(ka.InputError, match=r"--acls\[1\]") as err:
        ka.parse_acls(json.dumps([READ, {**READ, **change}]))
    assert why in str(err.value)


def test_changes_make_the_named_principals_acls_exact_and_leave_others_alone():
    read, describe = ka.parse_acls(json.dumps([READ, {**READ, "operation": "DESCRIBE"}]))
    write = ka.Acl("User:relay", "topic", "t", "literal", "WRITE")
    others = ka.Acl("User:someone", "topic", "t", "literal", "WRITE")
    create, delete = ka.acl_changes([read, describe], [describe, write, others])
    assert create == [read] and delete == [write]
    assert ka.acl_changes([read, describe], [read, describe]) == ([], [])


def test_result_line_is_one_sorted_json_line():
    line = ka.result_line(["b", "a"], [], [ka.Acl("User:relay", "group", "g", "prefixed", "DESCRIBE")], [])
    assert json.loads(line) == {"users_created": ["a", "b"], "users_updated": [],
                                "acls_created": ["User:relay DESCRIBE group:g (prefixed)"], "acls_deleted": []}


def test_bad_stdin_exits_2_before_any_connection(capsys):
    assert ka.main(["ensure", "--bootstrap", "nowhere:9092"], stdin=io.StringIO("not json")) == 2
    assert "stdin is not JSON" in capsys.readouterr().err


def test_a_bad_flag_prints_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        ka.main(["ensure", "--bootstrap", "b:9092", "--wait-seconds", "soon"], stdin=io.StringIO("{}"))
    assert exit_.value.code == 2 and "usage:" in capsys.readouterr().err
