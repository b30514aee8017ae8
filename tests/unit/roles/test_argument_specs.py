"""Every role documents its inputs in meta/argument_specs.yml, and the spec agrees with defaults/main.yml.

Each default is an option of an entry point (`main`, or the task files a role is run by, e.g. backup's `take`)
and each option has a default (or is required);
a literal scalar default is the spec's `default` and of its `type`; a map or list may be described instead
(its `options`). A default with a Jinja expression is resolved in the play: the spec only describes it.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLES = sorted(p.name for p in (REPO / "ansible/roles").iterdir() if (p / "defaults/main.yml").exists())
TYPES = {"str": str, "int": int, "bool": bool, "dict": dict, "list": list, "path": str, "raw": object}


def _yaml(role: str, path: str) -> dict:
    return yaml.safe_load((REPO / "ansible/roles" / role / path).read_text()) or {}


def _options(role: str) -> dict:
    """The options of all the role's entry points."""
    entry_points = _yaml(role, "meta/argument_specs.yml")["argument_specs"].values()
    return {name: option for entry in entry_points for name, option in (entry.get("options") or {}).items()}


def test_the_walk_finds_the_roles_that_deploy_and_check_a_site():
    assert {"preflight", "stack", "health", "images", "topics"} <= set(ROLES)


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_a_documented_option_and_every_option_has_a_default(role):
    assert (REPO / "ansible/roles" / role / "meta/argument_specs.yml").exists(), f"{role}: no meta/argument_specs.yml"
    options = _options(role)
    defaults = _yaml(role, "defaults/main.yml")
    assert sorted(set(defaults) - set(options)) == [], f"{role}: defaults missing from argument_specs"
    assert sorted(o for o in set(options) - set(defaults) if not options[o].get("required")) == [], \
        f"{role}: options without a default in defaults/main.yml (or required: true)"
    for name, option in options.items():
        assert option.get("description"), f"{role}: {name} has no description"


@pytest.mark.parametrize("role", ROLES)
def test_a_literal_default_is_the_specs_default_and_of_its_type(role):
    options = _options(role)
    for name, value in _yaml(role, "defaults/main.yml").items():
        option = options.get(name, {})
        if "{{" in str(value) or option.get("required"):
            assert "default" not in option, f"{role}: {name}'s default is resolved in the play; drop it from the spec"
            continue
        kind = option.get("type", "str")
        assert isinstance(value, TYPES[kind]), f"{role}: {name} = {value!r} is no {kind}"
        if kind not in ("dict", "list") or "default" in option:
            assert option.get("default") == value, f"{role}: {name}: spec {option.get('default')!r} != {value!r}"
        if "choices" in option:
            assert value in option["choices"], f"{role}: {name} = {value!r} is not among its choices"
