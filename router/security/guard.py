"""Who may knock at all: CIDR allow-lists, and a back-off for strangers' handshakes (no I/O).

`AllowList` is checked when a connection is accepted, before a byte is read: a refused
address costs an accept and a close. `HandshakeGuard` is for dialling: routers dial the
routers their discovery hears about, and anyone on the LAN can send a beacon. A stranger's
beacon (a router another CA signed, or no router at all) must cost at most one refused
handshake per address per back-off interval, however often it is repeated — the guard says
whether an address may be dialled now (`admit`) and doubles its back-off on each refusal.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Iterable

from aa.mesh import UsageError

__all__ = ["AllowList", "HandshakeGuard", "GUARD_BASE", "GUARD_MAX", "MAX_GUARDED"]

#: Seconds an address whose handshake was refused is left alone at first; doubles per refusal.
GUARD_BASE = 30.0
#: Longest back-off, seconds: a router that was given a good certificate since is tried again
#: within the hour.
GUARD_MAX = 3600.0
#: Addresses remembered. Each is ~200 bytes; beacons are cheap to forge from many addresses,
#: so the oldest record goes when the guard is full (it then costs one handshake again).
MAX_GUARDED = 10_000

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class AllowList:
    """Address ranges allowed to connect; empty means everyone.

    >>> a = AllowList(["10.0.0.0/8", "::1/128"])
    >>> a.allows("10.1.2.3"), a.allows("192.168.1.1"), a.allows("::ffff:10.0.0.1")
    (True, False, True)
    """

    __slots__ = ("ranges",)

    def __init__(self, ranges: Iterable[str] = ()) -> None:
        nets: list[_Network] = []
        for r in ranges:
            try:
                nets.append(ipaddress.ip_network(r.strip(), strict=False))
            except ValueError:
                raise UsageError(
                    f"{r!r} is not an address range (CIDR such as 192.168.0.0/16)"
                ) from None
        self.ranges: tuple[_Network, ...] = tuple(nets)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def allows(self, host: str) -> bool:
        if not self.ranges:
            return True
        try:
            addr = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return any(addr.version == n.version and addr in n for n in self.ranges)


class HandshakeGuard:
    """Per-address back-off after refused handshakes. Pass `now` (monotonic seconds) in."""

    def __init__(
        self, base: float = GUARD_BASE, maximum: float = GUARD_MAX, max_entries: int = MAX_GUARDED
    ) -> None:
        if not 0 < base <= maximum:
            raise UsageError("the guard's base interval must be positive and at most its maximum")
        self.base = base
        self.maximum = maximum
        self.max_entries = max_entries
        self._until: OrderedDict[str, tuple[float, int]] = (
            OrderedDict()
        )  # address → (until, refusals)

    def __len__(self) -> int:
        return len(self._until)

    def admit(self, address: str, now: float) -> bool:
        """Whether *address* may be dialled (or its handshake tried) now."""
        entry = self._until.get(address)
        return entry is None or now >= entry[0]

    def refused(self, address: str, now: float) -> float:
        """Record a refused handshake; returns when the address may be tried again."""
        _, count = self._until.pop(address, (0.0, 0))
        count += 1
        until = now + min(self.base * 2.0 ** min(count - 1, 32), self.maximum)
        self._until[address] = (until, count)
        while len(self._until) > self.max_entries:
            self._until.popitem(last=False)
        return until

    def succeeded(self, address: str) -> None:
        self._until.pop(address, None)
