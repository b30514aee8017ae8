"""HTTP webhook sink (Telegram Bot API compatible) with retries; no Spark.

POST <url> with JSON {"chat_id": ..., "text": ...}: with
url=https://api.telegram.org/bot<token>/sendMessage this is Telegram's sendMessage.
Connection errors, timeouts, HTTP 429 and 5xx are retried with exponential
backoff (429 honours Retry-After / Telegram's parameters.retry_after); other
4xx are final at once. A message that finally fails is returned with the
reason, for the caller to dead-letter.
"""
from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from services.common.backoff import Backoff

log = logging.getLogger("iot_stack.webhook")
MAX_BACKOFF_SECONDS = 30.0


@dataclass(frozen=True)
class Webhook:
    url: str
    chat_id: str = ""
    attempts: int = 5
    timeout: float = 10.0
    backoff: float = 1.0                      # first retry delay; doubles each time
    sleep: Callable[[float], None] = time.sleep

    def send(self, text: str) -> str | None:
        """Deliver one message; None on success, else why it finally failed."""
        body = {"text": text, **({"chat_id": self.chat_id} if self.chat_id else {})}
        data = json.dumps(body).encode()
        reason = ""
        backoff = Backoff(self.backoff, MAX_BACKOFF_SECONDS)
        for attempt in range(1, self.attempts + 1):
            request = urllib.request.Request(self.url, data=data, method="POST",
                                             headers={"Content-Type": "application/json"})
            delay = backoff.delay(attempt - 1)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    response.read()
                    return None
            except urllib.error.HTTPError as err:
                detail = err.read()[:200].decode("utf-8", "replace")
                reason = f"HTTP {err.code} {err.reason}: {detail}"
                if err.code != 429 and err.code < 500:
                    break
                if err.code == 429:
                    delay = _retry_after(err, detail, delay)
            except (urllib.error.URLError, TimeoutError, OSError) as err:
                reason = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
            if attempt < self.attempts:
                log.warning("webhook attempt=%d failed reason=%r retry_in=%.1fs", attempt, reason, delay)
                self.sleep(delay)
        return f"webhook failed after {attempt} attempt(s): {reason}"

    def send_all(self, texts: Iterable[tuple[object, str]]) -> list[tuple[object, str]]:
        """Send (id, text) pairs in order; return (id, reason) for those that finally failed."""
        failed = []
        for ident, text in texts:
            reason = self.send(text)
            if reason is not None:
                failed.append((ident, reason))
        return failed


def _retry_after(err: urllib.error.HTTPError, detail: str, default: float) -> float:
    try:
        return min(float(err.headers.get("Retry-After")), MAX_BACKOFF_SECONDS)
    except (TypeError, ValueError):
        pass
    try:
        return min(float(json.loads(detail)["parameters"]["retry_after"]), MAX_BACKOFF_SECONDS)
    except (ValueError, KeyError, TypeError):
        return default
