"""Request and response bodies. Strict: unknown fields, and values of the wrong JSON type,
are refused with 422 rather than guessed at (``"5"`` is not a count)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from aa.mesh import MAX_ID_LENGTH
from aa.mesh.protocol import MAX_PATTERN_SOURCE

from .limits import (
    MAX_KEEPALIVE,
    MAX_NAME_LENGTH,
    MAX_PATTERNS_PER_CLIENT,
    MAX_POLICY_AGE_S,
    MAX_POLICY_COUNT,
    MIN_KEEPALIVE,
)

__all__ = [
    "PublishIn",
    "Published",
    "PatternIn",
    "PatternOut",
    "PolicyIn",
    "ClientIn",
    "ClientOut",
    "Registered",
    "AckIn",
    "AckOut",
    "TicketOut",
    "ErrorOut",
    "TYPED_VALUE",
    "ISO_INSTANT",
]

_STRICT = ConfigDict(extra="forbid", strict=True)

#: An ISO 8601 instant as Python reads it (`datetime.fromisoformat`): a real date, a time to
#: the microsecond, an optional offset.
ISO_INSTANT = (
    r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"  # date
    r"(T([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?"  # time
    r"(Z|[+-](0[0-9]|1[0-3]):[0-5][0-9])?)?$"  # offset
)
_BASE64 = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1}

#: JSON Schema of one value in the typed JSON of `aa.mesh.jsonvalues` (recursive: it is the
#: component ``TypedValue`` of the OpenAPI document, added by `app`): what the value model
#: carries — ints in 64 bits, tagged bytes and datetimes, lists, maps.
TYPED_VALUE: dict[str, Any] = {
    "description": "An event value: null, bool, 64-bit int, float, string, list, map; "
    'bytes as {"$bytes": base64}, datetimes as {"$datetime": ISO 8601}',
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "string"},
        _INT64,
        {"type": "number", "not": {"type": "integer"}},
        {"type": "array", "items": {"$ref": "#/components/schemas/TypedValue"}},
        {
            "type": "object",
            "required": ["$bytes"],
            "additionalProperties": False,
            "properties": {"$bytes": {"type": "string", "pattern": _BASE64}},
        },
        {
            "type": "object",
            "required": ["$datetime"],
            "additionalProperties": False,
            "properties": {"$datetime": {"type": "string", "pattern": ISO_INSTANT}},
        },
        {
            "type": "object",
            "required": ["$map"],
            "additionalProperties": False,
            "properties": {
                "$map": {
                    "type": "object",
                    "additionalProperties": {"$ref": "#/components/schemas/TypedValue"},
                }
            },
        },
        {
            "type": "object",
            "propertyNames": {"pattern": "^([^$].*)?$"},
            "additionalProperties": {"$ref": "#/components/schemas/TypedValue"},
        },
    ],
}
_TYPED_MAP = {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/TypedValue"}}

#: Event values, meta and parameters in the typed JSON of `aa.mesh.jsonvalues`.
TypedMap = Annotated[dict[str, Any], WithJsonSchema(_TYPED_MAP)]

#: A duration as text (`aa.router.parse_duration` reads more; the schema names what is
#: surely within every bound below).
_DURATION = r"^[1-9][0-9]{0,3}(ms|s|m|h|d)$"
_KEEPALIVE_TEXT = r"^([1-9][0-9]{0,3}(s|m)|[1-9][0-9]?h|[1-7]d|1w)$"


def _whole(value: Any) -> Any:
    """JSON Schema counts 5.0 as an integer; so does this API (strict otherwise: "5" is not)."""
    return int(value) if type(value) is float and value.is_integer() else value


Seconds = Annotated[float, Field(ge=0.001, le=MAX_POLICY_AGE_S)]
#: Text the router reads as a duration (`parse_duration`: "90s", "1h30m", "2w"); the schema
#: names only the simple ones surely within bounds, and the router decides about the rest.
DurationText = Annotated[str, WithJsonSchema({"type": "string", "pattern": _DURATION})]
Count = Annotated[int, Field(ge=1, le=MAX_POLICY_COUNT), BeforeValidator(_whole)]
_META: dict[str, Any] = {
    "type": "object",
    "description": "Publisher's meta; `persist: true` (with `max_age`, `max_count`) keeps the "
    "event in every router's store (`max_count` needs an event type)",
    "properties": {
        "persist": {"type": "boolean"},
        "max_age": {
            "anyOf": [
                {"type": "number", "minimum": 0.001, "maximum": MAX_POLICY_AGE_S},
                {"type": "string", "pattern": _DURATION},
            ]
        },
        "max_count": {"type": "integer", "minimum": 1, "maximum": MAX_POLICY_COUNT},
        "mesh_cache": {"type": "boolean"},
    },
    "additionalProperties": {"$ref": "#/components/schemas/TypedValue"},
    # max_age and max_count only with persist: true (aa.router refuses them otherwise).
    "anyOf": [
        {"properties": {"max_age": False, "max_count": False}},
        {"required": ["persist"], "properties": {"persist": {"const": True}}},
    ],
}


class PublishIn(BaseModel):
    """An event to publish."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"values": {"Temperature": 101, "Sensor": "lab-1"}, "type": "reading"}],
            # A count limit is kept per event type (aa.router refuses one without a type).
            "anyOf": [
                {"properties": {"meta": {"properties": {"max_count": False}}}},
                {"required": ["type"], "properties": {"type": {"type": "string"}}},
            ],
        },
    )

    values: TypedMap = Field(
        description='Name/value pairs, typed JSON: `{"$bytes": b64}`, `{"$datetime": iso}`'
    )
    type: str | None = Field(None, max_length=1000, description="Opaque event type")
    meta: Annotated[dict[str, Any], WithJsonSchema(_META)] = Field(default_factory=dict)
    id: str | None = Field(
        None, min_length=1, max_length=MAX_ID_LENGTH, description="Id for a retried publish"
    )


class Published(BaseModel):
    id: str
    #: True when the id was already in the mesh (a retried publish), so nothing was sent.
    duplicate: bool = False


class PatternIn(BaseModel):
    """A pattern (Å §4.3): a boolean Python expression by default."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"source": "Temperature > 100"}],
            # XPath patterns are expressions only.
            "not": {
                "required": ["kernel", "format"],
                "properties": {"kernel": {"const": "xpath"}, "format": {"const": "script"}},
            },
        },
    )

    source: str = Field(min_length=1, max_length=MAX_PATTERN_SOURCE)
    kernel: Literal["python", "xpath"] = "python"
    format: Literal["expr", "script"] = "expr"


class PatternOut(PatternIn):
    model_config = ConfigDict(extra="forbid")

    id: str


class PatternAdded(PatternOut):
    #: Why the pattern may never match, as a subscriber is told at subscribe: a name that
    #: looks like a typo of one events have had, a bare name meant as text. Empty if none.
    warnings: list[str] = Field(default_factory=list)


class PolicyIn(BaseModel):
    """When cached events go: ``max_age`` in seconds or as text (``"3h"``), ``max_count``."""

    model_config = _STRICT

    max_age: Seconds | DurationText | None = None
    max_count: Count | None = None


class ClientIn(BaseModel):
    """An HTTP client to register (Å §4.8): its patterns and its cache policy."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "name": "phone",
                    "patterns": [{"source": "Temperature > 100"}],
                    "policy": {"max_age": "1d", "max_count": 500},
                    "keepalive": "3d",
                }
            ]
        },
    )

    name: str | None = Field(None, max_length=MAX_NAME_LENGTH)
    patterns: list[PatternIn] = Field(default_factory=list, max_length=MAX_PATTERNS_PER_CLIENT)
    policy: PolicyIn | None = None
    keepalive: (
        Annotated[float, Field(ge=MIN_KEEPALIVE, le=MAX_KEEPALIVE)]
        | Annotated[str, WithJsonSchema({"type": "string", "pattern": _KEEPALIVE_TEXT})]
        | None
    ) = Field(
        None, description="Seconds (or text such as '3d') without a poll before the client goes"
    )


class ClientOut(BaseModel):
    id: str
    name: str | None
    policy: dict[str, Any]
    keepalive: float
    patterns: list[PatternOut]
    queued: dict[str, int]
    #: Per pattern: events its cache took and lost to the count or age limit unacknowledged
    #: (None under a permissions file: the count could tell of events hidden to the owner).
    dropped: dict[str, int] | None
    feed: str


class Registered(ClientOut):
    #: The client's secret: send it as ``Authorization: Bearer <token>``. Shown only once.
    token: str
    #: Advice on its patterns (`PatternAdded.warnings`), each line starting with the
    #: pattern's source in backquotes. Empty if none.
    warnings: list[str] = Field(default_factory=list)


class AckIn(BaseModel):
    """Acknowledge everything up to a feed cursor, or up to an event id: one of the two."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "oneOf": [
                {"required": ["cursor"], "properties": {"cursor": {"type": "integer"}}},
                {"required": ["event"], "properties": {"event": {"type": "string"}}},
            ],
            "examples": [{"cursor": 42}],
        },
    )

    cursor: Annotated[int, Field(ge=0), BeforeValidator(_whole)] | None = None
    event: str | None = Field(None, min_length=1, max_length=MAX_ID_LENGTH)


class AckOut(BaseModel):
    cursor: int


class TicketOut(BaseModel):
    #: Put in the stream's URL: ``/stream?ticket=…&pattern=…``.
    ticket: str
    #: Seconds left to open the stream with it; it opens one.
    expires_in: float


class ErrorOut(BaseModel):
    error: str
    message: str
