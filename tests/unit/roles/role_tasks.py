"""Reading the roles' task files statically: a task list with the tasks of its blocks."""
from __future__ import annotations


def flat(tasks: list | None) -> list[dict]:
    """Tasks with those of their blocks (block, rescue, always), depth first."""
    found = []
    for task in tasks or []:
        found.append(task)
        for key in ("block", "rescue", "always"):
            found += flat(task.get(key))
    return found
