"""aa.mesh — the foundation: events, the wire protocol, errors (and later flooding and
discovery). Imports nothing else of Aa."""

from .codec import MAX_FRAME_BYTES, NEED_DATA, Connection
from .errors import (
    AaError,
    AaTimeout,
    ConnectionClosed,
    ConnectionLost,
    FrameTooLarge,
    InvalidPattern,
    InvalidPolicy,
    InvalidValue,
    MalformedFrame,
    OutboxFull,
    PatternError,
    ProtocolError,
    RemoteError,
    UnknownMessage,
    UsageError,
)
from .endpoints import DEFAULT_ROUTER_PORT, format_endpoint, parse_endpoint
from .event import Event, IdGenerator
from .messages import PatternSpec
from .values import Value, Values, check_value, check_values

__all__ = [
    "AaError",
    "AaTimeout",
    "Connection",
    "DEFAULT_ROUTER_PORT",
    "ConnectionClosed",
    "ConnectionLost",
    "Event",
    "FrameTooLarge",
    "IdGenerator",
    "InvalidPattern",
    "InvalidPolicy",
    "InvalidValue",
    "MAX_FRAME_BYTES",
    "MalformedFrame",
    "NEED_DATA",
    "OutboxFull",
    "PatternError",
    "PatternSpec",
    "ProtocolError",
    "RemoteError",
    "UnknownMessage",
    "UsageError",
    "Value",
    "Values",
    "check_value",
    "check_values",
    "format_endpoint",
    "parse_endpoint",
]
