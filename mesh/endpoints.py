"""Network endpoints as text, "host:port" (pure: no I/O).

Routers tell each other where they listen as "host:port" ("[v6addr]:port" for IPv6), in
beacons, hellos, router lists and the topology file. These helpers parse and check that text.
"""

from __future__ import annotations

from typing import Final

from .errors import InvalidValue

__all__ = [
    "DEFAULT_ROUTER_PORT",
    "parse_endpoint",
    "format_endpoint",
    "check_endpoint",
    "is_unspecified",
    "MAX_ENDPOINT_LENGTH",
]

#: The TCP port a router listens on unless told otherwise (clients and peer routers share it).
DEFAULT_ROUTER_PORT: Final = 7447

#: Longest endpoint text accepted, in characters: a 253-character DNS name, brackets, a colon
#: and five digits. Endpoints come from peers and are stored, so they are capped.
MAX_ENDPOINT_LENGTH: Final = 262

_UNSPECIFIED = frozenset({"", "0.0.0.0", "::"})


def parse_endpoint(text: object) -> tuple[str, int]:
    """Split "host:port" into (host, port). Raises `InvalidValue` when it is not one.

    >>> parse_endpoint("127.0.0.1:4000"), parse_endpoint("[::1]:4000")
    (('127.0.0.1', 4000), ('::1', 4000))
    """
    if type(text) is not str or not 0 < len(text) <= MAX_ENDPOINT_LENGTH:
        raise InvalidValue(
            f"an endpoint must be 'host:port' of at most {MAX_ENDPOINT_LENGTH} characters"
        )
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not port_text.isascii():
        raise InvalidValue(f"endpoint {text!r} is not 'host:port'")
    port = int(port_text)
    if not 0 < port < 65536:
        raise InvalidValue(f"endpoint {text!r}: port must be 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise InvalidValue(f"endpoint {text!r}: brackets are for IPv6 addresses only")
    elif ":" in host:
        raise InvalidValue(f"endpoint {text!r}: write an IPv6 host in brackets, '[::1]:port'")
    if not host or any(c.isspace() for c in host):
        raise InvalidValue(f"endpoint {text!r} has no valid host")
    return host, port


def check_endpoint(text: object, name: str = "endpoint") -> str:
    """Return *text* if it is a valid endpoint, else raise `InvalidValue` naming *name*."""
    try:
        parse_endpoint(text)
    except InvalidValue as exc:
        raise InvalidValue(f"{name}: {exc}") from None
    assert isinstance(text, str)  # parse_endpoint raised for anything else
    return text


def format_endpoint(host: str, port: int) -> str:
    """The endpoint text for (host, port).

    >>> format_endpoint("::1", 4000)
    '[::1]:4000'
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_unspecified(host: str) -> bool:
    """Whether *host* means "every address of this machine" ("", 0.0.0.0, ::): such an
    endpoint cannot be dialled, and a receiver puts the sender's address in its place."""
    return host in _UNSPECIFIED
