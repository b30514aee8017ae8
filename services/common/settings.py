"""Reading service settings from the environment and from Swarm secrets.

Secrets never travel in the environment: `secret("cassandra_password")` reads
the file named by CASSANDRA_PASSWORD_FILE, else /run/secrets/cassandra_password.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
SECRETS_DIR = Path("/run/secrets")


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


def env(name: str, default: T | None = None, cast: Callable[[str], T] = str) -> T:  # type: ignore[assignment]
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise SettingsError(f"{name} is required")
        return default
    try:
        return cast(raw)
    except ValueError as err:
        raise SettingsError(f"{name}={raw!r} is not valid: {err}") from None


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean (use true or false)")


def secret(name: str, required: bool = False) -> str | None:
    path = os.environ.get(f"{name.upper()}_FILE") or str(SECRETS_DIR / name)
    try:
        return Path(path).read_text().strip()
    except FileNotFoundError:
        if required:
            raise SettingsError(f"secret {name} not found at {path} (mount it or set {name.upper()}_FILE)") from None
        return None
