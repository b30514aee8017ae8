"""Artifact cache: resolve pinned jars and wheels once, fetch and verify them.

`lock`  resolves images/versions.toml into images/artifacts.lock.json (exact files,
        download URLs and sha256). Needs Maven (`mvn`) and pip; run it when a pin changes.
`fetch` downloads every locked file into the cache (default $XDG_CACHE_HOME/iot-stack,
        override with IOT_STACK_CACHE) and verifies its sha256. Files already present
        and correct are not downloaded again, so a fresh clone reuses the cache.
        Source-only Python packages (pyspark) are built into wheels once, here on the
        host, so image builds never need PyPI.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tooling import pins
from tooling.progress import log

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
PYPI_SIMPLE = "https://pypi.org/simple/{name}/"  # PEP 691 JSON index


class ArtifactError(SystemExit):
    """Stops the build with a message naming the artifact and the fix."""


def cache_dir() -> Path:
    if os.environ.get("IOT_STACK_CACHE"):
        return Path(os.environ["IOT_STACK_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "iot-stack"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- Maven

def maven_path(coord: str) -> str:
    """'g:a:v' or 'g:a:classifier:v' -> repository-relative path of the jar."""
    parts = coord.split(":")
    if len(parts) == 3:
        group, artifact, version = parts
        classifier = ""
    elif len(parts) == 4:
        group, artifact, classifier, version = parts
    else:
        raise ArtifactError(f"bad Maven coordinate '{coord}' (expected group:artifact[:classifier]:version)")
    suffix = f"-{classifier}" if classifier else ""
    return f"{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}{suffix}.jar"


def _dependencies_xml(coords: list[str]) -> str:
    return "".join(
        "<dependency><groupId>{}</groupId><artifactId>{}</artifactId><version>{}</version></dependency>".format(
            *coord.split(":"))
        for coord in coords
    )


def _resolve_maven(group: str, roots: list[str], overrides: list[str], workdir: Path) -> list[dict]:
    deps = _dependencies_xml(roots)
    managed = _dependencies_xml(overrides)
    pom = workdir / f"pom-{group}.xml"
    pom.write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>iot-stack.lock</groupId><artifactId>{group}</artifactId><version>0</version>"
        "<packaging>pom</packaging>"
        f"<dependencyManagement><dependencies>{managed}</dependencies></dependencyManagement>"
        f"<dependencies>{deps}</dependencies></project>"
    )
    # Some POMs (Spark's) declare extra repositories; route everything to Maven Central.
    settings = workdir / "settings.xml"
    settings.write_text(
        "<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>"
        f"<url>{MAVEN_CENTRAL}</url></mirror></mirrors></settings>"
    )
    listing = workdir / f"deps-{group}.txt"
    # -C: fail on a checksum mismatch against Maven Central's published checksums.
    cmd = ["mvn", "-B", "-q", "-C", "-s", str(settings), "-f", str(pom), "dependency:list", "-DincludeScope=runtime",
           "-DoutputAbsoluteArtifactFilename=true", f"-DoutputFile={listing}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ArtifactError(f"mvn could not resolve [maven.{group}] {roots}:\n{result.stdout[-3000:]}")
    entries = []
    for line in listing.read_text().splitlines():
        fields = line.strip().split(":")
        if len(fields) < 6 or fields[2] != "jar":
            continue
        # group:artifact:jar[:classifier]:version:scope:/abs/path
        if len(fields) == 7:
            g, a, _, classifier, v, _, path = fields
            coord = f"{g}:{a}:{classifier}:{v}"
        else:
            g, a, _, v, _, path = fields
            coord = f"{g}:{a}:{v}"
        entries.append({"coord": coord, "file": Path(path).name, "sha256": sha256_of(Path(path))})
    return sorted(entries, key=lambda e: e["coord"])


# ---------------------------------------------------------------- Python

_DIST_RE = re.compile(r"^(?P<name>.+?)-(?P<version>[0-9][^-]*?)(-.*\.whl|\.tar\.gz|\.zip)$")


def _pypi_url(filename: str, sha: str) -> str:
    match = _DIST_RE.match(filename)
    if not match:
        raise ArtifactError(f"cannot parse distribution file name '{filename}'")
    project = re.sub(r"[-_.]+", "-", match["name"]).lower()
    request = urllib.request.Request(PYPI_SIMPLE.format(name=project),
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        index = json.load(resp)
    for item in index["files"]:
        if item["filename"] == filename:
            if item["hashes"].get("sha256") != sha:
                raise ArtifactError(f"{filename}: sha256 differs from PyPI's record")
            return item["url"]
    raise ArtifactError(f"{filename} is not listed by PyPI for {project}")


def _resolve_python(group: str, requirements: list[str], workdir: Path) -> list[dict]:
    dest = workdir / f"py-{group}"
    # The host runs CPython 3.11 on Debian bookworm, like the images, so the
    # resolution here picks the wheels the images can install.
    cmd = [sys.executable, "-m", "pip", "download", "--prefer-binary", "-q", "-d", str(dest), *requirements]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ArtifactError(f"pip could not resolve [python.{group}] {requirements}:\n{result.stderr[-3000:]}")
    entries = []
    for path in sorted(dest.iterdir()):
        sha = sha256_of(path)
        entries.append({
            "file": path.name,
            "kind": "wheel" if path.name.endswith(".whl") else "sdist",
            "url": _pypi_url(path.name, sha),
            "sha256": sha,
        })
    return entries


def lock(pinned: pins.Pins, lock_file: Path = pins.LOCK_FILE) -> None:
    if not shutil.which("mvn"):
        raise ArtifactError("locking needs Maven: apt-get install maven (fetching does not)")
    started = time.monotonic()
    data: dict = {"maven": {}, "python": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for group, roots in pinned.maven_roots.items():
            log("lock", f"resolving [maven.{group}] {len(roots)} roots")
            overrides = pinned.maven_overrides.get(group, [])
            data["maven"][group] = _resolve_maven(group, roots, overrides, Path(tmp))
        for group, reqs in pinned.python_requirements.items():
            log("lock", f"resolving [python.{group}] {len(reqs)} requirements")
            data["python"][group] = _resolve_python(group, reqs, Path(tmp))
    lock_file.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    log("lock", f"wrote {lock_file.name} in {time.monotonic() - started:.0f}s")


# ---------------------------------------------------------------- fetch

def load_lock(lock_file: Path = pins.LOCK_FILE) -> dict:
    if not lock_file.exists():
        raise ArtifactError(f"{lock_file} is missing: run `scripts/artifacts lock`")
    return json.loads(lock_file.read_text())


def maven_cache_path(entry: dict) -> Path:
    return cache_dir() / "maven" / maven_path(entry["coord"])


def python_cache_path(entry: dict) -> Path:
    return cache_dir() / "python" / entry["file"]


def built_wheel_dir() -> Path:
    return cache_dir() / "built-wheels"


def _download(url: str, dest: Path, sha: str, name: str) -> bool:
    """Download url to dest unless a verified copy is there. Returns True if downloaded."""
    if dest.exists() and sha256_of(dest) == sha:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=300) as resp, partial.open("wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise ArtifactError(f"cannot download {name} from {url}: {err}") from None
    actual = sha256_of(partial)
    if actual != sha:
        partial.unlink(missing_ok=True)
        raise ArtifactError(
            f"checksum mismatch for {name}: expected sha256 {sha}, got {actual} "
            f"(from {url}); refusing to use it")
    partial.replace(dest)
    return True


def _build_sdist_wheels(entries: list[dict]) -> None:
    """Turn locked source distributions into wheels once, on the host."""
    out = built_wheel_dir()
    out.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        stem = _DIST_RE.match(entry["file"])
        marker = out / f".{entry['sha256']}.built"
        if marker.exists():
            continue
        log("fetch", f"building a wheel from {entry['file']} (once; takes a minute)")
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(python_cache_path(entry))]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise ArtifactError(f"cannot build a wheel from {entry['file']} ({stem['name']}):\n{result.stderr[-2000:]}")
        marker.touch()


def fetch(lock_data: dict, jobs: int = 8) -> None:
    started = time.monotonic()
    work: list[tuple[str, Path, str, str]] = []
    for entries in lock_data["maven"].values():
        for e in entries:
            work.append((f"{MAVEN_CENTRAL}/{maven_path(e['coord'])}", maven_cache_path(e), e["sha256"], e["coord"]))
    sdists = []
    for entries in lock_data["python"].values():
        for e in entries:
            work.append((e["url"], python_cache_path(e), e["sha256"], e["file"]))
            if e["kind"] == "sdist":
                sdists.append(e)
    unique = {dest: (url, dest, sha, name) for url, dest, sha, name in work}
    total = len(unique)
    downloaded = 0
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for done, fresh in enumerate(pool.map(lambda w: _download(*w), unique.values()), start=1):
            downloaded += fresh
            if fresh or done == total:
                log("fetch", f"{done}/{total} artifacts verified ({downloaded} downloaded)", every=2.0,
                    force=done == total)
    _build_sdist_wheels(sdists)
    log("fetch", f"cache {cache_dir()} ready: {total} artifacts, {downloaded} downloaded, "
                 f"{time.monotonic() - started:.0f}s")


def pip_install(group: str, pinned: pins.Pins) -> None:
    """Install one image's locked Python packages into the running interpreter, offline
    from the cache (the tests of the Spark jobs need the spark image's pyspark stack)."""
    if group not in pinned.python_requirements:
        raise ArtifactError(f"unknown python group '{group}' (known: {', '.join(pinned.python_requirements)})")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index",
           "--find-links", str(cache_dir() / "python"), "--find-links", str(built_wheel_dir()),
           *pinned.python_requirements[group]]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ArtifactError(f"cannot install [python.{group}] from the cache (run `scripts/artifacts fetch`):\n"
                            f"{result.stderr[-2000:]}")
    log("fetch", f"installed [python.{group}] into {sys.prefix}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/artifacts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("lock", help="resolve images/versions.toml into images/artifacts.lock.json")
    fetch_p = sub.add_parser("fetch", help="download and verify every locked artifact into the cache")
    fetch_p.add_argument("--jobs", type=int, default=8, help="parallel downloads (default 8)")
    sub.add_parser("where", help="print the cache directory")
    install_p = sub.add_parser("pip-install", help="install one group's locked wheels into this venv, offline")
    install_p.add_argument("group", help="a [python.<group>] of versions.toml, e.g. spark")
    args = parser.parse_args(argv)
    if args.command == "lock":
        lock(pins.load())
    elif args.command == "fetch":
        fetch(load_lock(), jobs=args.jobs)
    elif args.command == "pip-install":
        pip_install(args.group, pins.load())
    else:
        print(cache_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
