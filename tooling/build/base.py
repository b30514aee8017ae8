"""The Debian base image, taken by its image id, never by its tag.

`debian:bookworm-slim` is a tag that anything on the build host may overwrite (a `docker pull` by
another project, a `docker tag` by anyone with the engine). The first time the base is made or seen
(`scripts/base-image`, or the first build) its id is recorded in <cache>/base-image.id, and every build
starts from that id (`FROM sha256:...`). A tag that later names another image is reported and not used;
`scripts/base-image --renew` makes a new base and records it on purpose.

    python3 -m tooling.build.base record    # record the tag's image id when none is recorded
    python3 -m tooling.build.base renew     # forget the record (scripts/base-image --renew)
    python3 -m tooling.build.base show      # the id builds start from
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tooling.build import artifacts, pins
from tooling.build.progress import log

Inspect = Callable[[str], "str | None"]     # a reference -> its image id, None when the engine has none


def record_path() -> Path:
    return artifacts.cache_dir() / "base-image.id"


def image_id(ref: str) -> str | None:
    result = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", ref], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


class BaseImageError(SystemExit):
    """Stops the build with a message naming the base image and the fix."""


def resolve(tag: str, record: Path, inspect: Inspect = image_id) -> tuple[str, str | None]:
    """(the image id builds start from, a warning or None). Records the tag's id when nothing is
    recorded for this tag (the first use); afterwards the recorded id wins over whatever the tag names."""
    recorded = _read(record, tag)
    current = inspect(tag)
    if recorded is None:
        if current is None:
            raise BaseImageError(f"base image {tag} is missing: run `scripts/base-image`")
        _write(record, tag, current)
        return current, None
    if inspect(recorded) is None:
        raise BaseImageError(f"base image {recorded[:19]} recorded in {record} for {tag} is gone from the engine: "
                             "run `scripts/base-image --renew` to make a new base and record it")
    warning = None
    if current is not None and current != recorded:
        warning = (f"{tag} now names {current[:19]}, not the base recorded in {record} ({recorded[:19]}): "
                   "building from the recorded one. If you replaced the base on purpose, run "
                   "`scripts/base-image --renew`")
    return recorded, warning


def _read(record: Path, tag: str) -> str | None:
    try:
        recorded_tag, _, recorded_id = record.read_text().strip().partition(" ")
    except FileNotFoundError:
        return None
    return recorded_id if recorded_tag == tag and recorded_id.startswith("sha256:") else None


def _write(record: Path, tag: str, image: str) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(f"{tag} {image}\n")


def base_ref(pinned: pins.Pins) -> str:
    """The id the root image's FROM takes, with the warning logged. IOT_STACK_BASE_IMAGE names another
    base tag, as for scripts/base-image."""
    image, warning = resolve(os.environ.get("IOT_STACK_BASE_IMAGE") or pinned.base_image, record_path())
    if warning:
        log("images", f"warning: {warning}")
    return image


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    pinned = pins.load()
    if command == "record":
        log("base-image", f"builds start from {base_ref(pinned)[:19]} (recorded in {record_path()})")
    elif command == "renew":
        record_path().unlink(missing_ok=True)
    elif command == "show":
        print(base_ref(pinned))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
