"""Cross-origin calls (CORS) from the phone app of another router of the mesh: which origins
may read the endpoint's answers, and the headers that say so. No I/O.

Why at all: the app (``/app``) is served by one router, and a web page's origin is scheme,
host and port, so when that router is unreachable and the app turns to another router of the
mesh, every call it makes there is cross-origin. Without these headers the browser sends the
request (or its preflight) and hides the answer from the page.

Who may: an ``Origin`` whose host is one of this endpoint's own names (loopback's, the
listen address, ``--http-name``: the `Guard`'s names) or the host of a router this router's
mesh knows (`mesh_hosts`), on any port, over ``http`` or ``https``. Every other origin gets
no CORS header at all: its page can still send what a plain HTML form can, but
reads nothing, and the JSON calls (which need a preflight) are not sent.

What that allows an attacker: a page served from one of those hosts, on any port, can call
this endpoint and read the answers, with the credentials *it* holds. It gets none of the
user's: the endpoint takes no cookies and the answers never say
``Access-Control-Allow-Credentials``, so the browser sends no ambient credential (no
cookie, no cached Basic password) cross-origin, and the app's tokens live in the storage of
the app's own origin, which another port's page cannot read. Such a page could already call
the endpoint as an anonymous caller from its own machine; what CORS adds is that a browser
on the router's network lends it that position. So on a mesh that lets anonymous callers do
things (the default), anything else served by a router's host is trusted as much as the
router's own pages: run routers with ``--no-anonymous`` where other web servers share their
hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final
from urllib.parse import urlsplit

__all__ = ["origin_host", "cors_headers", "preflight_headers", "mesh_hosts"]

#: Headers the app sends cross-origin (besides the ones every request may carry).
ALLOW_HEADERS: Final = "Authorization, Content-Type, If-None-Match"
#: Methods of the app's calls: publish, register, patterns, feed, ack, delete.
ALLOW_METHODS: Final = "GET, HEAD, POST, PUT, DELETE"
#: Answer headers the app reads: the feed's cursor and validators.
EXPOSE_HEADERS: Final = "Aa-Cursor, ETag, Last-Modified, Retry-After"
#: Seconds a browser may reuse a preflight's answer: ten minutes, so a roaming app does not
#: double its requests, yet a router that stops trusting an origin is obeyed soon.
PREFLIGHT_MAX_AGE: Final = "600"
#: Longest ``Origin`` read, in characters; a longer one is no origin of ours.
MAX_ORIGIN: Final = 300


def origin_host(origin: str) -> str | None:
    """The host of an ``Origin`` header (``http://[::1]:7448`` → ``::1``), lower case; None
    for ``null``, another scheme, a path, or anything that is not an origin."""
    if len(origin) > MAX_ORIGIN or not origin.isprintable():
        return None
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not one
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or parts.path or parts.query or parts.fragment:
        return None
    if parts.username is not None or parts.password is not None:
        return None
    host = (parts.hostname or "").rstrip(".")
    return host or None


def mesh_hosts(info: dict[str, object]) -> frozenset[str]:
    """The hosts of the routers in a mesh picture (`Router.mesh_info`): each router's
    ``client`` and ``peer`` endpoints (``host:port``) and its peers' addresses."""
    out: set[str] = set()
    routers = info.get("routers")
    for r in routers if isinstance(routers, list) else ():
        if not isinstance(r, dict):
            continue
        for item in (r, *(p for p in r.get("peers") or () if isinstance(p, dict))):
            for key in ("client", "peer", "address"):
                endpoint = item.get(key)
                if isinstance(endpoint, str) and endpoint:
                    host = origin_host("http://" + endpoint)
                    if host is not None:
                        out.add(host)
    return frozenset(out)


def allowed(origin: str, names: frozenset[str] | None, mesh: Callable[[], Iterable[str]]) -> bool:
    """Whether a page of *origin* may read this endpoint's answers (the module docstring).
    *names* None means the endpoint answers any ``Host``: then only loopback's own names."""
    host = origin_host(origin)
    if host is None:
        return False
    if names is not None and host in names:
        return True
    if names is None and host in ("localhost", "127.0.0.1", "::1"):
        return True
    return host in mesh()


def cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    """Headers added to an answer to a cross-origin request from an allowed *origin*."""
    return [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-expose-headers", EXPOSE_HEADERS.encode()),
        (b"vary", b"Origin"),
    ]


def preflight_headers(origin: str) -> list[tuple[bytes, bytes]]:
    """The whole answer head of a preflight (``OPTIONS`` with
    ``Access-Control-Request-Method``) from an allowed *origin*."""
    return [
        *cors_headers(origin),
        (b"access-control-allow-methods", ALLOW_METHODS.encode()),
        (b"access-control-allow-headers", ALLOW_HEADERS.encode()),
        (b"access-control-max-age", PREFLIGHT_MAX_AGE.encode()),
        (b"content-length", b"0"),
    ]
