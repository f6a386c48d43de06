"""The one exception tree of Aa (pure: no I/O).

::

    AaError                              root: `except AaError` catches everything Aa raises
    ├── UsageError (ValueError)          our own misuse of the API: bad argument, bad config
    │   ├── InvalidValue                 a value outside the event value model
    │   ├── InvalidPolicy                an expiry policy that makes no sense
    │   ├── InvalidPattern (UsageError)  a pattern that cannot be compiled (local check)
    │   └── UnknownCache                 no client cache under that client id (never was,
    │                                    removed, or its keep-alive lapsed)
    ├── ProtocolError                    the peer sent something we cannot accept
    │   ├── FrameTooLarge                a frame over the negotiated cap
    │   ├── MalformedFrame               not msgpack, not a map, missing/bad fields
    │   └── UnknownMessage               a `kind` we do not know
    ├── RemoteError                      the other side refused our request, with its reason
    │   └── PatternError                 our pattern was refused, or stopped while running
    ├── AccessDenied                     the gate said no (`aa.router.security`); the peer's doing
    │   ├── NotAuthenticated             credentials missing, malformed, expired or revoked (401)
    │   └── PermissionDenied             a known user without the right; names the rule (403)
    ├── OutboxFull                       a client's outbox is at its cap (publish_nowait)
    ├── StoreError                       the persistent store could not do what was asked
    │   ├── StoreFull                    too many events wait to be written: back-pressure
    │   └── StoreUnavailable             the database cannot be reached or used;
    │                                    `__cause__` holds the driver's error
    ├── ConnectionClosed                 we (or an orderly peer) closed it: not an accident
    ├── ConnectionLost                   it broke under us; `__cause__` holds the OS error
    └── AaTimeout (TimeoutError)         an Aa operation ran out of time

Errors a peer caused (`ProtocolError`, `RemoteError`) are apart from errors in our own use of
the API (`UsageError`), so a router can answer the first with an error frame to that one peer
and let the second propagate to the programmer who made it.
"""

from __future__ import annotations

__all__ = [
    "AaError",
    "UsageError",
    "InvalidValue",
    "InvalidPolicy",
    "InvalidPattern",
    "ProtocolError",
    "FrameTooLarge",
    "ForeignProtocol",
    "MalformedFrame",
    "UnknownMessage",
    "RemoteError",
    "PatternError",
    "AccessDenied",
    "NotAuthenticated",
    "PermissionDenied",
    "OutboxFull",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "UnknownCache",
    "ConnectionClosed",
    "ConnectionLost",
    "AaTimeout",
]


class AaError(Exception):
    """Root of every error Aa raises."""


class UsageError(AaError, ValueError):
    """The API was used wrongly: a bad argument, a bad configuration."""


class InvalidValue(UsageError):
    """A value outside the event value model (see `aa.mesh.values`)."""


class InvalidPolicy(UsageError):
    """An expiry or cache policy that makes no sense (negative age, zero count, bad unit)."""


class InvalidPattern(UsageError):
    """A pattern that cannot be compiled; raised where the pattern is checked locally."""


class ProtocolError(AaError):
    """The peer sent something we cannot accept. The connection it came on is closed."""

    #: Short machine-readable code sent in the error frame.
    code = "protocol"


class FrameTooLarge(ProtocolError):
    code = "frame-too-large"


class ForeignProtocol(FrameTooLarge):
    """The other end speaks another protocol (HTTP, TLS): its first bytes read as a frame
    length far over the cap. Trying again will not change that."""

    code = "foreign-protocol"


class MalformedFrame(ProtocolError):
    code = "malformed"


class UnknownMessage(ProtocolError):
    code = "unknown-kind"


class RemoteError(AaError):
    """The other side refused a request and said why (`code`, `message`)."""

    def __init__(self, message: str, *, code: str = "error") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PatternError(RemoteError):
    """A pattern was refused at subscribe time, or stopped by the sandbox while running."""


class AccessDenied(AaError):
    """The router's gate refused a request; the message says why (and names the rule)."""


class NotAuthenticated(AccessDenied):
    """No credentials where they are required, or ones that do not verify: malformed, signed
    by another CA, expired, or revoked."""


class PermissionDenied(AccessDenied):
    """The user is known but its permissions do not allow this; the message names the rule."""


class OutboxFull(AaError):
    """`publish_nowait` found the client's outbox full: no router has taken its events yet.
    `await publish(...)` waits for room instead."""


class StoreError(AaError):
    """The persistent store could not do what was asked."""


class StoreFull(StoreError):
    """Too many events wait to be written (the database is slow or gone): back-pressure."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or used; `__cause__` holds the underlying error."""


class UnknownCache(UsageError):
    """No client cache is registered for that client (never was, removed, or its keep-alive
    lapsed)."""


class ConnectionClosed(AaError):
    """The connection was closed on purpose (by us, or by an orderly peer)."""


class ConnectionLost(AaError):
    """The connection broke under us; `__cause__` holds the underlying error."""


class AaTimeout(AaError, TimeoutError):
    """An Aa operation ran out of time."""
