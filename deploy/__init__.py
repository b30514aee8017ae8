"""The deployment's logic, as plain Python: what the Ansible roles compute on the controller.

One module per concern (topology, images, passwords, kafka_acls, preflight, alerting, swarm, rollout, status,
logs, certificates), each tested under tests/unit/deploy; ansible/filter_plugins/deploy_filters.py only
registers their FILTERS.
"""


def filters() -> dict:
    """Every filter of the package by name: what ansible/filter_plugins/deploy_filters.py registers, and what
    tooling/testbed/stack_render.py gives Jinja to render the roles' templates outside Ansible."""
    import importlib
    names = ("topology", "images", "passwords", "kafka_acls", "preflight", "alerting", "swarm", "rollout", "status",
             "logs", "certificates")
    return {name: function for module in (importlib.import_module(f"deploy.{m}") for m in names)
            for name, function in module.FILTERS.items()}
