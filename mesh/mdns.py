"""Zeroconf (mDNS/DNS-SD) discovery: announce and browse `_aa-router._tcp.local.`.

A router registers one service of that type, its endpoints in the TXT properties, and browses
the same type; each service found is resolved and reported as a `RouterInfo`. Confined to the
selected interfaces: zeroconf's listening socket joins the mDNS group only on them, and it sends
through one socket per selected address with IP_MULTICAST_IF set to that address.

Loopback (checked on Linux): `interfaces=["127.0.0.1"]` works even though `lo` has no MULTICAST
flag, because IP_MULTICAST_IF pins the outgoing interface to `lo` and 224.0.0.251 is in the
link-local group range, which the kernel routes out of the pinned interface whatever the
routing table says (here the multicast route points at eth0, and eth0 sent no packet while two
instances found each other over lo).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Final

from .beacon import Beacon, RouterInfo
from .endpoints import format_endpoint, is_unspecified, parse_endpoint
from .errors import UsageError
from .interfaces import system_interfaces

__all__ = ["ZeroconfDiscovery", "SERVICE_TYPE"]

log = logging.getLogger(__name__)

#: The DNS-SD service type of Aa routers.
SERVICE_TYPE: Final = "_aa-router._tcp.local."
#: Milliseconds to wait for a found service's details (SRV, TXT, A): mDNS answers on a LAN in
#: tens of milliseconds; three seconds covers retries.
RESOLVE_TIMEOUT_MS: Final = 3000
#: Services resolved at once, in lookups: bounds the tasks a flood of announcements can start.
MAX_PENDING_RESOLVES: Final = 64
#: Longest DNS label, in bytes (RFC 1035): instance names are cut to it.
_MAX_LABEL: Final = 63


class ZeroconfDiscovery:
    """Announce *beacon* (if any) and report the other routers announced.

    *addresses* are our IPv4 addresses to confine zeroconf to (`["127.0.0.1"]` for `lo`);
    None means every interface.
    """

    def __init__(
        self,
        *,
        on_found: Callable[[RouterInfo], None],
        beacon: Beacon | None = None,
        addresses: Sequence[str] | None = None,
    ) -> None:
        if addresses is not None and not addresses:
            raise UsageError("zeroconf needs at least one address (None means all)")
        self.on_found = on_found
        self.beacon = beacon
        self.addresses = list(addresses) if addresses is not None else None
        self._azc: Any = None
        self._browser: Any = None
        self._info: Any = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Open zeroconf's sockets and start browsing; returns once they are bound.

        Registration (probing the name, ~1 s) goes on in the background.
        """
        from zeroconf import InterfaceChoice, IPVersion
        from zeroconf.asyncio import AsyncServiceBrowser, AsyncZeroconf

        interfaces: Any = self.addresses if self.addresses is not None else InterfaceChoice.All
        self._azc = AsyncZeroconf(interfaces=interfaces, ip_version=IPVersion.V4Only)
        try:
            if self.beacon is not None:
                self._info = self._service_info(self.beacon)
                self._spawn(self._register(self._info))
            self._browser = AsyncServiceBrowser(
                self._azc.zeroconf, SERVICE_TYPE, handlers=[self._on_change]
            )
        except BaseException:
            await self.aclose()
            raise

    def _service_info(self, beacon: Beacon) -> Any:
        from zeroconf.asyncio import AsyncServiceInfo

        host, port = parse_endpoint(beacon.peer)
        if is_unspecified(host):
            addrs = (
                self.addresses
                if self.addresses is not None
                else [i.address for i in system_interfaces()]
            )
        else:
            addrs = [host]
        instance = beacon.router_id.encode()[:_MAX_LABEL].decode(errors="ignore")
        props = {
            "id": beacon.router_id,
            "name": beacon.name[:100],
            "peer": beacon.peer,
            "client": beacon.client or "",
            "v": str(beacon.protocol),
        }
        return AsyncServiceInfo(
            SERVICE_TYPE,
            f"{instance}.{SERVICE_TYPE}",
            port=port,
            properties=props,
            server=f"aa-{instance}.local.",
            addresses=[socket.inet_aton(a) for a in addrs if _is_ipv4(a)],
        )

    async def _register(self, info: Any) -> None:
        try:
            announced = await self._azc.async_register_service(info)
            await announced
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("zeroconf: cannot register %s: %s", info.name, exc)

    def _on_change(self, zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        from zeroconf import ServiceStateChange

        if state_change not in (ServiceStateChange.Added, ServiceStateChange.Updated):
            return
        if len(self._tasks) >= MAX_PENDING_RESOLVES:
            log.debug("zeroconf: too many pending lookups, %s skipped", name)
            return
        self._spawn(self._resolve(service_type, name))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resolve(self, service_type: str, name: str) -> None:
        from zeroconf import IPVersion
        from zeroconf.asyncio import AsyncServiceInfo

        info = AsyncServiceInfo(service_type, name)
        if not await info.async_request(self._azc.zeroconf, RESOLVE_TIMEOUT_MS):
            log.debug("zeroconf: no details for %s", name)
            return
        props = {
            k.decode(errors="replace"): (v or b"").decode(errors="replace")
            for k, v in (info.properties or {}).items()
        }
        router_id = props.get("id") or None
        if self.beacon is not None and router_id == self.beacon.router_id:
            return  # ourselves
        addresses = info.parsed_addresses(IPVersion.V4Only)
        # A router that listens on every address (0.0.0.0) advertises them all: prefer one that
        # is not loopback, which other machines can reach too.
        addresses.sort(key=lambda a: a.startswith("127."))
        try:
            found = RouterInfo(
                peer=_fill(
                    props.get("peer") or format_endpoint(addresses[0], info.port or 0), addresses
                ),
                router_id=router_id,
                name=props.get("name") or None,
                client=_fill(props["client"], addresses) if props.get("client") else None,
                protocol=int(props["v"]) if props.get("v", "").isdigit() else None,
                via="zeroconf",
            )
        except (UsageError, IndexError) as exc:
            log.warning("zeroconf: ignored service %s with bad properties: %s", name, exc)
            return
        try:
            self.on_found(found)
        except Exception:
            log.exception("discovery on_found callback failed")

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        browser, self._browser = self._browser, None
        azc, self._azc = self._azc, None
        if browser is not None:
            await browser.async_cancel()
        if azc is not None:
            try:
                if self._info is not None:
                    await azc.async_unregister_all_services()
            except Exception as exc:  # never registered (name clash, closed early): nothing to undo
                log.debug("zeroconf: unregistering failed: %s", exc)
            finally:
                await azc.async_close()

    async def __aenter__(self) -> ZeroconfDiscovery:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _fill(endpoint: str, addresses: list[str]) -> str:
    host, port = parse_endpoint(endpoint)
    return format_endpoint(addresses[0], port) if is_unspecified(host) else endpoint


def _is_ipv4(text: str) -> bool:
    try:
        socket.inet_aton(text)
    except OSError:
        return False
    return text.count(".") == 3
