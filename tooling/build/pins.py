"""Read images/versions.toml, the one file that pins every version."""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_FILE = REPO_ROOT / "images" / "versions.toml"
LOCK_FILE = REPO_ROOT / "images" / "artifacts.lock.json"


@dataclass(frozen=True)
class Pins:
    versions: dict[str, str]
    base_image: str
    debian_mirror: str
    maven_roots: dict[str, list[str]]      # group -> ["g:a:v", ...]
    maven_overrides: dict[str, list[str]]  # group -> versions forced on transitive deps
    python_requirements: dict[str, list[str]]  # group -> ["name==version", ...]

    @property
    def image_tag(self) -> str:
        # IOT_STACK_IMAGE_TAG lets a second checkout build and test its own images next to
        # the pinned ones (same engine) without replacing them.
        return os.environ.get("IOT_STACK_IMAGE_TAG") or self.versions["images"]


def _expand(text: str, versions: dict[str, str], where: str) -> str:
    try:
        return text.format(**versions)
    except KeyError as err:
        raise SystemExit(
            f"{VERSIONS_FILE.name}: {where} uses {{{err.args[0]}}} but [versions] has no "
            f"'{err.args[0]}' (add it to [versions])"
        ) from None


def load(path: Path = VERSIONS_FILE) -> Pins:
    with path.open("rb") as fh:
        raw = tomllib.load(fh)
    versions = {k: str(v) for k, v in raw["versions"].items()}
    maven = {
        group: [_expand(r, versions, f"[maven.{group}]") for r in spec["roots"]]
        for group, spec in raw.get("maven", {}).items()
    }
    overrides = {
        group: [_expand(r, versions, f"[maven.{group}]") for r in spec.get("overrides", [])]
        for group, spec in raw.get("maven", {}).items()
    }
    python = {
        group: [_expand(r, versions, f"[python.{group}]") for r in spec["requirements"]]
        for group, spec in raw.get("python", {}).items()
    }
    return Pins(
        versions=versions,
        base_image=raw["base"]["image"],
        debian_mirror=raw["base"]["mirror"],
        maven_roots=maven,
        maven_overrides=overrides,
        python_requirements=python,
    )
