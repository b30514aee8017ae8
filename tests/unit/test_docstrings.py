"""Every module docstring outside a package's `__init__.py` says its module's contract in at most 15 lines.

Rationale, history and measured figures belong in docs/ (architecture.md, operations.md, faults.md,
security.md), each figure once; a docstring points there instead. A line is counted as in the docstring's
text, blank lines included, leading and trailing newlines not.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 15
SKIPPED_DIRS = {".venv", "build", "node_modules"}


def python_files() -> list[Path]:
    """The repository's Python files, without virtualenvs, build output, node_modules and hidden directories."""
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
        found += [Path(root, name) for name in sorted(files) if name.endswith(".py")]
    return found


def docstring_lines(path: Path) -> int:
    """Lines of the module docstring of `path` (0 without one)."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path)), clean=False)
    return len(docstring.strip("\n").splitlines()) if docstring else 0


def test_the_walk_finds_the_services_and_skips_the_venv():
    files = {path.relative_to(REPO).as_posix() for path in python_files()}
    assert "services/bridge/app.py" in files and "tests/unit/test_docstrings.py" in files
    assert not any(name.split("/")[0] in SKIPPED_DIRS or name.startswith(".") for name in files)


def test_no_module_docstring_is_longer_than_15_lines_outside_init():
    offenders = sorted(((lines, path.relative_to(REPO).as_posix()) for path in python_files()
                        if path.name != "__init__.py" for lines in [docstring_lines(path)] if lines > MAX_LINES),
                       reverse=True)
    listing = "\n".join(f"  {path}: {lines} lines" for lines, path in offenders)
    assert not offenders, (f"{len(offenders)} module docstrings are longer than {MAX_LINES} lines; keep the "
                           f"contract there and move rationale, history and figures to docs/:\n{listing}")
