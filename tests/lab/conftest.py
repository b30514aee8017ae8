"""The lab tests: the real multi-site lab from `scripts/lab up`, checked from outside.

The session brings the lab up once (reusing a running lab when IOT_LAB_REUSE=1)
and takes it down at the end unless IOT_LAB_KEEP=1, also when bringing it up or
a test failed. Modules run in name order: hosts, end to end, idempotence, add-site.

`-m "smoke and not slow"` picks the lab smoke that `scripts/test` runs by default: readings
counted at every site, a hot sensor's events at the datacenter, the access checks, a second
site.yml run without changes; `-m smoke` adds the slow cases. When a lab test fails, every site's
services are printed with the tasks and last log lines of those not fully running.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tooling.lab import cpu, lab, settle

REPO = lab.pins.REPO_ROOT
# testinfra's ansible backend calls ansible-inventory/ansible from PATH.
os.environ["PATH"] = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"


LAB_UP_TIMEOUT_S = 3600     # scripts/lab up, run in the first lab test's setup (15-20 minutes in a fresh CI lab)


def pytest_configure(config):
    config.addinivalue_line("markers", "smoke: the lab smoke that scripts/test runs by default")
    config.addinivalue_line("markers", "slow: a smoke module's case that waits minutes; scripts/test leaves it out")


@pytest.hookimpl(trylast=True)        # after -m and -k have deselected
def pytest_collection_modifyitems(config, items):
    """pytest-timeout counts a test's fixture setup: the first test to need the lab also waits for `scripts/lab up`
    and its warm-up, so it gets their budgets on top of its own (else the 900 s default fires inside whichever test
    comes first)."""
    first = next((item for item in items if "lab_hosts" in getattr(item, "fixturenames", ())), None)
    if first is None:
        return
    marker = first.get_closest_marker("timeout")
    own = float(marker.args[0]) if marker and marker.args else float(config.getini("timeout") or 900)
    budget = own + LAB_UP_TIMEOUT_S + settle.LIMIT_S
    first.add_marker(pytest.mark.timeout(budget), append=False)   # the closest marker wins


STEPS: list[tuple[str, float, int]] = []     # (scripts/lab command, seconds, exit status), for the summary
CPU_TABLES: list[str] = []                    # where the lab's CPU went at the end of the warm-up wait


def run_lab(*args: str, timeout: float = LAB_UP_TIMEOUT_S) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "tooling.lab.lab", *args], cwd=REPO, capture_output=True,
                            text=True, timeout=timeout)
    STEPS.append((f"scripts/lab {' '.join(args)}", time.monotonic() - started, result.returncode))
    sys.stderr.write(result.stderr[-20000:])
    assert result.returncode == 0, f"scripts/lab {' '.join(args)} failed:\n{result.stderr[-5000:]}"
    return result


def pytest_terminal_summary(terminalreporter):
    """The lab's own steps next to pytest's --durations: where the time went."""
    if STEPS:
        terminalreporter.section("lab steps")
        for step, seconds, code in STEPS:
            terminalreporter.write_line(f"{seconds:7.0f}s  {step}" + (f"  (exit {code})" if code else ""))
    for text in CPU_TABLES:
        terminalreporter.section("lab CPU")
        terminalreporter.write_line(text)
    for diagnosis in DIAGNOSES:
        terminalreporter.section("lab diagnosis")
        terminalreporter.write_line(diagnosis)


DIAGNOSES: list[str] = []


def print_diagnosis(why: str) -> None:
    """Services of every site, with tasks and logs of the failing ones: in the failing test's output and the summary."""
    hosts = lab.existing_hosts()
    if not hosts:
        return
    try:
        report = lab.diagnose(hosts)
    except Exception as err:  # noqa: BLE001 - a diagnosis must never hide the failure it explains
        report = f"(diagnosis failed: {err})"
    ansible_log = lab.lab_dir() / "ansible.log"     # where a playbook that ran out of time stood
    if ansible_log.exists():
        report += "\nlast lines of " + str(ansible_log) + ":\n" + "\n".join(ansible_log.read_text().splitlines()[-25:])
    DIAGNOSES.append(f"{why}; the lab's services:\n{report}")
    print(f"\n[lab] {DIAGNOSES[-1]}", file=sys.stderr, flush=True)    # in the failing test's captured output


def settle_lab() -> None:
    """Wait (at most settle.LIMIT_S) for the lab's JVMs to warm up before the first test (tooling/lab/settle.py), and
    say where the lab's CPU went in the wait's last minute (tooling/lab/cpu.py)."""
    problems: list[str] = []        # the CPU table only informs: a failure to read it never fails the lab tests

    def measuring(step):
        try:
            return step()
        except Exception as err:  # noqa: BLE001 - see above
            problems.append(f"{type(err).__name__}: {err}")
            return None

    last_minute = measuring(lambda: cpu.LastMinute(cpu.containers(lab.existing_hosts())))

    def load() -> float:
        if last_minute is not None and not problems:
            measuring(last_minute.take)
        return os.getloadavg()[0]

    result = settle.wait_until_calm(load=load)
    text = None
    if last_minute is not None and not problems:
        measuring(last_minute.take)
        text = measuring(last_minute.table)
    text = text or f"lab CPU not measured: {problems[0] if problems else 'the wait ended before two samples'}"
    CPU_TABLES.append(text)
    print(f"[lab] {text}", file=sys.stderr, flush=True)
    STEPS.append(("wait for the lab to warm up (" + result.describe() + ")", result.waited_s, 0))
    print(f"[lab] {result.describe()}", file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def lab_hosts():
    keep = os.environ.get("IOT_LAB_KEEP") == "1"
    reuse = os.environ.get("IOT_LAB_REUSE") == "1" and lab.existing_hosts()
    if not reuse:
        run_lab("down")
        try:
            # scripts/test built everything already; tests/lab/test_2_status.py checks the status table
            run_lab("up", "--no-build", "--no-status")
        except BaseException:
            print_diagnosis("scripts/lab up failed")
            if not keep:
                run_lab("down")
            raise
    settle_lab()
    yield lab.existing_hosts()
    if not keep:
        run_lab("down")


@pytest.fixture(scope="session")
def inventory(lab_hosts):
    return lab.lab_dir() / "inventory"


_diagnosed: list[bool] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed and call.when == "call" and not _diagnosed:
        _diagnosed.append(True)      # once per session: the first failure is the one to explain
        print_diagnosis(f"{item.nodeid} failed")
    return report
