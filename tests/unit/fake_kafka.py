"""A stand-in for confluent_kafka's Message, for unit tests of Kafka consumers (the C type cannot be built here)."""
from __future__ import annotations


class FakeMessage:
    def __init__(self, *, topic: str = "", partition: int = 0, offset: int = 0, key: bytes | None = None,
                 value: bytes | None = None, headers: list | None = None, error: object = None):
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._headers, self._error = key, value, headers, error

    def topic(self):
        return self._topic

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def key(self):
        return self._key

    def value(self):
        return self._value

    def headers(self):
        return self._headers

    def error(self):
        return self._error
