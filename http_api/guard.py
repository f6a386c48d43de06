"""The endpoint's outer wall, as plain ASGI middleware in front of the application: callers
outside the allowed address ranges get 403, requests naming a ``Host`` that is not one of the
endpoint's names get 421 (`host_allowed`), request bodies over the cap get 413, before any
route, parser or the router sees them, and so do bodies of more than `MAX_BODY_VALUES`
values: JSON is parsed and checked in one piece on the router's loop, ~1 µs per value, and a
megabyte of empty maps would hold every client of the router meanwhile. Cross-origin calls from
the mesh's own hosts (the phone app roaming to this router) get their CORS headers here, for
every answer including the feed's fast path; which origins, and why, is `cors`'s docstring.
A caller refused (401, 403, 503) again and again gets 429 here, after a pause, before its
credentials are decoded (`aa.router.security.refusals`).

The peer address is the socket's (uvicorn runs with proxy headers off), so a caller cannot
talk its way in with ``X-Forwarded-For``. Bodies: a ``Content-Length`` over the cap is
refused at once; a body without one (chunked) is counted as it arrives and refused as soon as
it passes the cap, so memory never holds more than the cap. A HEAD request reaches the
application as a GET (RFC 9110 §9.3.2): uvicorn, which knows it was HEAD, sends the head only.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from aa.mesh import UsageError
from aa.router.security import RefusalBudget

from . import cors
from .limits import (
    DEFAULT_ALLOW,
    MAX_BODY_BYTES,
    MAX_BODY_VALUES,
    STRANGER_REFUSAL_BURST,
    STRANGER_REFUSAL_RATE,
)

__all__ = ["Guard", "parse_ranges", "LOOPBACK_NAMES", "host_name"]

#: Host names every endpoint answers to, with any port: a page a browser loaded from
#: loopback can always reach its own router.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The answers that spend one of the caller's refusals (`RefusalBudget`): no, a bad or a
#: forged credential (401), a user without the right (403), and a request past a cap that
#: told its caller when to come back (503 with Retry-After: a user at their HTTP client cap
#: asking again at once).
REFUSED_STATUSES = frozenset({401, 403, 503})


def parse_ranges(ranges: Iterable[str]) -> tuple[Network, ...]:
    """CIDR ranges (``"192.168.0.0/16"``, ``"::1"``); raises `UsageError` for a bad one."""
    out = []
    for r in ranges:
        try:
            out.append(ipaddress.ip_network(r.strip(), strict=False))
        except (ValueError, TypeError) as exc:
            raise UsageError(f"not an address range: {r!r} ({exc})") from None
    return tuple(out)


def host_name(value: str) -> str | None:
    """The name part of a ``Host`` header (``[::1]:8080`` → ``::1``, ``Router.Lan.`` →
    ``router.lan``), lower case; None when it is not a host name at all."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
    else:
        name, _, port = value.partition(":")
        if port and not port.isdigit():
            return None
    name = name.rstrip(".")
    return name or None


def _names(names: Iterable[str] | None) -> frozenset[str] | None:
    if names is None:
        return None
    out = set(LOOPBACK_NAMES)
    for n in names:
        text = n.strip().lower().strip("[]").rstrip(".")
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            if not _NAME.fullmatch(text):
                raise UsageError(
                    f"not a host name: {n!r} (a DNS name or an address, without a port)"
                ) from None
        else:
            if address.is_unspecified:  # a wildcard listen address names no host
                continue
            text = address.compressed
        out.add(text)
    return frozenset(out)


_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*")


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": code, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _hold_back(send: Send, retry: float) -> None:
    """The 429 of a caller whose refusals are spent (`RefusalBudget`); the connection stays open,
    so that the caller's next request waits its turn behind this one's pause."""
    body = json.dumps(
        {
            "error": "too-many-refusals",
            "message": "too many requests from this caller were refused (no, bad or forged "
            "credentials, or no right): wait, then send a valid token",
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(max(1, math.ceil(retry))).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _Counting:
    """*send*, spending a refusal in each of *budgets* (`RefusalBudget`, and the key there)
    when the answer is one. The server's own answer cycle stays reachable as ``__self__``, as
    on the server's bound ``send``: the feed's fast path writes an answer in one piece
    through it (`fastfeed`)."""

    __slots__ = ("_send", "_budgets", "__self__")

    def __init__(self, send: Send, budgets: list[tuple[RefusalBudget, str]]) -> None:
        self._send, self._budgets = send, budgets
        self.__self__ = getattr(send, "__self__", None)

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] in REFUSED_STATUSES:
            now = time.monotonic()
            for budget, key in self._budgets:
                budget.refused(key, now)
        await self._send(message)


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    """*send*, adding *extra* to the answer's head."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return sending


class Guard:
    """ASGI middleware: address allow-list, ``Host`` names and body cap (see the module
    docstring). *names*: host names answered besides `LOOPBACK_NAMES`; None: any ``Host``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        allow: Iterable[str] = DEFAULT_ALLOW,
        max_body: int = MAX_BODY_BYTES,
        names: Iterable[str] | None = (),
    ) -> None:
        self.app = app
        self.allow = parse_ranges(allow)
        self.max_body = max_body
        self.names = _names(names)
        self._verdicts: dict[str, bool] = {}  # address → allowed; callers are few
        #: Refusals per caller (`RefusalBudget`): a caller refused again and again gets 429.
        self.refusals = RefusalBudget()
        #: Refusals of all strangers together (`STRANGER_REFUSAL_BURST`), one bucket.
        self.strangers = RefusalBudget(
            burst=STRANGER_REFUSAL_BURST, rate=STRANGER_REFUSAL_RATE, max_callers=1
        )

    def allowed(self, host: str | None) -> bool:
        if host is None:
            return False
        verdict = self._verdicts.get(host)
        if verdict is None:
            try:
                addr = ipaddress.ip_address(host.split("%", 1)[0])
            except ValueError:
                verdict = False
            else:
                mapped = getattr(addr, "ipv4_mapped", None)
                addr = mapped or addr
                verdict = any(addr in net for net in self.allow)
            if len(self._verdicts) < 4096:
                self._verdicts[host] = verdict
        return verdict

    def host_allowed(self, host: str) -> bool:
        """Whether a ``Host`` header names this endpoint. A page from another site cannot
        reach the endpoint through a name it made point at loopback (DNS rebinding): its
        requests carry that name, which is not one of ours."""
        if self.names is None:
            return True
        name = host_name(host)
        return name is not None and name in self.names

    def host_refusal(self, headers: Iterable[tuple[bytes, bytes]]) -> tuple[int, str, str] | None:
        hosts = [v for k, v in headers if k == b"host"]
        if len(hosts) != 1:
            return 400, "bad-host", "a request must name its host in exactly one Host header"
        host = hosts[0].decode("latin-1")
        if self.host_allowed(host):
            return None
        shown = host if len(host) <= 100 and host.isprintable() else repr(host[:100])
        return (
            421,
            "misdirected",
            f"Host {shown} is not a name of this endpoint (aa router --http-name adds one)",
        )

    def cross_origin(self, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The ``Origin`` of a request from a page this endpoint lets read its answers
        (`cors.allowed`), else None (no Origin, or one not allowed: no CORS header)."""
        origins = [v for k, v in headers if k == b"origin"]
        if len(origins) != 1:
            return None
        origin = origins[0].decode("latin-1")
        return origin if cors.allowed(origin, self.names, self._mesh_hosts) else None

    def caller_key(self, headers: Iterable[tuple[bytes, bytes]], host: str) -> str:
        """Whose refusal budget a request spends (`RefusalBudget`): the user of a bearer token
        the router verified before, else the caller's address. Nothing is verified here."""
        for k, v in headers:
            if k == b"authorization":
                scheme, _, token = v.decode("latin-1").strip().partition(" ")
                if scheme.lower() == "bearer" and token.startswith("aa1."):
                    router = getattr(getattr(self.app, "state", None), "router", None)
                    tokens = getattr(getattr(router, "security", None), "tokens", None)
                    claims = tokens.known(token.strip()) if tokens is not None else None
                    if claims is not None:
                        return f"user {claims.user}"
                break
        return f"address {host}"

    def _mesh_hosts(self) -> frozenset[str]:
        router = getattr(getattr(self.app, "state", None), "router", None)
        info = router.mesh_info() if router is not None else None
        return cors.mesh_hosts(info) if isinstance(info, dict) else frozenset()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = client[0] if client else None
        if address is None or not self.allowed(address):
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await _refuse(send, 403, "forbidden", "requests from this address are not allowed here")
            return
        if kind == "websocket":
            await self.app(scope, receive, send)
            return
        if self.names is not None:
            refusal = self.host_refusal(scope["headers"])
            if refusal is not None:
                await _refuse(send, *refusal)
                return
        origin = self.cross_origin(scope["headers"])
        if origin is not None:  # the phone app of another router of the mesh (`cors`)
            if scope["method"] == "OPTIONS":
                head = cors.preflight_headers(origin)
                await send({"type": "http.response.start", "status": 204, "headers": head})
                await send({"type": "http.response.body", "body": b""})
                return
            send = _with_headers(send, cors.cors_headers(origin))
        caller = self.caller_key(scope["headers"], address)
        budgets = [(self.refusals, caller)]
        if not caller.startswith("user "):
            budgets.append((self.strangers, "strangers"))
        now = time.monotonic()
        pause = max(budget.wait(key, now) for budget, key in budgets)
        if pause > 0:  # it earns nothing while it knocks: it must stop to get back in
            await asyncio.sleep(self.refusals.hold(caller, now))  # the connection's next too
            await _hold_back(send, self.refusals.wait(caller, now))
            return
        send = _Counting(send, budgets)
        length = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await _refuse(send, 400, "bad-request", "Content-Length is not a number")
                    return
                break
        cap = self.max_body
        if length is not None and length > cap:
            await _refuse(send, 413, "too-large", f"request body over the limit of {cap} bytes")
            return
        if scope["method"] == "GET":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "HEAD":  # GET's answer, of which the server sends the head
            await self.app({**scope, "method": "GET"}, receive, send)
            return
        # Read the body here, counting, then weigh it and replay it to the app.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > cap:
                await _refuse(send, 413, "too-large", f"request body over the limit of {cap} bytes")
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body.count(b",") + body.count(b"[") + body.count(b"{") > MAX_BODY_VALUES:
            await _refuse(
                send,
                413,
                "too-many-values",
                f"request body has more than {MAX_BODY_VALUES} values (every ',', '[' and '{{' "
                "counts): send large arrays as base64 bytes, or in several requests",
            )
            return
        replay = [{"type": "http.request", "body": body, "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)
