"""Start the project's real images with plain `docker run` for integration tests.

Each test module gets its own user-defined network; containers are removed when
the fixture ends, and their logs are printed when a test fails so the reason is
visible in CI output. Ports are published on 127.0.0.1 only.
"""
from __future__ import annotations

import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from tooling.build import images, pins

_PINS = pins.load()


def image(name: str) -> str:
    """Reference of a project image, e.g. image('kafka') -> 'iot-stack/kafka:<tag>'."""
    return images.tag(name, _PINS)


def docker(*args: str, check: bool = True, timeout: float = 120, input: str | None = None
           ) -> subprocess.CompletedProcess:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, input=input)
    if check and result.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(what: str, probe: Callable[[], bool], timeout: float = 120, interval: float = 1.0,
               on_timeout: Callable[[], str] | None = None) -> None:
    """Poll `probe` until it returns true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if probe():
                return
        except Exception as err:  # noqa: BLE001 - probes fail while a service starts
            last_error = err
        time.sleep(interval)
    detail = on_timeout() if on_timeout else ""
    raise TimeoutError(f"{what} not ready after {timeout:.0f}s (last error: {last_error})\n{detail}")


@dataclass
class Lab:
    """One docker network and the containers started on it."""
    network: str = field(default_factory=lambda: f"iot-test-{uuid.uuid4().hex[:8]}")
    containers: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        docker("network", "create", self.network)

    def run(self, image_name: str, name: str, *args: str, env: dict[str, str] | None = None,
            ports: dict[int, int] | None = None, volumes: dict[str, str] | None = None,
            memory: str = "1g", aliases: tuple[str, ...] = ()) -> str:
        """Start a detached container; `name` (and each of `aliases`) is its DNS name on the network."""
        cname = f"{self.network}-{name}"
        cmd = ["run", "-d", "--name", cname, "--hostname", name, "--network", self.network,
               "--network-alias", name, "--memory", memory]
        for alias in aliases:
            cmd += ["--network-alias", alias]
        for key, value in (env or {}).items():
            cmd += ["-e", f"{key}={value}"]
        for host_port, container_port in (ports or {}).items():
            cmd += ["-p", f"127.0.0.1:{host_port}:{container_port}"]
        for source, target in (volumes or {}).items():
            cmd += ["-v", f"{source}:{target}"]
        docker(*cmd, image(image_name), *args)
        self.containers.append(cname)
        return cname

    def exec(self, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return docker("exec", f"{self.network}-{name}", *args, check=False, timeout=timeout)

    def logs(self, name: str, tail: int = 80) -> str:
        result = docker("logs", "--tail", str(tail), f"{self.network}-{name}", check=False)
        return result.stdout + result.stderr

    def all_logs(self, tail: int = 60) -> str:
        return "\n".join(f"----- {c} -----\n{self.logs(c.removeprefix(self.network + '-'), tail)}"
                         for c in self.containers)

    def stop(self, name: str) -> None:
        docker("stop", "-t", "20", f"{self.network}-{name}", check=False)

    def rm(self, name: str) -> None:
        """The container gone with its anonymous volumes (its data), as a node that died with its disk."""
        cname = f"{self.network}-{name}"
        docker("rm", "-f", "-v", cname, check=False)
        self.containers = [c for c in self.containers if c != cname]

    def close(self) -> None:
        for cname in reversed(self.containers):
            docker("rm", "-f", "-v", cname, check=False)
        docker("network", "rm", self.network, check=False)
