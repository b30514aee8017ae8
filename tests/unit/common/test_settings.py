"""services.common.settings: one table of Options read from flags, the environment and secret files."""
from __future__ import annotations

import json
from dataclasses import MISSING, dataclass

import pytest

from services.adapter import settings as adapter_settings
from services.bridge import settings as bridge_settings
from services.commands import registrar, simulator, topics
from services.common import settings
from services.common.settings import Option, SettingsError

OPTIONS = (
    Option("host", "DEMO_HOST", "localhost", "broker host"),
    Option("port", "DEMO_PORT", 1883, "broker port", int),
    Option("ratio", "DEMO_RATIO", 0.5, "a fraction", float),
    Option("verbose", "DEMO_VERBOSE", False, "say more", bool),
    Option("site", "DEMO_SITE", None, "site alias", required=True),
    Option("qos", "DEMO_QOS", 1, "MQTT QoS", int, choices=(0, 1)),
    Option("demo_password", secret=True, help="password of the demo user"),
)


def parse(argv: list[str], environ: dict[str, str], secrets_dir=None):
    parser = settings.build_parser(OPTIONS, prog="demo")
    return settings.parse_args(parser, OPTIONS, argv, environ, secrets_dir)


def test_flag_wins_over_environment_which_wins_over_default(tmp_path):
    environ = {"DEMO_SITE": "site-a", "DEMO_PORT": "1884", "DEMO_HOST": "env-host"}
    args = parse(["--host", "flag-host"], environ, tmp_path)
    assert (args.host, args.port, args.ratio, args.site) == ("flag-host", 1884, 0.5, "site-a")
    assert parse(["--port", "1999"], environ, tmp_path).port == 1999
    assert parse([], {"DEMO_SITE": "s"}, tmp_path).port == 1883


def test_empty_variable_counts_as_unset_and_values_are_cast_by_type(tmp_path):
    args = parse(["--verbose"], {"DEMO_SITE": "s", "DEMO_HOST": "", "DEMO_RATIO": " 0.25 "}, tmp_path)
    assert (args.host, args.ratio, args.verbose) == ("localhost", 0.25, True)
    assert parse([], {"DEMO_SITE": "s", "DEMO_VERBOSE": "false"}, tmp_path).verbose is False
    assert parse([], {"DEMO_SITE": "s", "DEMO_VERBOSE": "yes"}, tmp_path).verbose is True


def test_bad_int_in_the_environment_names_the_variable_and_the_fix(tmp_path):
    with pytest.raises(SettingsError, match=r"DEMO_PORT='lots' is not a valid int \(expected a whole number; "
                                            r"unset it for the default 1883\)"):
        parse([], {"DEMO_SITE": "s", "DEMO_PORT": "lots"}, tmp_path)
    with pytest.raises(SettingsError, match="DEMO_QOS='2' is not one of 0, 1"):
        parse([], {"DEMO_SITE": "s", "DEMO_QOS": "2"}, tmp_path)
    with pytest.raises(SettingsError, match="DEMO_VERBOSE='maybe' is not a valid boolean"):
        parse([], {"DEMO_SITE": "s", "DEMO_VERBOSE": "maybe"}, tmp_path)


def test_bad_flag_value_names_the_flag(capsys):
    parser = settings.build_parser(OPTIONS, prog="demo")
    args = parser.parse_args(["--port", "lots"])
    with pytest.raises(SettingsError, match="--port='lots' is not a valid int"):
        settings.resolve(OPTIONS, args, {"DEMO_SITE": "s"})
    with pytest.raises(SystemExit) as exit_info:     # through parse_args: argparse's usage error
        settings.parse_args(parser, OPTIONS, ["--port", "lots"], {"DEMO_SITE": "s"})
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: demo" in err and "--port='lots' is not a valid int" in err


def test_unknown_flag_and_missing_required_option_print_usage_and_exit_2(capsys, tmp_path):
    for argv in (["--no-such-flag"], []):
        with pytest.raises(SystemExit) as exit_info:
            parse(argv, {}, tmp_path)
        assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: demo" in err and "required: --site (or set DEMO_SITE)" in err


def test_environment_only_resolution_names_a_missing_variable():
    assert settings.from_env(OPTIONS[:2], {"DEMO_PORT": "1"}) == {"host": "localhost", "port": 1}
    with pytest.raises(SettingsError, match=r"DEMO_SITE is required \(site alias\)"):
        settings.from_env(OPTIONS, {})
    with pytest.raises(SettingsError, match="DEMO_N='0': must be >= 1"):
        settings.from_env([Option("n", "DEMO_N", 5, "count", settings.integer(1))], {"DEMO_N": "0"})


@pytest.mark.parametrize("text", ["site-a-cassandra-adapter-1", "a", "A.b_c-9", "x" * 249, " padded-1 ", ""])
def test_group_instance_id_takes_kafkas_names_and_empty_for_none(text):
    assert settings.group_instance_id(text) == text.strip()


@pytest.mark.parametrize(("text", "why"), [
    ("site-a-cassandra-adapter-{{.Task.Slot}}", "unexpanded Swarm template"),
    ("a b", "at most 249 of"), ("a/b", "at most 249 of"), ("ü", "at most 249 of"), ("x" * 250, "at most 249 of"),
    (".", "not '.' or '..'"), ("..", "not '.' or '..'"),
])
def test_group_instance_id_refuses_what_kafka_refuses_naming_the_variable(text, why):
    option = Option("group_instance_id", "DEMO_INSTANCE", "", "id", settings.group_instance_id)
    with pytest.raises(SettingsError, match=f"DEMO_INSTANCE=.*{why}"):
        settings.from_env([option], {"DEMO_INSTANCE": text})


def test_session_timeout_is_within_the_brokers_minimum_and_librdkafkas_poll_interval():
    option = Option("session_timeout_ms", "DEMO_SESSION_MS", 45000, "timeout", settings.session_timeout_ms)
    assert settings.from_env([option], {}) == {"session_timeout_ms": 45000}
    assert settings.from_env([option], {"DEMO_SESSION_MS": "6000"}) == {"session_timeout_ms": 6000}
    assert settings.from_env([option], {"DEMO_SESSION_MS": "300000"}) == {"session_timeout_ms": 300000}
    for bad, why in (("5999", "must be >= 6000"), ("300001", "must be <= 300000"), ("45s", "not a whole number")):
        with pytest.raises(SettingsError, match=f"DEMO_SESSION_MS='{bad}': {why}"):
            settings.from_env([option], {"DEMO_SESSION_MS": bad})


def test_secret_is_read_from_the_file_named_by_its_file_variable(tmp_path):
    path = tmp_path / "pw"
    path.write_text("s3cret\n")
    args = parse([], {"DEMO_SITE": "s", "DEMO_PASSWORD_FILE": str(path)}, tmp_path / "empty")
    assert args.demo_password == "s3cret"


def test_secret_is_read_from_the_secrets_directory(tmp_path, monkeypatch):
    (tmp_path / "demo_password").write_text("from-dir\n")
    assert parse([], {"DEMO_SITE": "s"}, secrets_dir=tmp_path).demo_password == "from-dir"
    monkeypatch.setattr(settings, "SECRETS_DIR", tmp_path)
    assert settings.from_env([OPTIONS[-1]], {}) == {"demo_password": "from-dir"}


def test_secret_is_never_read_from_the_environment_or_a_flag(tmp_path, capsys):
    environ = {"DEMO_SITE": "s", "DEMO_PASSWORD": "leaked", "demo_password": "leaked"}
    assert parse([], environ, tmp_path).demo_password is None
    with pytest.raises(SystemExit):
        parse(["--demo-password", "leaked"], environ, tmp_path)
    assert "unrecognized arguments: --demo-password" in capsys.readouterr().err


def test_missing_required_secret_names_the_file_and_the_file_variable(tmp_path):
    required = Option("demo_password", secret=True, required=True, help="password")
    with pytest.raises(SettingsError, match=f"secret demo_password not found at {tmp_path}/demo_password "
                                            r"\(mount it or set DEMO_PASSWORD_FILE\)"):
        settings.from_env([required], {}, tmp_path)
    with pytest.raises(SettingsError, match="not found at /nonexistent/pw .*DEMO_PASSWORD_FILE"):
        settings.secret("demo_password", required=True, environ={"DEMO_PASSWORD_FILE": "/nonexistent/pw"})


def test_help_shows_each_flags_variable_and_default_and_where_secrets_come_from():
    text = " ".join(settings.build_parser(OPTIONS, prog="demo").format_help().split())
    assert "(env DEMO_PORT, default 1883)" in text and "(env DEMO_SITE, required)" in text
    assert "--qos {0,1}" in text
    assert "demo_password: password of the demo user (the file named by $DEMO_PASSWORD_FILE" in text


PROGRAMS = {
    "iot-bridge": (bridge_settings.OPTIONS, lambda: bridge_settings.build_parser().format_help()),
    "iot-cassandra-adapter": (adapter_settings.OPTIONS, lambda: adapter_settings.parser().format_help()),
    "iot-topics ensure": (topics.OPTIONS, None),
    "iot-simulator": (simulator.OPTIONS, None),
    "iot-registrar": (registrar.OPTIONS, None),
    "iot-registrar fleet": (registrar.FLEET_OPTIONS, None),
}


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_option_of_every_program_has_help_text_and_an_environment_variable(program, capsys):
    options, help_text = PROGRAMS[program]
    if help_text is None:
        main = {"iot-topics": topics.main, "iot-simulator": simulator.main, "iot-registrar": registrar.main}
        name, *sub = program.split()
        with pytest.raises(SystemExit) as exit_info:
            main[name]([*sub, "--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
    else:
        text = help_text()
    assert options
    for option in options:
        assert option.help.strip() and option.env, option.name
        assert option.env in text, (program, option.name)
        assert (option.name if option.secret else option.flag) in text, (program, option.name)


def test_tools_read_their_settings_from_the_environment_too(monkeypatch, tmp_path):
    (tmp_path / "creds").write_text(json.dumps({f"site-z-dev-{n}": "pw" for n in range(1, 6)}))
    monkeypatch.setenv("SIMULATOR_SITE", "site-z")
    monkeypatch.setenv("SIMULATOR_RATE", "250")
    monkeypatch.setenv("SIMULATOR_CREDENTIALS_FILE", str(tmp_path / "creds"))
    monkeypatch.setenv("SIMULATOR_PLAINTEXT", "true")
    args = simulator.parse_args(["--count", "1"])
    assert (args.site, args.rate, args.count, args.port, args.ca_file) == ("site-z", 250.0, 1, 1883, None)
    monkeypatch.setenv("TOPICS_BOOTSTRAP", "k:9092")
    args = topics.parse_args(["ensure", "--spec", "[]", "--replication", "2"])
    assert (args.bootstrap, args.spec, args.replication, args.min_insync) == ("k:9092", "[]", 2, 1)
    monkeypatch.setenv("REGISTRAR_BOOTSTRAP_SERVERS", "k:9092")
    monkeypatch.setenv("REGISTRAR_DEVICES", "3")
    args = registrar.parse_args(["fleet", "--site", "s"])
    assert (args.bootstrap_servers, args.devices, args.sensors_per_device) == ("k:9092", 3, 2)


def test_a_bad_variable_of_a_tool_is_a_usage_error_naming_it(monkeypatch, capsys):
    monkeypatch.setenv("SIMULATOR_PORT", "mqtt")
    with pytest.raises(SystemExit) as exit_info:
        simulator.parse_args(["--site", "a"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: iot-simulator" in err and "SIMULATOR_PORT='mqtt' is not a valid int" in err


def test_simulator_logs_each_device_in_from_the_credentials_file_else_the_secret_over_tls(tmp_path, monkeypatch,
                                                                                          capsys):
    fleet = {"a-dev-1": "pw-1", "a-dev-2": "pw-2"}
    (tmp_path / "creds").write_text(json.dumps(fleet))
    (tmp_path / "ca.pem").write_text("a CA")
    args = simulator.parse_args(["--site", "a", "--devices", "2", "--credentials-file", str(tmp_path / "creds"),
                                 "--ca-file", str(tmp_path / "ca.pem")])
    assert (args.credentials, args.port, args.ca_file) == (fleet, 8883, str(tmp_path / "ca.pem"))
    # Unset: the secrets mqtt_credentials and mqtt_ca.pem, as the lab mounts them.
    (tmp_path / "mqtt_credentials").write_text(json.dumps(fleet))
    (tmp_path / "mqtt_ca.pem").write_text("a CA")
    monkeypatch.setattr(settings, "SECRETS_DIR", tmp_path)
    monkeypatch.delenv("SIMULATOR_CREDENTIALS_FILE", raising=False)
    monkeypatch.delenv("SIMULATOR_CA_FILE", raising=False)
    args = simulator.parse_args(["--site", "a", "--devices", "2"])
    assert (args.credentials, args.ca_file) == (fleet, str(tmp_path / "mqtt_ca.pem"))
    for argv, error in [
        (["--devices", "3"], "the credentials file has no password for devices a-dev-3"),
        (["--credentials-file", str(tmp_path / "missing")], "--credentials-file (SIMULATOR_CREDENTIALS_FILE)"),
        (["--credentials-file", str(tmp_path / "ca.pem")], "is not JSON"),
        (["--ca-file", str(tmp_path / "missing")], "--ca-file (SIMULATOR_CA_FILE)"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            simulator.parse_args(["--site", "a", "--devices", "2", *argv])
        assert exit_info.value.code == 2
        assert error in capsys.readouterr().err


@dataclass(frozen=True)
class Declared:
    host: str = settings.setting("DEMO_HOST", "localhost", "broker host")
    password: str | None = settings.setting(secret=True, help="demo password", name="demo_password")
    computed: int = 7                                      # not a setting: no option
    client_id: str = settings.setting("DEMO_CLIENT_ID", None, "client id; unset: computed",
                                      field_default="demo-1")
    port: int = settings.setting("DEMO_PORT", 1883, "broker port", int, flag="--broker-port")


def test_a_setting_is_declared_once_on_its_field_and_options_of_lists_them_in_field_order():
    options = settings.options_of(Declared)
    assert [o.name for o in options] == ["host", "demo_password", "client_id", "port"]
    assert options[0] == Option("host", "DEMO_HOST", "localhost", "broker host")
    assert options[1] == Option("demo_password", secret=True, help="demo password")
    assert (options[1].env, options[1].flag) == ("DEMO_PASSWORD_FILE", "")
    assert (options[2].default, Declared().client_id) == (None, "demo-1")
    assert (options[3].flag, options[3].type, Declared().port) == ("--broker-port", int, 1883)
    assert settings.from_env(options, {"DEMO_PORT": "1"}, "/nonexistent")["port"] == 1


def test_a_malformed_setting_fails_where_it_is_declared_and_a_field_may_have_no_default():
    with pytest.raises(ValueError, match="needs an environment variable"):
        settings.setting("", 1, "no variable")

    @dataclass(frozen=True)
    class Required:
        name: str = settings.setting("DEMO_NAME", "x", "a name", field_default=MISSING)

    with pytest.raises(TypeError):
        Required()
    assert Required("y").name == "y" and settings.options_of(Required)[0].default == "x"


def test_markdown_table_lists_variable_default_and_meaning():
    table = settings.markdown_table(settings.options_of(Declared), "/run/secrets").splitlines()
    assert table[:2] == ["| variable | default | meaning |", "|---|---|---|"]
    assert table[2] == "| `DEMO_HOST` | `localhost` | broker host |"
    assert table[3] == ("| `DEMO_PASSWORD_FILE` | `/run/secrets/demo_password` | demo password "
                        "(secret demo_password: the file named by this variable) |")
    assert table[4] == "| `DEMO_CLIENT_ID` | unset | client id; unset: computed |"
    assert settings.markdown_table([Option("a", "A", None, "x <y> | z", required=True)]).splitlines()[2] == \
        r"| `A` | required | x \<y> \| z |"
