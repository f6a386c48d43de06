"""Quenching on the wire (Å §4.4): the messages between a publisher and its router, and the
``needs`` declaration of patterns (pure: no I/O).

A publisher registers an event *prototype*; every router of the mesh checks its
subscriptions against it and the publisher hears, for each subscription, when it starts and
stops matching. Registered with `aa.mesh.protocol.messages.register` like the other kinds.

Client ⇄ router::

    Quench(reg, values, type, mentioned_only) ──►      registered here and flooded mesh-wide
              ◄──────────────────────────── Quenched(reg) | Error(ref=reg, code="limit" | …)
              ◄──────────────────────────── QuenchNotice(reg, changes)   any time after:
                                            [(router id, subscription id, interested), …]
    Unquench(reg) ──────────────────────────►           removed mesh-wide

`reg` is the client's number for the registration, unique among its requests (sub_ids
included) and kept across reconnections: after a fail-over the client sends the same
`Quench` to its new router. A registration lives as long as the client's session (its router
keeps it alive across the mesh); `Unquench` or the session's end remove it.

Declaring the names a pattern needs
-----------------------------------
Å's weakness (§4.4): a prototype is an example event, so a narrow pattern such as
``SnowDepth == 80`` never matches the prototype ``SnowDepthSensor=True, SnowDepth=50`` and
the publisher never learns that someone waits for snow depths. A pattern may therefore
declare the value names it needs, in a comment of its own source, so it works from every
client, the command line and HTTP alike::

    SnowDepth == 80  # needs: SnowDepth                  python expr or script: a comment
    (: needs: SnowDepth :) //SnowDepth = 80              xpath: an XPath comment

A prototype then also matches a pattern when it carries *every* declared name (whatever its
values), besides when the pattern lets it through. Names are separated by commas or spaces;
several declarations add up. `with_needs` writes the declaration for you
(`AsyncClient.subscribe(..., needs=["SnowDepth"])` uses it).
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import InvalidValue, MalformedFrame
from ..values import Values, check_values
from .messages import Message, PatternSpec, register, unchecked

__all__ = [
    "Quench",
    "Quenched",
    "Unquench",
    "QuenchNotice",
    "QUENCH_REQUESTS",
    "QUENCH_ANSWERS",
    "MAX_NOTICE_CHANGES",
    "declared_needs",
    "with_needs",
]

#: Most changes in one `QuenchNotice`; more go in several notices. A thousand changes are a
#: few tens of KiB, far below the frame cap.
MAX_NOTICE_CHANGES: Final = 1000
#: Longest router or subscription id in a notice, in characters.
MAX_NOTICE_ID: Final = 256

_NAME = re.compile(r"[A-Za-z_][\w.\-]*\Z")
_PY_NEEDS = re.compile(r"#\s*needs\s*:(.*)\Z", re.IGNORECASE)
_XPATH_NEEDS = re.compile(r"\(:\s*needs\s*:(.*?):\)", re.IGNORECASE | re.DOTALL)


def _int(value: Any, name: str) -> None:
    if type(value) is not int:
        raise InvalidValue(f"{name} must be an int")


@register("quench")
@dataclass(frozen=True, slots=True, kw_only=True)
class Quench(Message):
    """Register (or register again, after a fail-over) an event prototype."""

    reg: int
    #: The prototype's values: an example of what the publisher would publish.
    values: Values = field(default_factory=dict)
    #: The prototype's event type, if the publisher's events have one.
    type: str | None = None
    #: Count only patterns that mention one of the prototype's value names (or declare
    #: needs): catch-alls such as ``True`` or ``type == "quote"`` then wake nobody.
    mentioned_only: bool = False

    def __post_init__(self) -> None:
        _int(self.reg, "reg")
        if type(self.values) is not dict:
            raise InvalidValue("values must be a map")
        check_values(self.values, "values")
        if self.type is not None and type(self.type) is not str:
            raise InvalidValue("type must be a str or nil")
        if type(self.mentioned_only) is not bool:
            raise InvalidValue("mentioned_only must be a bool")


@register("quenched")
@dataclass(frozen=True, slots=True, kw_only=True)
class Quenched(Message):
    """The router took the registration and flooded it."""

    reg: int

    def __post_init__(self) -> None:
        _int(self.reg, "reg")


@register("unquench")
@dataclass(frozen=True, slots=True, kw_only=True)
class Unquench(Message):
    """Remove a registration mesh-wide (unknown ones are ignored)."""

    reg: int

    def __post_init__(self) -> None:
        _int(self.reg, "reg")


@register("quench-notice")
@dataclass(frozen=True, slots=True, kw_only=True)
class QuenchNotice(Message):
    """Subscriptions that started (True) or stopped (False) matching a registration, each as
    (router id, subscription id, interested). A subscription id is opaque and unique within
    its router."""

    reg: int
    changes: tuple[tuple[str, str, bool], ...] = ()

    def __post_init__(self) -> None:
        _int(self.reg, "reg")
        if type(self.changes) not in (list, tuple):
            raise InvalidValue("changes must be a list")
        if len(self.changes) > MAX_NOTICE_CHANGES:
            raise InvalidValue(f"at most {MAX_NOTICE_CHANGES} changes in one notice")
        out = []
        for c in self.changes:
            if (
                type(c) not in (list, tuple)
                or len(c) != 3
                or type(c[0]) is not str
                or type(c[1]) is not str
                or type(c[2]) is not bool
                or len(c[0]) > MAX_NOTICE_ID
                or len(c[1]) > MAX_NOTICE_ID
            ):
                raise InvalidValue("each change is [router id, subscription id, interested]")
            out.append((c[0], c[1], c[2]))
        object.__setattr__(self, "changes", tuple(out))

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "reg": self.reg, "changes": [list(c) for c in self.changes]}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> QuenchNotice:
        try:
            return cls(reg=unchecked(data, "reg"), changes=data.get("changes", ()))
        except InvalidValue as exc:
            raise MalformedFrame(f"bad 'quench-notice' message: {exc}") from None


#: Kinds a client sends its router about quenching.
QUENCH_REQUESTS: Final = frozenset({Quench, Unquench})
#: Kinds a router sends a client about quenching (besides `Error`).
QUENCH_ANSWERS: Final = frozenset({Quenched, QuenchNotice})


# -- needs declarations --------------------------------------------------------------------


def declared_needs(spec: PatternSpec) -> frozenset[str]:
    """The value names *spec* declares it needs (see the module docstring); empty if none.

    >>> sorted(declared_needs(PatternSpec(source="SnowDepth == 80  # needs: SnowDepth, Site")))
    ['Site', 'SnowDepth']
    >>> declared_needs(PatternSpec(source='Note == "# needs: X"'))   # in a string: no
    frozenset()
    """
    found: list[str] = []
    if spec.kernel == "xpath":
        for m in _XPATH_NEEDS.finditer(spec.source):
            found.extend(_split(m.group(1)))
    elif "needs" in spec.source:
        try:
            for tok in tokenize.generate_tokens(io.StringIO(spec.source).readline):
                if tok.type == tokenize.COMMENT:
                    comment = _PY_NEEDS.match(tok.string.strip())
                    if comment:
                        found.extend(_split(comment.group(1)))
        except (tokenize.TokenError, SyntaxError, IndentationError):
            pass  # the pattern does not compile anyway; its router says why
    return frozenset(n for n in found if _NAME.match(n))


def with_needs(spec: PatternSpec, names: Iterable[str]) -> PatternSpec:
    """*spec* with a declaration of *names* written into its source (first line), so that a
    prototype carrying them all matches it. Raises `InvalidValue` for a name that is not
    one (letters, digits, ``_ . -``, not starting with a digit).

    >>> with_needs(PatternSpec(source="SnowDepth == 80"), ["SnowDepth"]).source
    '# needs: SnowDepth\\nSnowDepth == 80'
    """
    names = list(dict.fromkeys(names))
    if not names:
        return spec
    for n in names:
        if type(n) is not str or not _NAME.match(n):
            raise InvalidValue(f"{n!r} is not a value name")
    listed = ", ".join(names)
    head = f"(: needs: {listed} :) " if spec.kernel == "xpath" else f"# needs: {listed}\n"
    return PatternSpec(kernel=spec.kernel, format=spec.format, source=head + spec.source)


def _split(text: str) -> list[str]:
    return [n for n in re.split(r"[,\s]+", text.strip()) if n]
