"""Password hashes the controller writes for Mosquitto ($7$), the site registry and Prometheus (bcrypt).

Salts are HMACs keyed by the deployment's salt key (the pki role's password-salt.key): unpredictable
without the key, yet the same on every run, so a rerun changes nothing and restarts nothing.
"""
from __future__ import annotations

import base64
import hashlib
import hmac

from deploy.errors import fail


def _mqtt_hash(site_alias: str, user: str, password: str, salt_key: str, iterations: int) -> str:
    """Mosquitto's $7$ hash (PBKDF2-SHA512), stable so reruns change nothing.

    The salt is an HMAC, keyed by `salt_key` (random per deployment, kept on the controller by the pki
    role), of site, user and password: unique per entry and unpredictable without the key, as a random
    salt is, yet the same on every run (a new salt would renew the secret and restart Mosquitto)."""
    if len(str(salt_key)) < 32:
        fail("mqtt logins: the salt key must be at least 32 characters (the pki role's password-salt.key)")
    entry = f"{site_alias}:{user}:{password}".encode()
    salt = hmac.new(str(salt_key).encode(), entry, hashlib.sha256).digest()[:12]
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def mqtt_service_accounts(users: dict, kinds: list, site_alias: str, salt_key: str, iterations: int = 1000) -> str:
    """The secret mqtt_services that Mosquitto's iot_gate plugin reads: one line per service login on the
    overlay listener, `<user> <bridge|agent> <client id prefix> <$7$ hash>`. `kinds` lists each service
    login ({user, kind, prefix}); each must have a password in `users` (stack_mqtt_users)."""
    lines = ["# MQTT logins of the site's services (iot_gate plugin): user, kind, client-id prefix, hash"]
    for entry in kinds:
        user = str(entry["user"])
        if not user or " " in user or user not in users or not str(users[user]):
            fail(f"stack_mqtt_users: the {entry['kind']} login {user!r} needs a password "
                  "(add it to stack_mqtt_users, kept in ansible-vault)")
        lines.append(f"{user} {entry['kind']} {entry['prefix']} "
                     f"{_mqtt_hash(site_alias, user, str(users[user]), salt_key, iterations)}")
    return "\n".join(lines) + "\n"


def mqtt_device_hashes(devices: dict, site_alias: str, salt_key: str, iterations: int = 1000) -> dict:
    """The inventory's devices (id -> password) as id -> $7$ hash, hashed here on the controller with
    stable salts, so the devices role writes nothing on a rerun and no password leaves the controller."""
    return {str(device): _mqtt_hash(site_alias, str(device), str(password), salt_key, iterations)
            for device, password in sorted((devices or {}).items(), key=lambda item: str(item[0]))}


_BCRYPT_B64 = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
                            "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def bcrypt_hash(password: str, user: str, salt_key: str) -> str:
    """A bcrypt hash of `user`'s password, stable so reruns change nothing: the salt is an HMAC of user
    and password keyed by `salt_key`, as in mosquitto_passwd. The site registry's htpasswd and
    Prometheus' web configuration (basic_auth_users) take it."""
    import bcrypt  # the controller's venv (pyproject, deploy); imported here, only when used
    if len(str(salt_key)) < 32:
        fail("bcrypt_hash: the salt key must be at least 32 characters")
    raw = hmac.new(str(salt_key).encode(), f"{user}:{password}".encode(), hashlib.sha256).digest()[:16]
    salt = base64.b64encode(raw).decode()[:22].translate(_BCRYPT_B64)
    return bcrypt.hashpw(str(password).encode(), f"$2b$10${salt}".encode()).decode()


def registry_htpasswd(user: str, password: str, salt_key: str) -> str:
    """One line of the site registry's htpasswd file (bcrypt, which Distribution requires)."""
    return f"{user}:{bcrypt_hash(password, user, salt_key)}\n"


# What ansible/filter_plugins/deploy_filters.py registers, by function name.
FILTERS = {f.__name__: f for f in (mqtt_service_accounts, mqtt_device_hashes, bcrypt_hash, registry_htpasswd)}
