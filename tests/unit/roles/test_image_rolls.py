"""A rebuilt image keeps its tag; each service carries the id of the image the images role shipped as a
container label (stack role, templates/stack-services.j2, macro image), so a rebuilt image changes the spec
of exactly the services that run it, and `docker stack deploy` rolls them."""
from __future__ import annotations

from deploy.topology import site_topology
from tooling.testbed.stack_render import REPO, image_ids, load_inventory, render

LABEL = "org.iot-stack.image-id"


def _stacks():
    hostvars, groups = load_inventory(REPO / "inventory.example")
    for group, tier, alias in (("site_a", "edge", "site-a"), ("datacenter", "datacenter", "datacenter")):
        yield tier, site_topology(hostvars, groups[group], alias, tier)


def test_every_service_is_labelled_with_its_images_id():
    ids = image_ids()
    for tier, topology in _stacks():
        for name, service in render(tier, topology, ids=ids)["services"].items():
            image = service["image"].split("/")[-1].split(":")[0]
            assert service["labels"][LABEL] == ids[image], name


def test_a_rebuilt_image_changes_only_the_services_that_run_it():
    for tier, topology in _stacks():
        before = render(tier, topology, ids=image_ids())["services"]
        after = render(tier, topology, ids=image_ids(services="rebuilt"))["services"]
        changed = {name for name in before if before[name] != after[name]}
        assert changed == {name for name, s in before.items() if s["image"].startswith("iot-stack/services:")}, tier
        assert changed, tier
