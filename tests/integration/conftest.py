"""Fixtures shared by the integration tests: a fresh Lab per test module."""
from __future__ import annotations

import pytest

from tooling.testbed.docker_lab import Lab, docker


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session", autouse=True)
def _engine_answers():
    result = docker("info", check=False)
    if result.returncode != 0:
        pytest.fail("no Docker engine answers: run `scripts/engine` (scripts/test does this for you)")


@pytest.fixture(scope="module")
def lab(request):
    lab = Lab()
    yield lab
    # Show what the containers said when anything in the module failed.
    if getattr(request.node, "_failed", False):
        print(lab.all_logs())
    lab.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.getparent(pytest.Module)._failed = True
    return report
