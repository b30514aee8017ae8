"""Build the project's images from images/<name>/ and the artifact cache.

Each image's inputs (its folder, the locked artifacts it copies, the project
sources it embeds, its parent image) are hashed; the hash is stored as an image
label, so an image whose inputs did not change is not rebuilt at all. Docker's
own layer cache covers partial changes. Builds print which image, which step and
how long each took; the full build log goes to <cache>/build/<name>.log.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tooling.build import artifacts, base, pins
from tooling.build.progress import log

INPUTS_LABEL = "org.iot-stack.inputs"
PREFIX = "iot-stack"


@dataclass(frozen=True)
class Image:
    name: str
    parent: str | None = None        # another project image, else the Debian base
    maven: str | None = None         # [maven.<group>] jars copied to jars/
    agents: tuple[str, ...] = ()     # [maven.<group>]s of java agents (not on the classpath), copied to agents/
    python: str | None = None        # [python.<group>] wheels copied to wheels/
    project_wheel: bool = False      # the project's own Python package, built on the host
    sources: tuple[str, ...] = field(default_factory=tuple)  # repo paths copied to src/


# Build order: parents first. runtime (tini, CA certificates, the app user) is
# the only image built from the Debian base; every other one descends from it.
IMAGES: tuple[Image, ...] = (
    Image("runtime"),
    Image("jre", parent="runtime"),
    Image("kafka", parent="jre", maven="kafka", agents=("jmx_exporter",)),
    Image("cassandra", parent="jre", maven="cassandra", python="cassandra", agents=("jmx_exporter",)),
    Image("spark", parent="jre", maven="spark", python="spark", project_wheel=True, sources=("spark",)),
    Image("mosquitto", parent="runtime"),
    Image("services", parent="runtime", python="services", project_wheel=True),
    Image("registry", parent="runtime"),  # a multi-node site's own registry (ansible images role)
    Image("prometheus", parent="runtime", sources=("monitoring",)),  # every site's; rules and console from monitoring/
    Image("node-exporter", parent="runtime"),  # every node's free disk space, scraped by its site's Prometheus
    Image("lab-host", parent="runtime"),  # scripts/lab only; never shipped to sites
)
BY_NAME = {image.name: image for image in IMAGES}
PROJECT_SOURCES = ("pyproject.toml", "services")


def tag(name: str, pinned: pins.Pins) -> str:
    return f"{PREFIX}/{name}:{pinned.image_tag}"


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc"))


def _label(ref: str) -> str | None:
    fmt = "{{ index .Config.Labels \"" + INPUTS_LABEL + "\" }}"
    result = subprocess.run(["docker", "image", "inspect", "-f", fmt, ref], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def build_args(pinned: pins.Pins, base_id: str | None = None) -> list[str]:
    """--build-arg options every build gets: the Debian base (by its recorded id, tooling/build/base.py;
    its tag only without one), each parent image as <NAME>_IMAGE (RUNTIME_IMAGE, JRE_IMAGE) and the
    image version."""
    parents = sorted({image.parent for image in IMAGES if image.parent})
    args = [f"BASE_IMAGE={base_id or pinned.base_image}"]
    args += [f"{parent.upper().replace('-', '_')}_IMAGE={tag(parent, pinned)}" for parent in parents]
    args.append(f"IMAGE_VERSION={pinned.image_tag}")
    return [option for arg in args for option in ("--build-arg", arg)]


def _parent_ref(image: Image, pinned: pins.Pins, base_id: str | None = None) -> str:
    return tag(image.parent, pinned) if image.parent else (base_id or pinned.base_image)


def inputs_hash(image: Image, pinned: pins.Pins, lock_data: dict, base_id: str | None = None) -> str:
    """Everything that decides the image's content, hashed."""
    digest = hashlib.sha256()
    parent_id = base.image_id(_parent_ref(image, pinned, base_id))
    if parent_id is None:
        raise SystemExit(f"parent image {_parent_ref(image, pinned)} of {image.name} is missing: "
                         "run `scripts/base-image` (or build the parent first)")
    digest.update(parent_id.encode())
    digest.update(pinned.image_tag.encode())
    paths = [pins.REPO_ROOT / "images" / image.name]
    paths += [pins.REPO_ROOT / s for s in image.sources]
    if image.project_wheel:
        paths += [pins.REPO_ROOT / s for s in PROJECT_SOURCES]
    for root in paths:
        for path in _files(root):
            digest.update(str(path.relative_to(pins.REPO_ROOT)).encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    groups = [("maven", image.maven), *(("maven", agent) for agent in image.agents), ("python", image.python)]
    for kind, group in groups:
        if group:
            for entry in lock_data[kind][group]:
                digest.update(entry["sha256"].encode())
    return digest.hexdigest()[:32]


def _link_or_copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _project_wheel(dest_dir: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
           "-w", str(dest_dir), str(pins.REPO_ROOT)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"cannot build the project wheel:\n{result.stderr[-2000:]}")


def stage(image: Image, lock_data: dict) -> Path:
    """Assemble the build context under the cache: image folder + artifacts + sources."""
    context = artifacts.cache_dir() / "build" / image.name
    shutil.rmtree(context, ignore_errors=True)
    shutil.copytree(pins.REPO_ROOT / "images" / image.name, context)
    (context / "jars").mkdir()
    (context / "wheels").mkdir()
    (context / "agents").mkdir()
    jar_groups = [(image.maven, "jars")] if image.maven else []
    jar_groups += [(agent, "agents") for agent in image.agents]
    for group, folder in jar_groups:
        for entry in lock_data["maven"][group]:
            src = artifacts.maven_cache_path(entry)
            if not src.exists():
                raise SystemExit(f"{entry['coord']} is not in the artifact cache: run `scripts/artifacts fetch`")
            _link_or_copy(src, context / folder / src.name)
    if image.python:
        for entry in lock_data["python"][image.python]:
            if entry["kind"] == "wheel":
                src = artifacts.python_cache_path(entry)
            else:  # built once from the locked sdist by `fetch`
                name = entry["file"].split("-")[0].replace("-", "_")
                built = sorted(artifacts.built_wheel_dir().glob(f"{name}-*.whl"))
                if not built:
                    raise SystemExit(f"no wheel built from {entry['file']}: run `scripts/artifacts fetch`")
                src = built[-1]
            if not src.exists():
                raise SystemExit(f"{entry['file']} is not in the artifact cache: run `scripts/artifacts fetch`")
            _link_or_copy(src, context / "wheels" / src.name)
    if image.project_wheel:
        # Apart from the third-party wheels, so a code change rebuilds only the last layers.
        (context / "project").mkdir()
        _project_wheel(context / "project")
    for source in image.sources:
        shutil.copytree(pins.REPO_ROOT / source, context / "src" / source,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return context


def build(image: Image, pinned: pins.Pins, lock_data: dict, index: int, total: int, force: bool = False) -> bool:
    """Build one image unless it is up to date. Returns True if it was built."""
    ref = tag(image.name, pinned)
    base_id = None if image.parent else base.base_ref(pinned)
    wanted = inputs_hash(image, pinned, lock_data, base_id)
    if not force and _label(ref) == wanted:
        log("images", f"({index}/{total}) {ref} up to date")
        return False
    started = time.monotonic()
    log("images", f"({index}/{total}) building {ref}")
    context = stage(image, lock_data)
    logfile = artifacts.cache_dir() / "build" / f"{image.name}.log"
    cmd = ["docker", "build", "--network", "host",
           *build_args(pinned, base_id),
           "--label", f"{INPUTS_LABEL}={wanted}",
           "-t", ref, str(context)]
    # The classic builder runs everywhere (BuildKit needs the buildx plugin).
    env = dict(os.environ, DOCKER_BUILDKIT="0")
    step_started = started
    with logfile.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if line.startswith("Step "):
                now = time.monotonic()
                log("images", f"  {image.name} {line.strip()[:110]}  (previous step {now - step_started:.1f}s)")
                step_started = now
        code = proc.wait()
    if code != 0:
        tail = "".join(logfile.read_text().splitlines(keepends=True)[-30:])
        raise SystemExit(f"building {ref} failed (full log: {logfile}):\n{tail}")
    shutil.rmtree(context, ignore_errors=True)
    log("images", f"({index}/{total}) built {ref} in {time.monotonic() - started:.0f}s")
    return True


def with_parents(names: list[str]) -> list[Image]:
    wanted: set[str] = set()
    for requested in names:
        if requested not in BY_NAME:
            raise SystemExit(f"unknown image '{requested}' (known: {', '.join(BY_NAME)})")
        name: str | None = requested
        while name:
            wanted.add(name)
            name = BY_NAME[name].parent
    return [image for image in IMAGES if image.name in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/images", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    build_p = sub.add_parser("build", help="build images (default: all) and their parents")
    build_p.add_argument("names", nargs="*", help=f"images to build: {', '.join(BY_NAME)}")
    build_p.add_argument("--force", action="store_true", help="rebuild even if inputs did not change")
    sub.add_parser("list", help="print image references and sizes")
    args = parser.parse_args(argv)
    pinned = pins.load()
    if args.command == "list":
        for image in IMAGES:
            ref = tag(image.name, pinned)
            size = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", ref],
                                  capture_output=True, text=True).stdout.strip()
            print(f"{ref:32} {int(size) / 1e6:8.0f} MB" if size else f"{ref:32} (not built)")
        return 0
    lock_data = artifacts.load_lock()
    selected = with_parents(args.names or list(BY_NAME))
    started = time.monotonic()
    built = sum(build(image, pinned, lock_data, i, len(selected), args.force)
                for i, image in enumerate(selected, start=1))
    log("images", f"{built} built, {len(selected) - built} up to date, {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
