"""spark/README.md's tables of settings are exactly what the jobs declare, and the jobs read no other variable."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit import settings_docs

pytest.importorskip("pyspark")

SPARK = Path(__file__).resolve().parents[3] / "spark"


def documented() -> dict[str, str]:
    return settings_docs.blocks(settings_docs.SPARK_DOC.read_text(encoding="utf-8"))


def test_the_readme_has_a_table_for_the_common_settings_and_each_job():
    assert set(documented()) == {"common", *settings_docs.SPARK_JOBS}


@pytest.mark.parametrize("table", ["common", *settings_docs.SPARK_JOBS])
def test_each_table_lists_exactly_the_declared_variables_with_their_defaults(table):
    expected = settings_docs.spark_tables()[table]
    assert re.findall(r"^\| `([\w<>]+)` ", documented()[table], re.M) == \
        re.findall(r"^\| `([\w<>]+)` ", expected, re.M)
    assert documented()[table] == expected, \
        f"spark/README.md's {table} table is out of date: run python -m tests.unit.settings_docs"


def test_a_job_declares_each_variable_once_and_none_of_the_common_ones():
    options = settings_docs.spark_options()
    common = {o.env for o in options["common"]}
    for job in settings_docs.SPARK_JOBS:
        variables = [o.env for o in options[job]]
        assert len(variables) == len(set(variables)) and not common & set(variables), job


# Where spark/ may read the environment other than through an Option: the KAFKA_OPTION_* family and
# PYSPARK_GATEWAY_PORT (set by spark-submit, not a setting).
RAW_READS = {("iot_jobs/runtime.py", "for name, value in os.environ.items():"),
             ("iot_jobs/runtime.py", 'if os.environ.get("PYSPARK_GATEWAY_PORT") is None:')}


def test_the_jobs_read_the_environment_only_through_options():
    raw = {(path.relative_to(SPARK).as_posix(), line.strip())
           for path in SPARK.rglob("*.py")
           for line in path.read_text(encoding="utf-8").splitlines()
           if re.search(r"os\.environ|getenv|settings\.env\(|\benv\(", line)}
    assert raw == RAW_READS


def test_every_option_used_by_a_job_is_in_its_table():
    """Each settings.value(X) / Source.from_env(X) in a job's module names an Option of its table (or a common one)."""
    for job in settings_docs.SPARK_JOBS:
        module = settings_docs.spark_job(job)
        declared = {*settings_docs.spark_options()[job], *settings_docs.spark_options()["common"]}
        source = Path(module.__file__).read_text(encoding="utf-8")
        used = re.findall(r"(?:settings\.value|Source\.from_env)\(([\w.]+)\)", source)
        assert used, job
        for name in used:
            target = getattr(module.runtime, name.removeprefix("runtime."), None) if name.startswith("runtime.") \
                else getattr(module, name)
            for option in target if isinstance(target, tuple) else (target,):
                assert option in declared, (job, name)
