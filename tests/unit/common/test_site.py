"""The one site rule (services.common.site): topic prefix, then header, then the record's field, then a default."""
from __future__ import annotations

import pytest

from services.common.site import resolve_site, site_from_topic


@pytest.mark.parametrize(("header", "field", "topic", "default", "site"), [
    ("from-header", "from-field", "pfx.topic", "dflt", "pfx"),
    ("from-header", "from-field", "topic", "dflt", "from-header"),
    (None, "from-field", "topic", "dflt", "from-field"),
    ("", "from-field", "topic", "dflt", "from-field"),       # empty counts as absent
    (None, None, "site-c.temperature-data", "dflt", "site-c"),
    (None, "", "site-c.temperature-data", "dflt", "site-c"),
    (None, None, "temperature-data", "dflt", "dflt"),
    (None, None, None, "dflt", "dflt"),
    (None, None, "temperature-data", None, None),
])
def test_site_is_topic_prefix_then_header_then_field_then_default(header, field, topic, default, site):
    assert resolve_site(header=header, field=field, topic=topic, default=default) == site


def test_a_relayed_record_cannot_claim_another_site():
    """At the datacenter, a record MirrorMaker read from site-a is site-a's, whatever a producer there wrote:
    a header or field naming site-b is a claim anyone with a login at site-a can make (issue 30)."""
    assert resolve_site(header="site-b", field="site-b", topic="site-a.temperature-data", default="datacenter") \
        == "site-a"


@pytest.mark.parametrize(("topic", "site"), [
    ("site-a.temperature-data", "site-a"), ("dc.site-a.temperature-data", "dc"), ("temperature-data", None),
    (".temperature-data", None), ("site-a.", "site-a"),
])
def test_site_from_topic_is_the_mirrormaker_prefix(topic, site):
    assert site_from_topic(topic) == site
