"""Caps on everything an HTTP caller can make the router keep or do, and the defaults of an
HTTP client's registration. Each with its unit and the reason for its value."""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_HTTP_PORT",
    "DEFAULT_ALLOW",
    "MAX_BODY_BYTES",
    "MAX_BODY_VALUES",
    "MAX_HTTP_CLIENTS",
    "MAX_HTTP_CLIENTS_PER_USER",
    "MAX_HTTP_CLIENTS_PER_ADDRESS",
    "MAX_PATTERNS_PER_CLIENT",
    "MAX_NAME_LENGTH",
    "DEFAULT_KEEPALIVE",
    "MIN_KEEPALIVE",
    "MAX_KEEPALIVE",
    "MAX_POLICY_AGE_S",
    "MAX_POLICY_COUNT",
    "DEFAULT_MAX_COUNT",
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "MAX_HISTORY",
    "MAX_STREAMS",
    "MAX_STREAM_BACKLOG",
    "STREAM_HEARTBEAT",
    "MAX_CONDITIONAL_VARIANTS",
    "STRANGER_REFUSAL_BURST",
    "STRANGER_REFUSAL_RATE",
]

#: TCP port of `aa router`'s HTTP endpoint unless told otherwise (the router's own is 7447).
DEFAULT_HTTP_PORT: Final = 7448

#: Address ranges allowed to call the endpoint unless configured: loopback only. Serving
#: the LAN (or more) is the operator's decision (`aa router --http-allow 192.168.0.0/16`),
#: as listening on a real interface is (`--host`): an endpoint that publishes into the mesh
#: must not be open to a network by default.
DEFAULT_ALLOW: Final = ("127.0.0.0/8", "::1/128")

#: Largest request body, in bytes (413 beyond). A published event's JSON, base64 bytes
#: included, is held whole in memory while it is parsed and checked; a megabyte is far beyond
#: a sensor reading, and bulk data belongs in a store, not an event.
MAX_BODY_BYTES: Final = 1024 * 1024

#: Most values in a request body, counted as its ',', '[' and '{' bytes (a cheap upper
#: bound: those inside strings count too): parsed and checked on the router's loop at ~1 µs
#: a value, this many keep one request under ~8 ms, within the 10 ms one request may hold it.
MAX_BODY_VALUES: Final = 8192

#: HTTP clients one router keeps. Each holds a token hash and a client cache per pattern,
#: and the router's caches are capped too (`aa.router.caches.clientcaches.MAX_CLIENT_CACHES`).
MAX_HTTP_CLIENTS: Final = 5_000

#: HTTP clients one user may hold on one router (anonymous callers are one user): with
#: `MAX_PATTERNS_PER_CLIENT` caches each, at most 1,600 of the router's 10,000 client caches,
#: so no one user, and no token-less flood from many addresses, fills the table (624
#: token-less registrations did).
MAX_HTTP_CLIENTS_PER_USER: Final = 100

#: HTTP clients registered from one address and still alive: a phone has one or two, a NAT of
#: a few dozen phones fits; one machine cannot take a user's whole share on its own.
MAX_HTTP_CLIENTS_PER_ADDRESS: Final = 50

#: Patterns one HTTP client may hold: each is a client cache the router offers every event
#: to, so one client must not be able to fill the router with them (as for TCP clients).
MAX_PATTERNS_PER_CLIENT: Final = 16

#: Longest client name, in characters: it is shown in feed titles and the monitor.
MAX_NAME_LENGTH: Final = 200

#: Seconds an HTTP client's registration (and its caches) lives without a poll: three days,
#: so a phone switched off over a weekend still finds what it missed.
DEFAULT_KEEPALIVE: Final = 3 * 24 * 3600.0

#: Shortest keep-alive a client may ask for, in seconds: one poll's round trip must fit in
#: it, or the client expires between two polls (a tiny keep-alive such as 1e-276 s would let
#: a client expire the moment it registers).
MIN_KEEPALIVE: Final = 1.0

#: Longest keep-alive a client may ask for, in seconds: a week, as the router's client caches
#: accept (a forgotten registration goes at last).
MAX_KEEPALIVE: Final = 7 * 24 * 3600.0

#: Events each pattern's cache keeps for an HTTP client that names no policy: enough for a
#: day of a busy sensor, and a feed reader that never acknowledges still sees a bounded queue.
DEFAULT_MAX_COUNT: Final = 1_000

#: Entries in one feed page unless `?limit=` says otherwise, and the most it may say: a page
#: is rendered in the router's event loop, so its size bounds the time one request takes.
DEFAULT_PAGE: Final = 100
MAX_PAGE: Final = 1_000

#: Most events `GET /events` returns at once (same reason as `MAX_PAGE`).
MAX_HISTORY: Final = 1_000

#: Concurrent `GET /stream` subscriptions: each is a pattern instance in the router's engine.
MAX_STREAMS: Final = 64

#: Events waiting to be written to one stream before the oldest are dropped (and counted),
#: so a browser that stopped reading costs bounded memory.
MAX_STREAM_BACKLOG: Final = 1_000

#: Seconds between SSE comments on an idle stream: proxies keep it open, and a client that
#: went away is noticed when the write fails.
STREAM_HEARTBEAT: Final = 10.0

#: Feed variants (format, cursor, limit) per client whose validators are remembered for
#: If-Modified-Since; a client polling more URLs gets fresh dates, never wrong 304s.
MAX_CONDITIONAL_VARIANTS: Final = 4

#: Bounds of a cache policy, as the router's `ExpiryPolicy` checks them (its MAX_POLICY_AGE,
#: 100 years, and MAX_POLICY_COUNT, which aa.router does not export): written into the
#: OpenAPI schema so that a request the schema calls valid is one the router accepts.
MAX_POLICY_AGE_S: Final = 36_500 * 86_400.0
MAX_POLICY_COUNT: Final = 1_000_000_000

#: Refusals all strangers together may have in a row (callers without a token the router
#: verified before: no token, a bad one, a client's; each also has its own budget, by
#: address, `aa.router.security.RefusalBudget`): a flood from many addresses, each under its
#: own budget, is held back as a whole. Known users' tokens still get in meanwhile; a
#: newcomer's first request may get 429 until the flood stops.
STRANGER_REFUSAL_BURST: Final = 500

#: Refusals per second all strangers together earn back: at about a millisecond each, a
#: twentieth of the router's core at most goes to refusing a flood from many addresses.
STRANGER_REFUSAL_RATE: Final = 50.0
