"""Which networks discovery talks on: interface selection and broadcast addresses.

Pure except `system_interfaces()`, which asks the OS (through `ifaddr`) for the machine's IPv4
interfaces. A selection is a list of items, each one of:

- an interface name, "eth0", "lo" (`lo` broadcasts to 127.255.255.255: routers on one machine);
- an IPv4 address of this machine, "192.168.1.20": the interface that holds it;
- a subnet, "10.1.2.0/24": its directed broadcast address, for a subnet this machine is not
  on (routers there hear us; the routers that a router can reach by TCP need not be local).

No selection (None) means every IPv4 interface that has a broadcast address, loopback
included. The environment variable `AA_DISCOVERY_INTERFACES` (comma-separated items) is the
fallback when the configuration gives none.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import ifaddr

from .errors import InvalidValue

__all__ = [
    "Interface",
    "BroadcastTarget",
    "system_interfaces",
    "select_targets",
    "selected_addresses",
    "selection_from_env",
    "check_selection",
    "ENV_INTERFACES",
]

log = logging.getLogger(__name__)

#: Environment variable holding the default selection, e.g. "lo" or "eth0,10.1.2.0/24".
ENV_INTERFACES: Final = "AA_DISCOVERY_INTERFACES"


@dataclass(frozen=True, slots=True, kw_only=True)
class Interface:
    """One IPv4 address of one network interface."""

    name: str
    address: str
    #: Network prefix length, 0 to 32.
    prefix: int

    def __post_init__(self) -> None:
        ipaddress.IPv4Address(self.address)  # ValueError (AddressValueError) when not one
        if type(self.prefix) is not int or not 0 <= self.prefix <= 32:
            raise InvalidValue("prefix must be an int from 0 to 32")

    @property
    def broadcast(self) -> str | None:
        """The subnet's broadcast address; None for /31 and /32 links, which have none."""
        if self.prefix >= 31:
            return None
        return str(
            ipaddress.IPv4Network(f"{self.address}/{self.prefix}", strict=False).broadcast_address
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BroadcastTarget:
    """One broadcast address to send beacons to."""

    broadcast: str
    #: Interface name, or None for a configured remote subnet.
    interface: str | None = None
    #: Our address on that interface, or None for a remote subnet (nothing to listen on).
    address: str | None = None

    @property
    def local(self) -> bool:
        """Whether we are on that network, and so can hear beacons sent to it."""
        return self.address is not None


def system_interfaces() -> list[Interface]:
    """The machine's IPv4 interface addresses (through `ifaddr`)."""
    out = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str):  # IPv6 addresses come as tuples
                out.append(Interface(name=adapter.name, address=ip.ip, prefix=ip.network_prefix))
    return out


def selection_from_env(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The selection in `AA_DISCOVERY_INTERFACES`, or None if unset or empty."""
    text = environ.get(ENV_INTERFACES, "")
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    return items or None


def check_selection(selection: Sequence[str]) -> None:
    """Raise `InvalidValue` for an item that looks like a subnet but is not a broadcast one."""
    for item in selection:
        if "/" in item:
            _subnet(item)


def _subnet(item: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(item, strict=False)
    except ValueError:
        raise InvalidValue(f"discovery subnet {item!r} is not an IPv4 subnet") from None
    if net.prefixlen >= 31:
        raise InvalidValue(f"discovery subnet {item!r} has no broadcast address")
    return net


def _matching(item: str, interfaces: Sequence[Interface]) -> list[Interface]:
    return [i for i in interfaces if i.name == item or i.address == item]


def select_targets(
    selection: Sequence[str] | None, interfaces: Sequence[Interface]
) -> list[BroadcastTarget]:
    """Broadcast targets for *selection* among *interfaces* (see the module doc).

    An item that matches nothing is logged and skipped (interfaces come and go: a laptop's
    Wi-Fi may be down at start); an item that is neither a name, an address nor a subnet
    raises `InvalidValue`.
    """
    targets: dict[str, BroadcastTarget] = {}

    def add(target: BroadcastTarget) -> None:
        targets.setdefault(target.broadcast, target)

    if selection is None:
        for i in interfaces:
            if i.broadcast is not None:
                add(BroadcastTarget(broadcast=i.broadcast, interface=i.name, address=i.address))
        return list(targets.values())
    for item in selection:
        if "/" in item:
            net = _subnet(item)
            broadcast = str(net.broadcast_address)
            local = [i for i in interfaces if i.broadcast == broadcast]
            if local:
                add(
                    BroadcastTarget(
                        broadcast=broadcast, interface=local[0].name, address=local[0].address
                    )
                )
            else:
                add(BroadcastTarget(broadcast=broadcast))
            continue
        found = _matching(item, interfaces)
        if not found:
            log.warning(
                "discovery interface %r not found (have: %s): skipped",
                item,
                ", ".join(sorted({i.name for i in interfaces})) or "none",
            )
            continue
        for i in found:
            if i.broadcast is None:
                log.warning(
                    "discovery interface %s (%s/%d) has no broadcast address: skipped",
                    i.name,
                    i.address,
                    i.prefix,
                )
            else:
                add(BroadcastTarget(broadcast=i.broadcast, interface=i.name, address=i.address))
    return list(targets.values())


def selected_addresses(
    selection: Sequence[str] | None, interfaces: Sequence[Interface]
) -> list[str] | None:
    """Our IPv4 addresses on the selected interfaces (for zeroconf); None means all.

    Subnets select the local interface on them, if any.
    """
    if selection is None:
        return None
    out: list[str] = []
    for item in selection:
        if "/" in item:
            net = _subnet(item)
            found = [i for i in interfaces if ipaddress.IPv4Address(i.address) in net]
        else:
            found = _matching(item, interfaces)
        out.extend(i.address for i in found if i.address not in out)
    return out
