"""docs/settings.md's tables are the services' settings as declared (tests/unit/settings_docs.py makes them)."""
from __future__ import annotations

import re

from tests.unit import settings_docs


def test_every_service_has_its_table_in_docs_settings_md():
    assert set(settings_docs.blocks(settings_docs.SERVICES_DOC.read_text(encoding="utf-8"))) == \
        set(settings_docs.service_tables())


def test_each_table_lists_exactly_the_declared_variables_with_their_defaults():
    documented = settings_docs.blocks(settings_docs.SERVICES_DOC.read_text(encoding="utf-8"))
    for program, table in settings_docs.service_tables().items():
        variables = re.findall(r"^\| `(\w+)` ", documented[program], re.M)
        assert variables == re.findall(r"^\| `(\w+)` ", table, re.M), program
        assert documented[program] == table, \
            f"docs/settings.md's {program} table is out of date: run python -m tests.unit.settings_docs"


def test_render_replaces_only_the_named_blocks():
    text = "a\n<!-- settings: x -->\nold\n<!-- /settings -->\nb\n<!-- settings: y -->\nkept\n<!-- /settings -->\n"
    assert settings_docs.render(text, {"x": "new\n"}) == text.replace("old", "new")
