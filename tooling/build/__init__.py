"""What the production build runs on the controller (site.yml's images role calls scripts/images): pinned
versions, the artifact cache, the image builder and its progress lines."""
