"""Artifact cache: resolve pinned jars and wheels once, fetch and verify them.

`lock`  resolves images/versions.toml into images/artifacts.lock.json (exact files, download URLs and
        sha256); Python wheels are chosen for the images' CPython and manylinux x86_64, not for the Python
        that runs the lock. Needs Maven (`mvn`) and pip on Linux x86_64; run it when a pin changes.
`fetch` downloads every locked file into the cache (default $XDG_CACHE_HOME/iot-stack, override with
        IOT_STACK_CACHE) and verifies its sha256. Files already present and correct are not downloaded
        again, so a fresh clone reuses the cache. Source-only Python packages (pyspark) are built into
        wheels once, here on the host, so image builds never need PyPI.
`constraints` prints a pip constraints file (name==version) of every locked Python package;
        scripts/_venv.sh installs the development venv with it, so the venv runs the versions the images run.
`check-env` compares the running venv with the lock (`--sync` installs the locked version of every shared
        package that differs).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tooling.build import pins
from tooling.build.progress import log

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

# glibc of each Debian release the images can be built on: the newest manylinux
# wheels the images' pip accepts.
DEBIAN_GLIBC = {"bullseye": 31, "bookworm": 36, "trixie": 41}


def project_name(name: str) -> str:
    """PEP 503 normalised name: 'Cassandra_Driver' -> 'cassandra-driver'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_name_version(filename: str) -> tuple[str, str]:
    """'cassandra_driver-3.30.1-cp311-....whl' -> ('cassandra-driver', '3.30.1')."""
    match = _DIST_RE.match(filename)
    if not match:
        raise ArtifactError(f"cannot parse distribution file name '{filename}'")
    return project_name(match["name"]), match["version"]


def target_pip_args(versions: dict[str, str]) -> list[str]:
    """pip options that resolve for the images (CPython [versions].python, glibc of
    [versions].debian, x86_64), whatever Python and platform run the lock."""
    debian = versions["debian"]
    if debian not in DEBIAN_GLIBC:
        raise ArtifactError(f"unknown Debian release '{debian}' in [versions].debian: add its glibc to "
                            "tooling/build/artifacts.py DEBIAN_GLIBC")
    major, minor = versions["python"].split(".")[:2]
    # Newest first: pip prefers the earlier platform when a release has several wheels.
    platforms = [f"manylinux_2_{glibc}_x86_64" for glibc in range(DEBIAN_GLIBC[debian], 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    args = ["--only-binary=:all:", "--python-version", f"{major}.{minor}", "--implementation", "cp",
            "--abi", f"cp{major}{minor}"]
    for name in platforms:
        args += ["--platform", name]
    return args


@functools.cache
def _pypi_files(project: str) -> tuple[dict, ...]:
    request = urllib.request.Request(PYPI_SIMPLE.format(name=project),
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return tuple(json.load(resp)["files"])


def _pypi_url(filename: str, sha: str) -> str:
    project, _ = dist_name_version(filename)
    for item in _pypi_files(project):
        if item["filename"] == filename:
            if item["hashes"].get("sha256") != sha:
                raise ArtifactError(f"{filename}: sha256 differs from PyPI's record")
            return item["url"]
    raise ArtifactError(f"{filename} is not listed by PyPI for {project}")


def _sdist_only(requirement: str) -> dict | None:
    """The PyPI record of the source archive of a 'name==version' that has no wheel at all
    (pyspark), else None."""
    if "==" not in requirement:
        return None
    name, version = (part.strip() for part in requirement.split("==", 1))
    files = [f for f in _pypi_files(project_name(name)) if not f.get("yanked")]
    mine = [f for f in files if _DIST_RE.match(f["filename"]) and dist_name_version(f["filename"]) == (
        project_name(name), version)]
    if not mine or any(f["filename"].endswith(".whl") for f in mine):
        return None
    sdists = [f for f in mine if f["filename"].endswith(".tar.gz")]
    return sdists[0] if sdists else None


def _wheel_from_sdist(record: dict, find_links: Path) -> dict:
    """Fetch a source-only requirement into the cache, build its wheel there once (what
    `fetch` does) and offer that wheel to the binary-only resolution through find_links."""
    entry = {"file": record["filename"], "kind": "sdist", "url": record["url"], "sha256": record["hashes"]["sha256"]}
    _download(entry["url"], python_cache_path(entry), entry["sha256"], entry["file"])
    _build_sdist_wheels([entry])
    name, version = dist_name_version(entry["file"])
    built = sorted(built_wheel_dir().glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if not built:
        raise ArtifactError(f"building {entry['file']} left no wheel in {built_wheel_dir()}")
    find_links.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built[0], find_links / built[0].name)
    return entry


def _resolve_python(group: str, requirements: list[str], workdir: Path, versions: dict[str, str]) -> list[dict]:
    dest = workdir / f"py-{group}"
    built = workdir / f"built-{group}"
    # Wheels only, for the images' interpreter and platform (target_pip_args), so the lock
    # does not depend on the host's Python. A pinned package published only as source
    # (pyspark) is built into a wheel first and recorded in the lock as its sdist.
    sdists = {}
    for requirement in requirements:
        record = _sdist_only(requirement)
        if record:
            entry = _wheel_from_sdist(record, built)
            sdists[dist_name_version(entry["file"])] = entry
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(dest),
           *target_pip_args(versions)]
    if sdists:
        cmd += ["--find-links", str(built)]
    result = subprocess.run([*cmd, *requirements], capture_output=True, text=True)
    if result.returncode != 0:
        raise ArtifactError(f"pip could not resolve [python.{group}] {requirements} for CPython "
                            f"{versions['python']} manylinux x86_64 (a dependency without a wheel for the images "
                            f"must be pinned in [python.{group}] to be built from source):\n{result.stderr[-3000:]}")
    entries = []
    for path in sorted(dest.iterdir()):
        key = dist_name_version(path.name)
        if key in sdists:
            entries.append(sdists[key])
            continue
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
    if (platform.system(), platform.machine()) != ("Linux", "x86_64"):
        # pip resolves for the images' Python and wheel tags (target_pip_args), but it
        # evaluates markers such as sys_platform and platform_machine against this host.
        raise ArtifactError(f"lock on Linux x86_64, the images' platform (this host: {platform.system()} "
                            f"{platform.machine()}): pip evaluates environment markers against the host")
    started = time.monotonic()
    data: dict = {"maven": {}, "python": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for group, roots in pinned.maven_roots.items():
            log("lock", f"resolving [maven.{group}] {len(roots)} roots")
            overrides = pinned.maven_overrides.get(group, [])
            data["maven"][group] = _resolve_maven(group, roots, overrides, Path(tmp))
        for group, reqs in pinned.python_requirements.items():
            log("lock", f"resolving [python.{group}] {len(reqs)} requirements")
            data["python"][group] = _resolve_python(group, reqs, Path(tmp), pinned.versions)
    locked_python_versions(data)  # the python images must agree on every shared package
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


# ---------------------------------------------------------------- the development venv

def locked_python_versions(lock_data: dict) -> dict[str, str]:
    """{project: version} of every locked Python package, over all [python.<group>]s.
    The development venv shares packages with several images (the services' clients,
    the spark stack), so the images must agree on the version of each package."""
    versions: dict[str, str] = {}
    where: dict[str, str] = {}
    conflicts = []
    for group, entries in sorted(lock_data["python"].items()):
        for entry in entries:
            name, version = dist_name_version(entry["file"])
            if name not in versions:
                versions[name], where[name] = version, group
            elif versions[name] != version:
                conflicts.append(f"{name} {versions[name]} in [python.{where[name]}] but {version} in [python.{group}]")
    if conflicts:
        raise ArtifactError("the python images lock different versions of one package (pin one version in each "
                            "group of images/versions.toml, then `scripts/artifacts lock`): " + "; ".join(conflicts))
    return dict(sorted(versions.items()))


def constraints(lock_data: dict) -> str:
    """A pip constraints file: every locked Python package at its locked version."""
    lines = ["# Every Python package of images/artifacts.lock.json at its locked version (pip -c).",
             "# Made by `scripts/artifacts constraints`; scripts/_venv.sh installs .venv with it."]
    lines += [f"{name}=={version}" for name, version in locked_python_versions(lock_data).items()]
    return "\n".join(lines) + "\n"


def _same_version(installed: str, locked: str) -> bool:
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # a bare interpreter: file names and metadata both carry normalised versions
        return installed == locked
    try:
        return Version(installed) == Version(locked)
    except InvalidVersion:
        return installed == locked


def env_mismatches(lock_data: dict) -> tuple[int, list[tuple[str, str, str]]]:
    """The running interpreter against the lock: (how many installed packages the lock
    also holds, [(name, installed, locked), ...] for those at another version)."""
    locked = locked_python_versions(lock_data)
    seen: set[str] = set()
    differ = []
    for dist in importlib.metadata.distributions():
        if not dist.metadata["Name"]:
            continue
        name = project_name(dist.metadata["Name"])
        if name in seen or name not in locked:  # the first one on sys.path is the one imported
            continue
        seen.add(name)
        if not _same_version(dist.version, locked[name]):
            differ.append((name, dist.version, locked[name]))
    return len(seen), sorted(differ)


def _pip_constrained(args: list[str], lock_data: dict, what: str, offline: bool) -> None:
    with tempfile.NamedTemporaryFile("w", prefix="iot-stack-constraints-", suffix=".txt") as fh:
        fh.write(constraints(lock_data))
        fh.flush()
        links = [d for d in (cache_dir() / "python", built_wheel_dir()) if d.is_dir()]
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", fh.name,
               *(["--no-index"] if offline else [])]
        for directory in links:
            cmd += ["--find-links", str(directory)]
        result = subprocess.run([*cmd, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ArtifactError(f"cannot install {what} at the locked versions:\n{result.stderr[-2000:]}")


def check_env(lock_data: dict, sync: bool = False) -> None:
    """Every package this interpreter shares with the images is at its locked version;
    with sync, install the locked version of those that are not (from the cache first)."""
    shared, differ = env_mismatches(lock_data)
    if differ and sync:
        log("venv", "installing the locked version of " + ", ".join(f"{n} ({have} -> {want})"
                                                                  for n, have, want in differ))
        _pip_constrained([f"{n}=={want}" for n, _, want in differ], lock_data, "the venv's shared packages",
                         offline=False)
        shared, differ = env_mismatches(lock_data)
    if differ:
        raise ArtifactError(f"{sys.prefix} differs from images/artifacts.lock.json: "
                            + ", ".join(f"{n} {have} installed, {want} locked" for n, have, want in differ)
                            + " (`scripts/artifacts check-env --sync` installs the locked versions)")
    log("venv", f"{shared} packages shared with the images, all at their locked versions ({sys.prefix})")


def pip_install(group: str, pinned: pins.Pins, lock_data: dict) -> None:
    """Install one image's locked Python packages into the running interpreter, offline
    from the cache (the tests of the Spark jobs need the spark image's pyspark stack),
    with every dependency at its locked version (constraints from the lock)."""
    if group not in pinned.python_requirements:
        raise ArtifactError(f"unknown python group '{group}' (known: {', '.join(pinned.python_requirements)})")
    _pip_constrained(pinned.python_requirements[group], lock_data,
                     f"[python.{group}] from the cache (run `scripts/artifacts fetch`)", offline=True)
    log("fetch", f"installed [python.{group}] into {sys.prefix}")
    check_env(lock_data)


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
    constraints_p = sub.add_parser("constraints", help="print pip constraints: every locked Python package")
    constraints_p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    check_p = sub.add_parser("check-env", help="check that this venv runs the locked version of every package "
                                                "it shares with the images")
    check_p.add_argument("--sync", action="store_true", help="install the locked version of those that differ")
    args = parser.parse_args(argv)
    if args.command == "lock":
        lock(pins.load())
    elif args.command == "fetch":
        fetch(load_lock(), jobs=args.jobs)
    elif args.command == "pip-install":
        pip_install(args.group, pins.load(), load_lock())
    elif args.command == "constraints":
        text = constraints(load_lock())
        if args.output:
            args.output.write_text(text)
        else:
            sys.stdout.write(text)
    elif args.command == "check-env":
        check_env(load_lock(), sync=args.sync)
    else:
        print(cache_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
