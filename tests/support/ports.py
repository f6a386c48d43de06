"""Free ports on loopback, for a server that must be told its port (tests never use fixed
ports; a server in the test's own process binds port 0).

Chosen below the kernel's ephemeral range when there is room: a port free when chosen stays
free until the server binds it, not taken meanwhile by one of the many outgoing connections
of a busy machine (the kernel picks those, and what binds port 0, from the ephemeral range).
Each process draws at random, so parallel test workers do not pick the same ones."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["ephemeral_ports", "free_port_block", "free_tcp_port", "free_udp_port"]

#: The lowest port chosen (below it: services' well-known and registered ports).
LOWEST = 10_000

_rng = random.Random()  # seeded from the system's entropy: each process its own draws


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel hands out for port 0 and outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port_block(span: int = 1, kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    """A base B such that B .. B+span-1 are all free ports of *kind* on 127.0.0.1 just now,
    below the ephemeral range when there is room."""
    low, _high = ephemeral_ports()
    lowest, highest = (LOWEST, low - span) if low - span > LOWEST else (20000, 60000 - span)
    for _ in range(200):
        base = _rng.randrange(lowest, highest)
        held = []
        try:
            for port in range(base, base + span):
                s = socket.socket(socket.AF_INET, kind)
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no free block of {span} ports")


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 nothing uses now (a test's own discovery port)."""
    return free_port_block(1, socket.SOCK_DGRAM)


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 nothing uses now (for a server that must be told its port)."""
    return free_port_block(1)
