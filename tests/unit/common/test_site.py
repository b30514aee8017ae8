"""The one site rule (services.common.site): header, then the record's field, then the topic prefix, then a default."""
from __future__ import annotations

import pytest

from services.common.site import resolve_site, site_from_topic


@pytest.mark.parametrize(("header", "field", "topic", "default", "site"), [
    ("from-header", "from-field", "pfx.topic", "dflt", "from-header"),
    (None, "from-field", "pfx.topic", "dflt", "from-field"),
    ("", "from-field", "pfx.topic", "dflt", "from-field"),       # empty counts as absent
    (None, None, "site-c.temperature-data", "dflt", "site-c"),
    (None, "", "site-c.temperature-data", "dflt", "site-c"),
    (None, None, "temperature-data", "dflt", "dflt"),
    (None, None, None, "dflt", "dflt"),
    (None, None, "temperature-data", None, None),
])
def test_site_is_header_then_field_then_topic_prefix_then_default(header, field, topic, default, site):
    assert resolve_site(header=header, field=field, topic=topic, default=default) == site


@pytest.mark.parametrize(("topic", "site"), [
    ("site-a.temperature-data", "site-a"), ("dc.site-a.temperature-data", "dc"), ("temperature-data", None),
    (".temperature-data", None), ("site-a.", "site-a"),
])
def test_site_from_topic_is_the_mirrormaker_prefix(topic, site):
    assert site_from_topic(topic) == site
