"""The notifier's dead letters for notifications the webhook never took, without a SparkSession."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "spark"))
pytest.importorskip("pyspark")

from iot_jobs.notifier_sink import WEBHOOK_FAILED, dead_letter_rows  # noqa: E402
from pyspark.sql import Row  # noqa: E402

from services.common import names  # noqa: E402
from services.common.dead_letter import dead_letter  # noqa: E402


def test_failed_notification_becomes_a_dead_letter_like_every_other():
    record = Row(key="s9", value='{"text": "hot"}', headers=[Row(key="site", value=bytearray(b"site-a"))])
    reason = "webhook failed after 2 attempt(s): HTTP 503 Service Unavailable: {}"
    ((key, value, headers),) = dead_letter_rows([(record, reason)], "notifications", now_ms=42)
    assert (key, value) == ("s9", '{"text": "hot"}')
    assert headers == [("site", b"site-a"),
                       (names.HEADER_DLQ_SOURCE, b"webhook:notifications"),
                       (names.HEADER_DLQ_REASON, f"{WEBHOOK_FAILED}: {reason}".encode()),
                       (names.HEADER_DLQ_TIME_MS, b"42")]
    # The same headers as the one builder gives (no dlq_offset: the record never came from Kafka).
    assert headers == dead_letter("dlq", "webhook:notifications", b"s9", b"", WEBHOOK_FAILED, reason, 42,
                                  [("site", b"site-a")]).headers
