"""What crosses the LAN between a site's nodes: the Swarm overlay's VXLAN packets (udp 4789) captured in a lab
host's network namespace, as anyone on the factory LAN could capture them, decapsulated, and counted per inner
TCP or UDP port: packets with a payload, and those whose payload holds one of the given byte strings in clear.

The capture runs in the lab host with its own Python (an AF_PACKET socket: the container has CAP_NET_RAW), so
nothing is installed on it; the byte strings reach it on stdin. Used by tests/lab/test_2_overlay_capture.py."""
from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import dataclass, field

from tooling.lab import lab

VXLAN_PORT = 4789

# Runs on the lab host: python3 -c CAPTURE SECONDS VXLAN_PORT, the needles (JSON list of strings) on stdin. Prints
# {"vxlan": packets, "ports": {port: [packets with payload, packets holding a needle]}}; a TCP or UDP packet counts
# under each of its two ports.
CAPTURE = r"""
import json, socket, struct, sys, time
seconds, vxlan_port = float(sys.argv[1]), int(sys.argv[2])
needles = [n.encode() for n in json.load(sys.stdin)]
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(3))
sock.settimeout(0.5)
ports, vxlan, end = {}, 0, time.monotonic() + seconds
def ip_payload(frame, at):
    # an IPv4 packet at `at` of `frame`: (protocol, payload offset, end) or None
    if len(frame) < at + 20 or frame[at] >> 4 != 4:
        return None
    total = struct.unpack_from("!H", frame, at + 2)[0]
    return frame[at + 9], at + (frame[at] & 15) * 4, min(len(frame), at + total)
while time.monotonic() < end:
    try:
        frame = sock.recv(65535)
    except socket.timeout:
        continue
    if frame[12:14] != b"\x08\x00":
        continue
    outer = ip_payload(frame, 14)
    if not outer or outer[0] != 17:
        continue
    udp = outer[1]
    if vxlan_port not in struct.unpack_from("!HH", frame, udp):
        continue
    vxlan += 1
    inner_eth = udp + 8 + 8
    if frame[inner_eth + 12:inner_eth + 14] != b"\x08\x00":
        continue
    inner = ip_payload(frame, inner_eth + 14)
    if not inner or inner[0] not in (6, 17):
        continue
    transport, stop = inner[1], inner[2]
    header = (frame[transport + 12] >> 4) * 4 if inner[0] == 6 else 8    # TCP's data offset; UDP's 8 bytes
    payload = frame[transport + header:stop]
    if not payload:
        continue
    hit = any(n in payload for n in needles)
    for port in set(struct.unpack_from("!HH", frame, transport)):
        seen = ports.setdefault(port, [0, 0])
        seen[0] += 1
        seen[1] += hit
print(json.dumps({"vxlan": vxlan, "ports": ports}))
"""


@dataclass
class Capture:
    """The result: VXLAN packets seen, and per inner TCP or UDP port [packets with payload, packets holding a
    needle]."""
    vxlan: int = 0
    ports: dict[int, list[int]] = field(default_factory=dict)

    def packets(self, port: int) -> int:
        return self.ports.get(port, [0, 0])[0]

    def in_clear(self, port: int) -> int:
        return self.ports.get(port, [0, 0])[1]


class OverlayCapture:
    """Capture on `host` for `seconds` in a thread: start(), do what must cross the LAN, then result()."""

    def __init__(self, host: lab.LabHost, needles: list[str], seconds: float):
        self.host, self.needles, self.seconds = host, needles, seconds
        self._out: dict = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        cmd = ["docker", "exec", "-i", self.host.container, "python3", "-c", CAPTURE, str(self.seconds),
               str(VXLAN_PORT)]
        result = subprocess.run(cmd, input=json.dumps(self.needles), capture_output=True, text=True,
                                timeout=self.seconds + 60)
        self._out = {"code": result.returncode, "stdout": result.stdout, "stderr": result.stderr}

    def start(self) -> OverlayCapture:
        self._thread.start()
        return self

    def result(self) -> Capture:
        self._thread.join(self.seconds + 90)
        lines = self._out.get("stdout", "").strip().splitlines()
        if self._out.get("code") != 0 or not lines:
            raise RuntimeError(f"the capture on {self.host.name} failed: {self._out}")
        found = json.loads(lines[-1])
        return Capture(found["vxlan"], {int(port): seen for port, seen in found["ports"].items()})
