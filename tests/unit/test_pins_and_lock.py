"""The pins file, the lock file and the artifact cache agree, and mistakes are named."""
from __future__ import annotations

import hashlib

import pytest

from tooling import artifacts, images, pins


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
    assert [i.name for i in images.with_parents(["kafka"])] == ["jre", "kafka"]


def test_unknown_image_is_named():
    with pytest.raises(SystemExit, match="unknown image 'kafak'"):
        images.with_parents(["kafak"])
