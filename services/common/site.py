"""Which site a record belongs to: one rule for the bridge, the adapter and the Spark jobs.

Precedence (the first that is set and not empty wins; tests/unit/common/test_site.py):

  1. topic    the '<site>.' prefix MirrorMaker 2 puts on a mirrored topic ('site-a.temperature-data' -> 'site-a').
              At the datacenter it names the site the relay read the record from, which nothing at a site can
              change: a site's producer (a bridge, a job, anyone holding a service's login there) can set any
              header or field, so a record relayed from site-a that claims `site: site-b` is stored as site-a's
              (tests/unit/common/test_site.py::test_a_relayed_record_cannot_claim_another_site). A site's own
              topics have no dot (services/common/names.py; site aliases cannot hold one, deploy/topology.py).
  2. header   the `site` Kafka header, written by the bridge of the site where the device connected (a device
              cannot set it: the bridge drops a user property of that name).
  3. field    a `site` field of the payload. The bridge does not use this list: it records its own BRIDGE_SITE,
              the site whose Mosquitto the device logged into, and dead-letters a reading whose topic names
              another site (services/bridge/routing.py).
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
