"""Which site a record belongs to: one rule for the bridge, the adapter and the Spark jobs.

Precedence (the first that is set and not empty wins; tests/unit/common/test_site.py):

  1. topic    the '<site>.' prefix MirrorMaker 2 puts on a mirrored topic ('site-a.temperature-data' -> 'site-a'):
              the site the relay read it from, which no producer at a site can change, unlike a header or a
              field (docs/architecture.md, step 8). A site's own topics and aliases have no dot.
  2. header   the `site` Kafka header, written by the bridge of the site where the device connected (a device
              cannot set it: the bridge drops a user property of that name).
  3. field    a `site` field of the payload. The bridge does not use this list: it records its own BRIDGE_SITE
              and dead-letters a reading whose topic names another site (services/bridge/routing.py).
  4. default  the service's setting (BRIDGE_SITE, ADAPTER_DEFAULT_SITE, SITE).

The Spark jobs cannot call Python per row; iot_jobs.readings.site_column builds the same precedence as an
F.coalesce. Standard library only."""
from __future__ import annotations


def site_from_topic(topic: str) -> str | None:
    """MirrorMaker 2 prefixes mirrored topics with the source alias: 'site-a.temperature-data' -> 'site-a'."""
    prefix, dot, _ = topic.partition(".")
    return prefix if dot and prefix else None


def resolve_site(header: str | None = None, field: str | None = None, topic: str | None = None,
                 default: str | None = None) -> str | None:
    """The record's site by the precedence above (topic prefix, header, field, default); None when none is set."""
    return (site_from_topic(topic) if topic else None) or header or field or default
