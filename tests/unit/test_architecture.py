"""Import rules between the packages, read from the source with `ast` (no code is imported).

Every import statement counts, including ones nested in functions: a lazy import is
still a dependency. One test case per rule; a failure names the file, the line and
the offending import.

  services.common   standard library only, no other services package
  services.mqtt     services.common
  services.bridge   services.common, services.mqtt
  services.adapter  services.common
  services.mosquitto_agent  services.common, services.mqtt
  services.commands    services.common
  spark/            services.common (the Spark image installs no other services package)
  services/, tooling/  never `tests`; deploy/ and tooling/build/: see RULES
  tooling/          no import cycles between its modules
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Each tree and the directory its module names are relative to (spark jobs run with spark/ on sys.path).
TREES = {"services": REPO, "tooling": REPO, "deploy": REPO, "spark": REPO / "spark"}


@dataclass(frozen=True)
class Import:
    file: str       # repo-relative path
    line: int
    target: str     # absolute dotted module name
    statement: str  # the statement as written

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: `{self.statement}` (imports {self.target})"


def module_name(path: Path) -> str:
    tree = path.relative_to(REPO).parts[0]
    parts = list(path.relative_to(TREES[tree]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def source_files() -> tuple[Path, ...]:
    return tuple(sorted(p for tree in TREES for p in (REPO / tree).rglob("*.py") if "__pycache__" not in p.parts))


@cache
def known_modules() -> frozenset[str]:
    return frozenset(module_name(p) for p in source_files())


def _resolve_relative(path: Path, level: int, module: str | None) -> str:
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    base = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join([*base, module] if module else base)


@cache
def imports_of(path: Path) -> tuple[Import, ...]:
    """Every import in the file, each as the module it loads: `from a import b` is a.b when a.b is a module."""
    rel = str(path.relative_to(REPO))
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
        statement = ast.unparse(node) if isinstance(node, ast.Import | ast.ImportFrom) else ""
        if isinstance(node, ast.Import):
            found += [Import(rel, node.lineno, alias.name, statement) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(path, node.level, node.module) if node.level else node.module
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.append(Import(rel, node.lineno, target if target in known_modules() else base, statement))
    return tuple(sorted(set(found), key=lambda i: (i.line, i.target)))


def files_under(*dirs: str) -> list[Path]:
    return [p for p in source_files() if any(p.is_relative_to(REPO / d) for d in dirs)]


def within(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def services_package(target: str) -> str | None:
    """services.bridge.app -> services.bridge; a non-services import -> None."""
    parts = target.split(".")
    return ".".join(parts[:2]) if parts[0] == "services" else None


@dataclass(frozen=True)
class Rule:
    name: str
    dirs: tuple[str, ...]
    allowed_services: frozenset[str] | None   # services packages it may import (None: not checked)
    stdlib_only: bool = False
    forbidden: tuple[str, ...] = ()           # top-level packages it must never import

    def violations(self) -> list[str]:
        bad = []
        for path in files_under(*self.dirs):
            for imp in imports_of(path):
                package = services_package(imp.target)
                if self.allowed_services is not None and package is not None \
                        and package not in self.allowed_services:
                    bad.append(f"{imp}: {self.name} may import only {', '.join(sorted(self.allowed_services))}")
                elif self.stdlib_only and package is None \
                        and imp.target.split(".")[0] not in sys.stdlib_module_names:
                    bad.append(f"{imp}: {self.name} may import only the standard library")
                elif any(within(imp.target, f) for f in self.forbidden):
                    bad.append(f"{imp}: {self.name} must not import {', '.join(self.forbidden)}")
        return bad


def _services_rule(package: str, *others: str, stdlib_only: bool = False) -> Rule:
    return Rule(f"services.{package}", (f"services/{package}",),
                frozenset({f"services.{package}", *(f"services.{o}" for o in others)}), stdlib_only)


RULES = [
    _services_rule("common", stdlib_only=True),
    _services_rule("mqtt", "common"),
    _services_rule("bridge", "common", "mqtt"),
    _services_rule("adapter", "common"),
    _services_rule("mosquitto_agent", "common", "mqtt"),
    _services_rule("commands", "common"),
    Rule("spark", ("spark",), frozenset({"services.common"})),
    Rule("services and tooling", ("services", "tooling"), None, forbidden=("tests",)),
    # What the playbooks load on the controller: the filters (deploy/) and the image build (tooling/build/).
    Rule("deploy", ("deploy",), frozenset({"services.common"}), forbidden=("tooling", "tests")),
    Rule("tooling.build", ("tooling/build",), frozenset(),
         forbidden=("tooling.lab", "tooling.bench", "tooling.testbed", "deploy", "tests")),
]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_imports_follow_the_package_rules(rule):
    assert files_under(*rule.dirs), f"no Python files under {rule.dirs}: the rule checks nothing"
    bad = rule.violations()
    assert not bad, f"{len(bad)} import(s) break the rule for {rule.name}:\n" + "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_tooling_modules_import_each_other_without_cycles():
    modules = {module_name(p): p for p in files_under("tooling")}
    edges: dict[str, dict[str, Import]] = {}
    for name, path in modules.items():
        for imp in imports_of(path):
            # `from tooling import x` resolves to tooling.x; a package's own __init__ is not an edge back to it.
            if imp.target in modules and imp.target != name and not name.startswith(imp.target + "."):
                edges.setdefault(name, {}).setdefault(imp.target, imp)
    cycles = _cycles({n: set(e) for n, e in edges.items()})
    details = []
    for cycle in cycles:
        details.append(" <-> ".join(cycle) + ":\n" + "\n".join(
            f"  {edges[a][b]}" for a in cycle for b in cycle if b in edges.get(a, {})))
    assert not cycles, "tooling modules import each other in a cycle:\n" + "\n".join(details)


SERVICES_DIRS = sorted(p.name for p in (REPO / "services").iterdir() if p.is_dir() and p.name != "__pycache__")


@pytest.mark.parametrize("package", SERVICES_DIRS)
def test_services_package_says_what_it_is(package):
    """`ls services/*/` shows the architecture: each package opens with a docstring naming its part."""
    init = REPO / "services" / package / "__init__.py"
    assert init.is_file(), f"services/{package}/ has no __init__.py (every directory under services/ is a package)"
    docstring = ast.get_docstring(ast.parse(init.read_text()))
    assert docstring and docstring.strip(), f"services/{package}/__init__.py has no docstring saying what it is"
    assert f"services.{package}" in {r.name for r in RULES}, \
        f"services/{package}/ has no import rule in tests/unit/test_architecture.py RULES"
