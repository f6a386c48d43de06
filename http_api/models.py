"""Request and response bodies. Strict: unknown fields, and values of the wrong JSON type,
are refused with 422 rather than guessed at (``"5"`` is not a count)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from aa.mesh import MAX_ID_LENGTH
from aa.mesh.protocol import MAX_PATTERN_SOURCE

from .limits import MAX_NAME_LENGTH, MAX_PATTERNS_PER_CLIENT

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
    "ErrorOut",
]

_STRICT = ConfigDict(extra="forbid", strict=True)

#: Event values, meta and parameters in the typed JSON of `aa.mesh.jsonvalues`.
TypedMap = dict[str, Any]


class PublishIn(BaseModel):
    """An event to publish."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"values": {"Temperature": 101, "Sensor": "lab-1"}, "type": "reading"}]},
    )

    values: TypedMap = Field(description="Name/value pairs, typed JSON: `{\"$bytes\": b64}`, `{\"$datetime\": iso}`")
    type: str | None = Field(None, max_length=1000, description="Opaque event type")
    meta: TypedMap = Field(default_factory=dict, description="Publisher's meta, e.g. `{\"persist\": true}`")
    id: str | None = Field(None, min_length=1, max_length=MAX_ID_LENGTH, description="Id for a retried publish")


class Published(BaseModel):
    id: str
    #: True when the id was already in the mesh (a retried publish), so nothing was sent.
    duplicate: bool = False


class PatternIn(BaseModel):
    """A pattern (Å §4.3): a boolean Python expression by default."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [{"source": "Temperature > 100"}]}
    )

    source: str = Field(min_length=1, max_length=MAX_PATTERN_SOURCE)
    kernel: Literal["python", "xpath"] = "python"
    format: Literal["expr", "script"] = "expr"


class PatternOut(PatternIn):
    model_config = ConfigDict(extra="forbid")

    id: str


class PolicyIn(BaseModel):
    """When cached events go: ``max_age`` in seconds or as text (``"3h"``), ``max_count``."""

    model_config = _STRICT

    max_age: float | int | str | None = None
    max_count: int | None = None


class ClientIn(BaseModel):
    """An HTTP client to register (Å §4.8): its patterns and its cache policy."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"name": "phone", "patterns": [{"source": "Temperature > 100"}],
                          "policy": {"max_age": "1d", "max_count": 500}, "keepalive": "3d"}]
        },
    )

    name: str | None = Field(None, max_length=MAX_NAME_LENGTH)
    patterns: list[PatternIn] = Field(default_factory=list, max_length=MAX_PATTERNS_PER_CLIENT)
    policy: PolicyIn | None = None
    keepalive: float | int | str | None = Field(
        None, description="Seconds (or text such as '3d') without a poll before the client goes"
    )


class ClientOut(BaseModel):
    id: str
    name: str | None
    policy: dict[str, Any]
    keepalive: float
    patterns: list[PatternOut]
    queued: dict[str, int]
    feed: str


class Registered(ClientOut):
    #: The client's secret: send it as ``Authorization: Bearer <token>``. Shown only once.
    token: str


class AckIn(BaseModel):
    """Acknowledge everything up to a feed cursor, or up to an event id."""

    model_config = _STRICT

    cursor: int | None = Field(None, ge=0)
    event: str | None = Field(None, min_length=1, max_length=MAX_ID_LENGTH)


class AckOut(BaseModel):
    cursor: int


class ErrorOut(BaseModel):
    error: str
    message: str
