"""The base image is taken by the id recorded when it was made, not by a tag anything may overwrite
(tooling/build/base.py)."""
from __future__ import annotations

import pytest

from tooling.build import base, images, pins

TAG = "debian:bookworm-slim"
MADE = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def engine(**refs):
    return lambda ref: refs.get(ref)


def test_the_first_use_records_the_tags_id(tmp_path):
    record = tmp_path / "base-image.id"
    assert base.resolve(TAG, record, engine(**{TAG: MADE, MADE: MADE})) == (MADE, None)
    assert record.read_text() == f"{TAG} {MADE}\n"


def test_a_tag_overwritten_later_is_named_and_not_built_from(tmp_path):
    record = tmp_path / "base-image.id"
    base.resolve(TAG, record, engine(**{TAG: MADE, MADE: MADE}))
    image, warning = base.resolve(TAG, record, engine(**{TAG: OTHER, MADE: MADE, OTHER: OTHER}))
    assert image == MADE
    assert f"{TAG} now names {OTHER[:19]}" in warning and "scripts/base-image --renew" in warning
    assert record.read_text() == f"{TAG} {MADE}\n"       # the record is only renewed on purpose


def test_a_recorded_base_gone_from_the_engine_says_how_to_renew(tmp_path):
    record = tmp_path / "base-image.id"
    record.write_text(f"{TAG} {MADE}\n")
    with pytest.raises(base.BaseImageError, match=r"is gone from the engine: run `scripts/base-image --renew`"):
        base.resolve(TAG, record, engine(**{TAG: OTHER, OTHER: OTHER}))


def test_no_base_at_all_says_how_to_make_one(tmp_path):
    with pytest.raises(base.BaseImageError, match=r"bookworm-slim is missing: run `scripts/base-image`"):
        base.resolve(TAG, tmp_path / "base-image.id", engine())


def test_a_record_for_another_tag_is_not_used(tmp_path):
    record = tmp_path / "base-image.id"
    record.write_text(f"debian:trixie-slim {OTHER}\n")
    assert base.resolve(TAG, record, engine(**{TAG: MADE, MADE: MADE, OTHER: OTHER})) == (MADE, None)
    assert record.read_text() == f"{TAG} {MADE}\n"


def test_the_root_image_is_built_from_the_id():
    pinned = pins.load()
    passed = dict(arg.split("=", 1) for arg in images.build_args(pinned, MADE)[1::2])
    assert passed["BASE_IMAGE"] == MADE
    assert images._parent_ref(images.BY_NAME["runtime"], pinned, MADE) == MADE
    assert images._parent_ref(images.BY_NAME["jre"], pinned, MADE) == images.tag("runtime", pinned)
