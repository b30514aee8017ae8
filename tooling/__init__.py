"""Developer and operator tooling: pinned versions, the artifact cache, image builds."""
