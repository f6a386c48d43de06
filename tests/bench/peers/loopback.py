"""A guard for bench_peers.py: every socket of every process it started stays on loopback.

A thread looks, once a second, at the TCP and UDP sockets (IPv4 and IPv6, from
/proc/net) of the benchmark's descendants — brokers, clients, the Aa router — and records
any whose local or remote address is outside 127.0.0.0/8 and ::1 (a socket bound to
0.0.0.0 or ::, or one talking to another host, or joined to a multicast group). The configs
already bind loopback only; this makes a mistake in them, or a library's default (Zenoh's
multicast scouting), fail the run loudly instead of reaching the network unseen. Linux only:
elsewhere it watches nothing and says so.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

CHECK_S = 1.0  # how often the sockets are listed: a scouting socket lives as long as its
# session (seconds); one look costs ~5-15 ms of CPU in this (otherwise idle) process


def _v4(hexaddr: str) -> tuple[bool, bool]:
    """(is loopback, is unspecified) for /proc/net's little-endian IPv4 `0100007F`."""
    b = bytes.fromhex(hexaddr)[::-1]
    return b[0] == 127, b == b"\0\0\0\0"


def _v6(hexaddr: str) -> tuple[bool, bool]:
    """The same for /proc/net's IPv6: four little-endian 32-bit words."""
    raw = b"".join(bytes.fromhex(hexaddr[i : i + 8])[::-1] for i in range(0, 32, 8))
    if raw == bytes(16):
        return False, True
    if raw == bytes(15) + b"\1":
        return True, False
    if raw[:12] == bytes(10) + b"\xff\xff":  # IPv4-mapped
        return raw[12] == 127, raw[12:] == bytes(4)
    return False, False


def descendants(root: int) -> set[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier and pid not in out}
        out |= frontier
    return out


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        pass
    return inodes


def off_loopback(inodes: dict[str, int]) -> list[str]:
    """The sockets among *inodes* (inode → pid) that are not confined to loopback."""
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        parse = _v6 if proto.endswith("6") else _v4
        try:
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[9] not in inodes:
                continue
            local, remote = fields[1].split(":")[0], fields[2].split(":")[0]
            local_lo, _ = parse(local)
            remote_lo, remote_unset = parse(remote)
            if not local_lo or not (remote_lo or remote_unset):
                pid = inodes[fields[9]]
                found.append(f"pid {pid} ({_name(pid)}): {proto} {fields[1]} -> {fields[2]}")
    return found


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


class LoopbackGuard:
    """Watches this process's descendants while entered; `found` lists what was off loopback."""

    def __init__(self) -> None:
        self.found: list[str] = []
        self.active = Path("/proc/net/tcp").exists()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loopback-guard", daemon=True)

    def check(self) -> None:
        inodes = {inode: pid for pid in descendants(os.getpid()) for inode in socket_inodes(pid)}
        for item in off_loopback(inodes):
            if item not in self.found:
                self.found.append(item)

    def _run(self) -> None:
        while not self._stop.wait(CHECK_S):
            self.check()

    def __enter__(self) -> LoopbackGuard:
        if self.active:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.active:
            self._thread.join()
