"""Settings of every program in one shape: a table of Options, read from flags, the environment and secrets.

An Option names an attribute, its environment variable, its flag (by default `--` and the name with dashes),
a parse function, a default and a help text. A dataclass declares each once as a field, `x: int = setting(
"X", 1, "help", int)`; options_of(cls) is its table. The services, the tools and the Spark jobs use:

  build_parser(options, prog=...)    argparse parser; each flag's help shows its variable and default, secrets below
  parse_args(parser, options, argv)  flags, then the environment, then defaults; resolve(options, args) without exits
  from_env(options)                  environment only (programs without flags); markdown_table(options) for docs

Precedence is flag > environment > default; an empty variable counts as unset. A value that does not parse
raises SettingsError naming the variable or flag and what it should be (parse_args turns a bad flag into
argparse's usage error, exit status 2). Secrets (`secret=True`) never travel in the environment or on a command
line: Option("cassandra_password", secret=True) reads the file named by CASSANDRA_PASSWORD_FILE, else
/run/secrets/cassandra_password (tests/unit/common/test_settings.py). Standard library only: the Spark jobs use it."""
from __future__ import annotations

import argparse
import dataclasses
import os
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECRETS_DIR = Path("/run/secrets")


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names the variable (or flag) and the fix."""


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("not a boolean")


def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """A parse function for whole numbers within [minimum, maximum]."""
    def parse(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            raise ValueError("not a whole number") from None
        if minimum is not None and number < minimum:
            raise ValueError(f"must be >= {minimum}")
        if maximum is not None and number > maximum:
            raise ValueError(f"must be <= {maximum}")
        return number
    return parse


def readable_file(variable: str, path: str) -> None:
    """SettingsError unless `path` is empty or a file this process can read (a CA certificate, say)."""
    if path and not os.access(path, os.R_OK):
        raise SettingsError(f"{variable}={path!r} cannot be read: mount the file there, or leave {variable} empty")


def readable_pair(variables: tuple[str, str], paths: tuple[str, str]) -> None:
    """SettingsError unless both files are set and readable, or neither is (a keystore and its CA, say)."""
    if bool(paths[0]) != bool(paths[1]):
        raise SettingsError(f"{variables[0]} and {variables[1]} go together: set both, or leave both empty")
    for variable, path in zip(variables, paths, strict=True):
        readable_file(variable, path)


def group_instance_id(text: str) -> str:
    """A parse function for a Kafka consumer's group.instance.id (static group membership; "" for none).

    Kafka's rule for the name (the Java client's JoinGroupRequest.validateGroupInstanceId; librdkafka
    checks nothing): 1 to 249 of A-Z a-z 0-9 . _ -, not '.' or '..'. A '{{' means a Swarm template such
    as {{.Task.Slot}} reached the program unexpanded (only a Swarm service expands it)."""
    text = text.strip()
    if "{{" in text:
        raise ValueError("an unexpanded Swarm template: {{.Task.Slot}} is expanded only in a Swarm service's "
                         "environment; elsewhere give each replica its own fixed id")
    if text in (".", "..") or len(text) > 249 or any(not (c.isascii() and (c.isalnum() or c in "._-"))
                                                     for c in text):
        raise ValueError("a group instance id is at most 249 of A-Z a-z 0-9 . _ - (and not '.' or '..')")
    return text


# A consumer group's session.timeout.ms: from the broker's group.min.session.timeout.ms (Kafka's default,
# which the stacks keep) to librdkafka's max.poll.interval.ms (default 300000; it refuses a longer session).
session_timeout_ms = integer(6000, 300000)


# Built-in parse functions: how a bad value is described.
_KINDS: dict[Any, tuple[str, str, Callable[[str], Any]]] = {
    int: ("int", "a whole number", int),
    float: ("float", "a number", float),
    bool: ("boolean", "true or false", parse_bool),
}


def _shown(default: Any) -> str:
    if default is None:
        return "unset"
    if default == "" and isinstance(default, str):
        return "empty"
    if isinstance(default, bool):
        return "true" if default else "false"
    return str(default)


@dataclass(frozen=True)
class Option:
    """One setting: attribute `name`, environment variable `env`, flag `flag` (default --name-with-dashes).

    `type` parses the text of a flag or variable (int, float, bool, str or any
    function raising ValueError); `default` is used as it is. A `secret` has no
    flag and no variable of its own: it is read from the file named by
    <NAME>_FILE (its `env`), else from SECRETS_DIR/<name>.
    """
    name: str
    env: str = ""
    default: Any = None
    help: str = ""
    type: Callable[[str], Any] = str
    flag: str = ""
    required: bool = False
    choices: tuple[Any, ...] = ()
    secret: bool = False

    def __post_init__(self) -> None:
        if self.secret:
            object.__setattr__(self, "env", self.env or f"{self.name.upper()}_FILE")
            object.__setattr__(self, "flag", "")
        else:
            if not self.env:
                raise ValueError(f"option {self.name} needs an environment variable")
            object.__setattr__(self, "flag", self.flag or "--" + self.name.replace("_", "-"))

    def describe(self, secrets_dir: Path | str | None = None) -> str:
        """The help text with where the value comes from: '<help> (env X, default Y)'."""
        if self.secret:
            where = Path(secrets_dir or SECRETS_DIR) / self.name
            return f"{self.help} (the file named by ${self.env}, else {where})"
        fallback = "required" if self.required else f"default {_shown(self.default)}"
        return f"{self.help} (env {self.env}, {fallback})"

    def parse(self, raw: str, where: str) -> Any:
        """raw (from `where`, a flag or a variable) parsed by `type`; SettingsError naming `where` if it fails."""
        kind = _KINDS.get(self.type)
        try:
            value = (kind[2] if kind else self.type)(raw)
        except SettingsError:
            raise
        except (ValueError, TypeError) as err:
            if kind:
                hint = f"expected {kind[1]}"
                if where == self.env and not self.required:
                    hint += f"; unset it for the default {_shown(self.default)}"
                raise SettingsError(f"{where}={raw!r} is not a valid {kind[0]} ({hint})") from None
            raise SettingsError(f"{where}={raw!r}: {err}") from None
        if self.choices and value not in self.choices:
            raise SettingsError(f"{where}={raw!r} is not one of {', '.join(map(str, self.choices))}")
        return value


# ------------------------------------------------------------------ declared on a dataclass

_METADATA_KEY = "services.common.settings.Option"
SAME = object()   # setting(field_default=SAME): the field's default is the option's


def setting(env: str = "", default: Any = None, help: str = "", type: Callable[[str], Any] = str, *,
            flag: str = "", required: bool = False, choices: tuple[Any, ...] = (), secret: bool = False,
            name: str = "", field_default: Any = SAME) -> Any:
    """A dataclass field that is also an Option (see Option; its name is the field's unless `name` is given).

    The field's default is the option's `default`, unless `field_default` says otherwise: a value the program
    computes from the option's (say None -> the host name), or dataclasses.MISSING for a field without one."""
    spec = {"env": env, "default": default, "help": help, "type": type, "flag": flag, "required": required,
            "choices": choices, "secret": secret}
    Option(name or "option", **spec)         # a malformed declaration fails where it is written
    fallback = default if field_default is SAME else field_default
    return dataclasses.field(default=fallback, metadata={_METADATA_KEY: (name, spec)})


def options_of(cls: type) -> tuple[Option, ...]:
    """The Options declared with setting() on the dataclass `cls`, in field order (other fields are skipped)."""
    found = []
    for f in dataclasses.fields(cls):
        if _METADATA_KEY in f.metadata:
            name, spec = f.metadata[_METADATA_KEY]
            found.append(Option(name or f.name, **spec))
    return tuple(found)


def markdown_table(options: Iterable[Option], secrets_dir: Path | str | None = None) -> str:
    """The options as a Markdown table: variable | default | meaning (a secret: its _FILE variable and file)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for o in options:
        if o.secret:
            fallback = f"`{Path(secrets_dir or SECRETS_DIR) / o.name}`"
            meaning = f"{o.help} (secret {o.name}: the file named by this variable)"
        else:
            shown = _shown(o.default)
            fallback = "required" if o.required else shown if o.default in (None, "") else f"`{shown}`"
            meaning = o.help
        meaning = meaning.replace("|", r"\|").replace("<", r"\<")
        rows.append(f"| `{o.env}` | {fallback} | {meaning} |")
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------ reading


def secret(name: str, required: bool = False, environ: Mapping[str, str] | None = None,
           secrets_dir: Path | str | None = None) -> str | None:
    """The secret `name`: the file named by <NAME>_FILE, else <secrets_dir>/<name> (default /run/secrets)."""
    environ = os.environ if environ is None else environ
    var = f"{name.upper()}_FILE"
    path = environ.get(var, "").strip() or str(Path(secrets_dir or SECRETS_DIR) / name)
    try:
        return Path(path).read_text().strip()
    except FileNotFoundError:
        if required:
            raise SettingsError(f"secret {name} not found at {path} (mount it or set {var})") from None
        return None
    except OSError as err:
        raise SettingsError(f"secret {name}: cannot read {path} ({err.strerror}); fix the file or {var}") from None


def value(option: Option, args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None,
          secrets_dir: Path | str | None = None) -> Any:
    """One option: its flag in `args` if given, else its environment variable if set, else its default."""
    environ = os.environ if environ is None else environ
    if option.secret:
        return secret(option.name, option.required, environ, secrets_dir)
    raw = getattr(args, option.name, None) if args is not None else None
    if raw is not None:
        return option.parse(raw, option.flag) if isinstance(raw, str) else raw
    text = environ.get(option.env, "").strip()
    if text:
        return option.parse(text, option.env)
    if option.required:
        raise SettingsError(f"{option.env} is required ({option.help})" if option.help
                            else f"{option.env} is required")
    return option.default


def resolve(options: Iterable[Option], args: argparse.Namespace | None = None,
            environ: Mapping[str, str] | None = None, secrets_dir: Path | str | None = None) -> dict[str, Any]:
    """Every option's value by name: flag > environment > default; raises SettingsError on a bad value."""
    return {o.name: value(o, args, environ, secrets_dir) for o in options}


def from_env(options: Iterable[Option], environ: Mapping[str, str] | None = None,
             secrets_dir: Path | str | None = None) -> dict[str, Any]:
    """For programs without flags: every option from the environment (or a secret), else its default."""
    return resolve(options, None, environ, secrets_dir)


def env(name: str, default: Any = None, cast: Callable[[str], Any] = str, help: str = "") -> Any:
    """One variable read on its own; without a default it is required."""
    return value(Option(name.lower(), name, default, help, cast, required=default is None))


# ------------------------------------------------------------------ command line


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, options: Iterable[Option]) -> None:
    """One flag per option (secrets get none). The flag's value stays text until resolve() parses it."""
    for o in options:
        if o.secret:
            continue
        text = o.describe().replace("%", "%%")
        if o.type is bool:
            parser.add_argument(o.flag, dest=o.name, action="store_const", const="true", default=None, help=text)
            continue
        metavar = ("{" + ",".join(map(str, o.choices)) + "}" if o.choices
                   else o.flag.lstrip("-").replace("-", "_").upper())
        parser.add_argument(o.flag, dest=o.name, default=None, metavar=metavar, help=text)


def epilog(options: Iterable[Option], text: str = "", width: int = 79) -> str:
    """Closing help text: how flags and variables combine, and where each secret is read from."""
    options = list(options)
    parts = [text] if text else []
    if any(not o.secret for o in options):
        parts.append("Every option also reads the environment variable shown; the flag wins.")
    secrets = [o for o in options if o.secret]
    if secrets:
        lines = ["Secrets are read from files only, never from the environment or a flag:"]
        for o in secrets:
            lines += textwrap.wrap(f"{o.name}: {o.describe()}", width, initial_indent="  ",
                                   subsequent_indent="    ")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def build_parser(options: Iterable[Option], *, epilog_text: str = "", **kwargs: Any) -> argparse.ArgumentParser:
    """An ArgumentParser (kwargs as ArgumentParser's) with a flag per option and a closing note on secrets."""
    options = list(options)
    kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
    parser = argparse.ArgumentParser(epilog=epilog(options, epilog_text) or None, **kwargs)
    add_options(parser, options)
    return parser


def apply(parser: argparse.ArgumentParser, options: Iterable[Option], args: argparse.Namespace,
          environ: Mapping[str, str] | None = None, secrets_dir: Path | str | None = None) -> argparse.Namespace:
    """Replace the options' raw flag values in `args` by their resolved values.

    A bad flag value or a missing required option is a usage error (usage on
    stderr, exit 2, as argparse does); a bad environment variable or secret
    raises SettingsError.
    """
    environ = os.environ if environ is None else environ
    options = list(options)
    for o in options:
        raw = getattr(args, o.name, None)
        try:
            if isinstance(raw, str):
                o.parse(raw, o.flag)
            elif raw is None and o.required and not o.secret and not environ.get(o.env, "").strip():
                parser.error(f"the following arguments are required: {o.flag} (or set {o.env})")
        except SettingsError as err:
            parser.error(str(err))
    for name, resolved in resolve(options, args, environ, secrets_dir).items():
        setattr(args, name, resolved)
    return args


def parse_args(parser: argparse.ArgumentParser, options: Iterable[Option], argv: list[str] | None = None,
               environ: Mapping[str, str] | None = None,
               secrets_dir: Path | str | None = None) -> argparse.Namespace:
    """parser.parse_args(argv), then every option resolved into the namespace (see apply)."""
    return apply(parser, options, parser.parse_args(argv), environ, secrets_dir)
