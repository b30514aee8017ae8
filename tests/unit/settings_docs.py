"""The docs' tables of settings, made from the declarations (services.common.settings.markdown_table).

A table sits between `<!-- settings: NAME -->` and `<!-- /settings -->` in its file: docs/settings.md holds
the services' (service_tables), spark/README.md the Spark jobs' (spark_tables, which imports pyspark).
tests/unit/test_settings_documented.py and tests/unit/spark/test_settings_documented.py fail when a table
differs from its declarations; `python -m tests.unit.settings_docs` writes them again."""
from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path

from services.common.settings import Option, markdown_table

REPO = Path(__file__).resolve().parents[2]
SERVICES_DOC = REPO / "docs" / "settings.md"
SPARK_DOC = REPO / "spark" / "README.md"
BLOCK = re.compile(r"(<!-- settings: (?P<name>[\w-]+) -->\n)(?P<table>.*?)(<!-- /settings -->)", re.S)
SPARK_JOBS = ("threshold-detector", "rollups", "notifier")


def service_tables() -> dict[str, str]:
    from services.adapter import settings as adapter
    from services.bridge import settings as bridge
    from services.mosquitto_agent import settings as agent
    return {"iot-bridge": markdown_table(bridge.OPTIONS), "iot-cassandra-adapter": markdown_table(adapter.OPTIONS),
            "iot-mosquitto-agent": markdown_table(agent.OPTIONS)}


def spark_job(job: str):
    """The module spark/jobs/<job>.py (it puts spark/ on sys.path for iot_jobs)."""
    name = f"spark_job_{job.replace('-', '_')}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "spark" / "jobs" / f"{job.replace('-', '_')}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def spark_options() -> dict[str, tuple[Option, ...]]:
    """The Spark jobs' settings: "common" (runtime.COMMON_OPTIONS) and each job's OPTIONS."""
    runtime = spark_job("rollups").runtime
    return {"common": runtime.COMMON_OPTIONS, **{job: spark_job(job).OPTIONS for job in SPARK_JOBS}}


def spark_tables() -> dict[str, str]:
    tables = {name: markdown_table(options) for name, options in spark_options().items()}
    prefix = spark_job("rollups").runtime.KAFKA_OPTION_PREFIX
    tables["common"] += (f"| `{prefix}<NAME>` | unset | any Kafka client option: `{prefix}SECURITY_PROTOCOL=SSL` "
                         "sets `kafka.security.protocol=SSL` (the name lower case, `_` -> `.`) |\n")
    return tables


def blocks(text: str) -> dict[str, str]:
    """The tables of a file by name."""
    return {m["name"]: m["table"] for m in BLOCK.finditer(text)}


def render(text: str, tables: dict[str, str]) -> str:
    """`text` with each named block's table replaced by tables[name] (a block of another name is kept)."""
    return BLOCK.sub(lambda m: m[1] + tables.get(m["name"], m["table"]) + m[4], text)


def write(path: Path, tables: Callable[[], dict[str, str]]) -> bool:
    text = path.read_text(encoding="utf-8")
    new = render(text, tables())
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    for doc, tables in ((SERVICES_DOC, service_tables), (SPARK_DOC, spark_tables)):
        print(f"{doc.relative_to(REPO)}: {'written' if write(doc, tables) else 'up to date'}")
