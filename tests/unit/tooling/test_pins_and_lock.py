"""The pins file, the lock file and the artifact cache agree, and mistakes are named."""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tomllib
from collections import defaultdict

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule as CoreFilters
from packaging.requirements import Requirement

import deploy
from deploy.images import from_toml
from tooling.build import artifacts, images, pins
from tooling.testbed.stack_render import group_vars


def test_every_maven_root_is_locked_at_its_pinned_version():
    pinned, lock = pins.load(), artifacts.load_lock()
    for group, roots in pinned.maven_roots.items():
        locked = {e["coord"] for e in lock["maven"][group]}
        for root in roots:
            assert root in locked, f"{root} is pinned but not locked: run `scripts/artifacts lock`"


def test_every_python_requirement_is_locked_at_its_pinned_version():
    pinned, lock = pins.load(), artifacts.load_lock()
    for group, requirements in pinned.python_requirements.items():
        locked = {}
        for entry in lock["python"][group]:
            match = artifacts._DIST_RE.match(entry["file"])
            locked[match["name"].lower().replace("_", "-")] = match["version"]
        for requirement in requirements:
            name, version = requirement.split("==")
            assert locked.get(name) == version, f"{requirement} is pinned but the lock has {locked.get(name)}"


def _locked_python(lock: dict) -> dict[str, dict[str, str]]:
    """{project: {group: version}}, read from the file names without tooling's parser."""
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for group, entries in lock["python"].items():
        for entry in entries:
            name, version = entry["file"].removesuffix(".tar.gz").split("-")[:2]
            found[re.sub(r"[-_.]+", "-", name).lower()][group] = version
    return found


def test_constraints_pin_exactly_the_locked_versions():
    lock = artifacts.load_lock()
    lines = [line for line in artifacts.constraints(lock).splitlines() if line and not line.startswith("#")]
    constrained = dict(line.split("==") for line in lines)
    assert len(constrained) == len(lines), "a package is constrained twice"
    assert {name: {version} for name, version in constrained.items()} == {
        name: set(groups.values()) for name, groups in _locked_python(lock).items()}


def test_constraints_name_a_package_the_python_images_disagree_on():
    lock = {"python": {"a": [{"file": "geomet-0.2.1.post1-py3-none-any.whl"}],
                       "b": [{"file": "geomet-1.1.0-py3-none-any.whl"}]}}
    with pytest.raises(SystemExit, match=r"geomet 0\.2\.1\.post1 in \[python\.a\] but 1\.1\.0 in \[python\.b\]"):
        artifacts.constraints(lock)


def test_python_images_lock_one_version_of_each_package():
    locked = _locked_python(artifacts.load_lock())
    driver = locked["cassandra-driver"]
    assert {"services", "cassandra"} <= set(driver), "the services and cqlsh both use cassandra-driver"
    assert len(set(driver.values())) == 1, f"cassandra-driver differs between the images: {driver}"
    differ = {name: groups for name, groups in locked.items() if len(set(groups.values())) > 1}
    assert not differ, f"one package, several versions across the python images: {differ}"


def test_each_image_locks_one_version_of_each_maven_artifact():
    for group, entries in artifacts.load_lock()["maven"].items():
        versions: dict[str, set[str]] = defaultdict(set)
        for entry in entries:
            parts = entry["coord"].split(":")
            versions[f"{parts[0]}:{parts[1]}"].add(parts[-1])
        twice = {artifact: sorted(v) for artifact, v in versions.items() if len(v) > 1}
        assert not twice, f"[maven.{group}] has artifacts in two versions (a classpath conflict): {twice}"


def test_kafka_image_runs_the_pinned_zookeeper_and_netty():
    pinned, lock = pins.load(), artifacts.load_lock()
    coords = [entry["coord"] for entry in lock["maven"]["kafka"]]
    zookeeper = pinned.versions["zookeeper"]
    assert sorted(c for c in coords if c.startswith("org.apache.zookeeper:")) == [
        f"org.apache.zookeeper:zookeeper-jute:{zookeeper}", f"org.apache.zookeeper:zookeeper:{zookeeper}"]
    netty = [c for c in coords if c.startswith("io.netty:")]
    assert netty and all(c.endswith(":" + pinned.versions["netty"]) for c in netty), netty
    # Each one by its override, not by luck: a netty artifact Kafka adds later must be listed too.
    overridden = {":".join(c.split(":")[:2]) for c in pinned.maven_overrides["kafka"]}
    missing = {":".join(c.split(":")[:2]) for c in netty} - overridden
    assert not missing, f"netty artifacts without an override in [maven.kafka]: {missing}"


def test_every_maven_override_is_locked():
    pinned, lock = pins.load(), artifacts.load_lock()
    for group, overrides in pinned.maven_overrides.items():
        locked = {entry["coord"] for entry in lock["maven"][group]}
        for override in overrides:
            assert override in locked, f"[maven.{group}] override {override} is not in the lock: unused, or relock"


def _wheel_fits_the_images(filename: str, python: str, glibc: int) -> bool:
    python_tags, abi, platform_tags = filename.removesuffix(".whl").split("-")[-3:]
    major, minor = python.split(".")
    cpython = f"cp{major}{minor}"
    fits_python = any(
        tag in (cpython, f"py{major}", f"py{major}{minor}")
        or (abi == "abi3" and re.fullmatch(rf"cp{major}(\d+)", tag) and int(tag[3:]) <= int(minor))
        for tag in python_tags.split("."))

    def fits_platform(tag: str) -> bool:
        manylinux = re.fullmatch(r"manylinux_2_(\d+)_x86_64", tag)
        return tag in ("any", "manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64") or bool(
            manylinux and int(manylinux[1]) <= glibc)

    return fits_python and abi in (cpython, "abi3", "none") and any(fits_platform(t) for t in platform_tags.split("."))


def test_python_lock_holds_wheels_for_the_images_python_and_platform():
    pinned, lock = pins.load(), artifacts.load_lock()
    glibc = artifacts.DEBIAN_GLIBC[pinned.versions["debian"]]
    for group, entries in lock["python"].items():
        for entry in entries:
            if entry["kind"] == "wheel":
                assert _wheel_fits_the_images(entry["file"], pinned.versions["python"], glibc), (
                    f"[python.{group}] {entry['file']} does not install on CPython {pinned.versions['python']} "
                    f"manylinux x86_64 (glibc 2.{glibc})")


def test_lock_resolves_for_the_images_not_for_the_host(monkeypatch, tmp_path):
    """pip download gets the images' interpreter and platform, whatever Python runs the lock."""
    seen = []

    def run(cmd, **kwargs):
        seen.append(cmd)
        (tmp_path / "py-g").mkdir()
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(artifacts, "_sdist_only", lambda requirement: None)
    monkeypatch.setattr(artifacts.subprocess, "run", run)
    artifacts._resolve_python("g", ["thing==1.0"], tmp_path, {"debian": "bookworm", "python": "3.11"})
    command = " ".join(seen[0])
    for wanted in ("--only-binary=:all:", "--python-version 3.11", "--implementation cp", "--abi cp311",
                   "--platform manylinux_2_36_x86_64", "--platform manylinux2014_x86_64"):
        assert wanted in command
    assert "manylinux_2_37" not in command and "--prefer-binary" not in command
    platforms = [seen[0][i + 1] for i, arg in enumerate(seen[0]) if arg == "--platform"]
    assert all(p.endswith("_x86_64") for p in platforms)


def test_unknown_debian_release_is_named():
    with pytest.raises(SystemExit, match="unknown Debian release 'sid'"):
        artifacts.target_pip_args({"debian": "sid", "python": "3.11"})


def _pyproject() -> dict:
    with (pins.REPO_ROOT / "pyproject.toml").open("rb") as fh:
        return tomllib.load(fh)


def test_pyproject_ranges_admit_the_locked_versions():
    locked = artifacts.locked_python_versions(artifacts.load_lock())
    for dependency in _pyproject()["project"]["dependencies"]:
        requirement = Requirement(dependency)
        version = locked.get(artifacts.project_name(requirement.name))
        assert version, f"{requirement.name} is a runtime dependency but not in the services lock"
        assert requirement.specifier.contains(version), f"pyproject.toml's {dependency} excludes the locked {version}"


def test_ruff_is_pinned_exactly():
    dev = _pyproject()["project"]["optional-dependencies"]["dev"]
    assert [d for d in dev if re.fullmatch(r"ruff==[0-9.]+", d)], f"pin ruff exactly in the dev extra: {dev}"


def test_venv_is_installed_with_the_lock_and_remade_when_it_changes():
    text = (pins.REPO_ROOT / "scripts" / "_venv.sh").read_text()
    assert "tooling.build.artifacts constraints" in text
    assert '-c "$venv/constraints.txt"' in text
    assert re.search(r"want=.*\$constraints", text), "the venv's stamp must cover the lock's constraints"


def test_the_venv_runs_the_locked_versions():
    """pip freeze of the running venv against the lock, for every package they share."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("not running in a venv")
    shared, differ = artifacts.env_mismatches(artifacts.load_lock())
    assert shared, "no locked package is installed: is this the project's venv?"
    assert not differ, (f"{sys.prefix} runs other versions than the images: {differ} "
                        "(source scripts/_venv.sh, or `scripts/artifacts check-env --sync`)")


def test_cassandra_image_names_only_locked_jars():
    locked = {artifacts.maven_path(e["coord"]).rsplit("/", 1)[1] for e in artifacts.load_lock()["maven"]["cassandra"]}
    folder = pins.REPO_ROOT / "images" / "cassandra"
    named = {(path.relative_to(folder), jar) for path in folder.rglob("*") if path.is_file()
             for jar in re.findall(r"/opt/cassandra/lib/([\w.-]+\.jar)", path.read_text())}
    assert named, "images/cassandra names no jar (the jamm agent, cassandra-all)"
    stale = sorted(f"{path}: {jar}" for path, jar in named if jar not in locked)
    assert not stale, f"images/cassandra names jars the lock does not hold (version bump?): {stale}"


def test_kafka_line_keeps_zookeeper_mode():
    major, minor, _ = pins.load().versions["kafka"].split(".")
    assert (int(major), int(minor)) == (3, 9), "Kafka 4 dropped ZooKeeper; the design needs 3.9.x"


def test_unknown_placeholder_names_the_missing_version(tmp_path):
    bad = tmp_path / "versions.toml"
    bad.write_text('[versions]\nkafka = "3.9.2"\n[base]\nimage = "debian:bookworm-slim"\nmirror = "m"\n'
                   '[maven.kafka]\nroots = ["org.apache.kafka:kafka_{scala}:{kafka}"]\n')
    with pytest.raises(SystemExit, match=r"\[maven.kafka\] uses \{scala\}.*add it to \[versions\]"):
        pins.load(bad)


@pytest.mark.parametrize("coord, path", [
    ("org.apache.kafka:kafka_2.13:3.9.2", "org/apache/kafka/kafka_2.13/3.9.2/kafka_2.13-3.9.2.jar"),
    ("io.netty:netty-transport-native-epoll:linux-x86_64:4.1.105.Final",
     "io/netty/netty-transport-native-epoll/4.1.105.Final/netty-transport-native-epoll-4.1.105.Final-linux-x86_64.jar"),
])
def test_maven_path(coord, path):
    assert artifacts.maven_path(coord) == path


def test_bad_maven_coordinate_is_named():
    with pytest.raises(SystemExit, match="bad Maven coordinate 'nonsense'"):
        artifacts.maven_path("nonsense")


def test_checksum_mismatch_stops_and_names_the_artifact(tmp_path):
    source = tmp_path / "thing.jar"
    source.write_bytes(b"not what was locked")
    dest = tmp_path / "cache" / "thing.jar"
    with pytest.raises(SystemExit, match="checksum mismatch for org.example:thing:1.0"):
        artifacts._download(source.as_uri(), dest, "0" * 64, "org.example:thing:1.0")
    assert not dest.exists(), "a file that failed verification must not enter the cache"


def test_missing_artifact_stops_and_names_it(tmp_path):
    with pytest.raises(SystemExit, match="cannot download org.example:gone:1.0"):
        artifacts._download((tmp_path / "gone.jar").as_uri(), tmp_path / "c" / "gone.jar", "0" * 64,
                            "org.example:gone:1.0")


def test_verified_download_is_not_repeated(tmp_path):
    source = tmp_path / "ok.jar"
    source.write_bytes(b"locked bytes")
    sha = hashlib.sha256(b"locked bytes").hexdigest()
    dest = tmp_path / "cache" / "ok.jar"
    assert artifacts._download(source.as_uri(), dest, sha, "ok") is True
    assert artifacts._download(source.as_uri(), dest, sha, "ok") is False
    assert dest.read_bytes() == b"locked bytes"


def test_cache_dir_follows_override_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("IOT_STACK_CACHE", str(tmp_path / "explicit"))
    assert artifacts.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("IOT_STACK_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert artifacts.cache_dir() == tmp_path / "xdg" / "iot-stack"


def test_images_are_built_after_their_parents():
    order = [image.name for image in images.IMAGES]
    for image in images.IMAGES:
        if image.parent:
            assert order.index(image.parent) < order.index(image.name)


def test_selecting_an_image_brings_its_parent():
    assert [i.name for i in images.with_parents(["kafka"])] == ["runtime", "jre", "kafka"]
    assert [i.name for i in images.with_parents(["mosquitto"])] == ["runtime", "mosquitto"]


def _dockerfile(image: images.Image) -> str:
    return (pins.REPO_ROOT / "images" / image.name / "Dockerfile").read_text()


def test_runtime_is_the_only_image_built_from_the_debian_base():
    assert [image.name for image in images.IMAGES if image.parent is None] == ["runtime"]


@pytest.mark.parametrize("image", images.IMAGES, ids=lambda image: image.name)
def test_dockerfile_builds_from_the_parent_the_build_passes(image):
    pinned = pins.load()
    passed = dict(arg.split("=", 1) for arg in images.build_args(pinned)[1::2])
    text = _dockerfile(image)
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    froms = re.findall(r"^FROM (.*)$", text, re.M)
    assert froms, f"{image.name}: no FROM"
    for line in froms:
        match = re.fullmatch(r"\$\{(\w+)\}( AS \w+)?", line)
        assert match, f"{image.name}: FROM {line} must name its parent through a build argument"
        arg = match[1]
        assert passed.get(arg) == images._parent_ref(image, pinned), f"{image.name}: FROM ${{{arg}}}"
        # The build always passes the real reference; the default only serves a hand-run `docker build`.
        wanted = pinned.base_image if image.parent is None else f"{images.PREFIX}/{image.parent}:dev"
        assert defaults.get(arg) == wanted, f"{image.name}: ARG {arg} default"


@pytest.mark.parametrize("image", [i for i in images.IMAGES if i.name != "runtime"], ids=lambda image: image.name)
def test_only_the_runtime_image_creates_the_user_and_installs_tini(image):
    text = "\n".join(line for line in _dockerfile(image).splitlines() if not line.lstrip().startswith("#"))
    repeats = ["useradd", "groupadd", "tini ", "ca-certificates", "apt-get install", "org.opencontainers.image.source"]
    if image.name == "lab-host":        # a server stand-in: its `deployer` is an SSH login, not the services' user
        repeats.remove("useradd")
    for repeated in repeats:
        assert repeated not in text, f"images/{image.name}/Dockerfile repeats what images/runtime provides: {repeated}"


# Files that hold versions of their own, which may equal the images' tag by
# coincidence: pyproject.toml's [project] version is the Python package's version
# (today the same number, yet not the images' tag), and the lock file holds
# third-party artifacts' versions.
OWN_VERSIONS = {"images/versions.toml", "pyproject.toml", "images/artifacts.lock.json"}


def test_images_version_is_written_only_in_versions_toml():
    version = pins.load().versions["images"]
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=pins.REPO_ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    pattern = re.compile(rb"(?<![0-9.])" + re.escape(version.encode()) + rb"(?!\.?[0-9])")
    found = []
    for name in listed.stdout.decode().split("\0"):
        path = pins.REPO_ROOT / name
        if not name or name in OWN_VERSIONS or not path.is_file():
            continue
        for number, line in enumerate(path.read_bytes().splitlines(), start=1):
            if pattern.search(line):
                found.append(f"{name}:{number}")
    assert not found, (f"the images' version {version} is written outside images/versions.toml "
                       f"(read it through tooling/build/pins.py or Ansible's iot_image_tag): {found}")


def test_ansible_reads_the_image_tag_from_versions_toml():
    """iot_image_tag (ansible/group_vars/all) evaluates to versions.toml's tag, as the
    playbooks in ansible/ see it, and every role's image default derives from it."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(CoreFilters().filters())
    env.filters.update(deploy.filters())
    env.globals["lookup"] = lambda plugin, path: open(path).read()  # ansible.builtin.file
    expression = group_vars()["iot_image_tag"]
    tag = env.from_string(expression).render(playbook_dir=str(pins.REPO_ROOT / "ansible"))
    assert tag == pins.load().versions["images"]
    for role, names in (("images", ["images_tag"]), ("stack", ["stack_image_tag"]), ("topics", ["topics_image"]),
                        ("health", ["health_kafka_image", "health_cassandra_image"])):
        defaults = yaml.safe_load((pins.REPO_ROOT / "ansible/roles" / role / "defaults/main.yml").read_text())
        for name in names:
            assert "{{ iot_image_tag }}" in defaults[name], f"{role} role: {name} must derive from iot_image_tag"


def test_bad_toml_is_named():
    with pytest.raises(Exception, match="not valid TOML"):
        from_toml("[versions\n")


def test_unknown_image_is_named():
    with pytest.raises(SystemExit, match="unknown image 'kafak'"):
        images.with_parents(["kafak"])
