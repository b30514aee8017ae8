"""The error every deployment check raises: Ansible shows its message as the failed task's reason."""
from __future__ import annotations

try:
    from ansible.errors import AnsibleFilterError as _Base
except ImportError:  # unit tests and tools without Ansible
    _Base = Exception


class DeployError(_Base):
    """A refused inventory or tool output; the message names the host or variable and the fix."""


def fail(message: str) -> None:
    raise DeployError(message)
