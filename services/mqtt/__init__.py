"""The bridge's own MQTT v5 client: `codec` (packets as bytes) and `session` (one connection, non-blocking)."""
