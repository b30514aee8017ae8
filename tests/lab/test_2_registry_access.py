"""The site registry from the lab network, as any machine on a factory network reaches it: the
manager's port 5000 answers only with TLS and only its user (docs/security.md). site-a is the lab's
site of several nodes, so it runs a registry and its second node pulls its images from it."""
from __future__ import annotations

import base64
import ssl
import urllib.error
import urllib.request

import pytest

from tooling.lab import lab

pytestmark = pytest.mark.smoke     # seconds on a running lab: part of the lab smoke

SITE = "site-a"


def _get(address: str, auth: tuple[str, str] | None) -> int:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE     # its self-signed certificate
    request = urllib.request.Request(f"https://{address}:5000/v2/")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_registry_refuses_anonymous_and_wrong_logins_and_answers_its_user(lab_hosts):
    address = lab.host_ip(lab.site_managers(lab_hosts)[SITE])
    password = (lab.pki_dir() / SITE / "registry.password").read_text().strip()
    assert _get(address, None) == 401
    assert _get(address, ("iot", "not-the-password")) == 401
    assert _get(address, ("iot", password)) == 200
