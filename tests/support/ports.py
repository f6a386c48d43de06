"""Free ports on loopback, found by binding port 0 (tests never use fixed ports)."""

from __future__ import annotations

import socket

__all__ = ["free_udp_port", "free_tcp_port"]


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 nothing uses now (a test's own discovery port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 nothing uses now (for a server that must be told its port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
