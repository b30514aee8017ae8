"""The lab's overlay capture (tooling/lab/overlay_capture.py) decapsulates VXLAN and finds a needle in an inner
TCP payload: fake VXLAN datagrams sent to itself on loopback, captured by the script the lab host runs. It
needs CAP_NET_RAW (scripts/test runs as root)."""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from tooling.lab.overlay_capture import CAPTURE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="an AF_PACKET socket needs root")
PORT = 47891            # not VXLAN's own, so nothing else on this machine is counted


def _segment(sport: int, dport: int, data: bytes) -> bytes:
    """An inner Ethernet frame: IPv4, TCP from sport to dport carrying data."""
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 0, 0, 5 << 4, 0x18, 1000, 0, 0) + data
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0, bytes([10, 0, 0, 1]),
                     bytes([10, 0, 0, 2])) + tcp
    return b"\x02" * 12 + b"\x08\x00" + ip


def test_a_needle_is_counted_under_both_ports_of_its_segment_and_only_there():
    capture = subprocess.Popen([sys.executable, "-c", CAPTURE, "3", str(PORT)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    capture.stdin.write(json.dumps(["needle-42"]))
    capture.stdin.close()
    time.sleep(1)
    vxlan_header = b"\x08\0\0\0\0\x01\0\0"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for frame in (_segment(40000, 9093, b"a needle-42 b"), _segment(9092, 40001, b"nothing here")):
            sock.sendto(vxlan_header + frame, ("127.0.0.1", PORT))
    found = json.loads(capture.stdout.read())
    assert capture.wait(10) == 0
    # Loopback shows each datagram twice (sent and received).
    assert found == {"vxlan": 4, "ports": {"40000": [2, 2], "9093": [2, 2], "9092": [2, 0], "40001": [2, 0]}}
