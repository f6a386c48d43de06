"""Who may do what: per-user permissions from a TOML file (`aa router --permissions FILE`).

::

    # Every key not given is denied. Types are glob patterns ("sensor.*"); "*" is any type,
    # untyped events included, and "" is the untyped events only.
    [anonymous]                 # connections without a certificate
    publish = []
    subscribe = ["weather"]     # the types of events this user's patterns may receive
    patterns = "predicates"     # "scripts" (any pattern), "predicates" (no scripts), "none"
    persist = false             # may ask the store to keep events
    client_caches = false       # may own client caches
    quench = false              # may register quench prototypes
    admin = false               # may change the router's picture of the mesh
                                # (`aa mesh forget`)

    [users.alice]               # the user named in a certificate the mesh CA signed
    publish = ["*"]
    subscribe = ["*"]
    patterns = "scripts"
    persist = true
    client_caches = true
    quench = true
    admin = true

    [users."*"]                 # any other user with a certificate

Without a file everyone may do everything (and `anonymous` is allowed unless
`--no-anonymous`), except administration: that is for clients on this machine (loopback)
only, since without a file anyone who reaches the port is anonymous. A user no section
covers may do nothing. Subscribing checks the pattern kind at once, and the types when events
are delivered: a subscription receives only the types its owner may receive, so no pattern can
read what its owner may not see.

Loading is all or nothing: a malformed file is refused with its line and the reason, and a
reload that fails keeps the rules in force (`Permissions.reload`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aa.mesh import PatternSpec, UsageError

from ..patterns import admits
from .tls import ANONYMOUS

__all__ = ["Rules", "Permissions", "ALLOW_ALL", "PATTERN_KINDS"]

#: The tier `patterns = "predicates"` admits (`aa.router.patterns.PREDICATE_TIER`).
PREDICATE = "predicate"
#: Values of `patterns`, from most to least allowed.
PATTERN_KINDS = ("scripts", "predicates", "none")
_LISTS = ("publish", "subscribe")
_FLAGS = ("persist", "client_caches", "quench", "admin")
_KEYS = frozenset((*_LISTS, *_FLAGS, "patterns"))
#: Entries in one type list: the check runs per published event, and a list this long is a
#: mistake, not a policy.
MAX_TYPES = 1000
#: Largest permissions file, bytes.
MAX_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Rules:
    """One section of the permissions file: what its user may do."""

    #: Where the rules come from, for error messages: ``[users.alice] in perms.toml``.
    source: str
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    patterns: str = "none"
    persist: bool = False
    client_caches: bool = False
    quench: bool = False
    admin: bool = False

    @property
    def publish_any(self) -> bool:
        return "*" in self.publish

    @property
    def subscribe_any(self) -> bool:
        return "*" in self.subscribe

    def may_publish(self, type_: str | None) -> bool:
        return _allowed(self.publish, type_)

    def may_receive(self, type_: str | None) -> bool:
        return _allowed(self.subscribe, type_)

    def may_run(self, tier: str) -> bool:
        """Whether this user's patterns may run in *tier* (`aa.router.patterns.PREDICATE_TIER`
        is "predicate"; anything else is pattern code)."""
        return self.patterns == "scripts" or (self.patterns == "predicates" and tier == PREDICATE)

    def pattern_refusal(self, spec: PatternSpec, tier: str) -> str | None:
        """Why this user may not subscribe *spec* (or query with it), naming the rule; None
        when it may. *tier* is where the router would run it (`PatternEngine.tier`): under
        ``patterns = "predicates"`` only what compiles to the predicate tier is admitted,
        so no pattern code — lambdas, comprehensions, loops, XPath — runs for this user.
        *tier* is required: a caller that forgot it would let pattern code through."""
        if not self.subscribe:
            return self.refusal("subscribe", "subscribe to anything")
        if self.patterns == "none":
            return self.refusal("patterns", "subscribe patterns")
        if self.patterns == "predicates":
            if spec.format == "script":
                return self.refusal("patterns", "register scripts, only predicate patterns")
            if spec.kernel != "python" or tier != PREDICATE:
                return self.refusal(
                    "patterns",
                    "run pattern code, only predicates (comparisons of values with constants, "
                    "and/or/not, in, startswith...)",
                )
        return None

    def refusal(self, rule: str, what: str) -> str:
        """A one-line denial naming the rule: ``not allowed to persist events (rule persist =
        false in [users.bob] in perms.toml)``."""
        value = getattr(self, rule)
        shown = (
            "true"
            if value is True
            else "false"
            if value is False
            else (
                f'"{value}"'
                if isinstance(value, str)
                else "[" + ", ".join(f'"{v}"' for v in value) + "]"
            )
        )
        return f"not allowed to {what} (rule {rule} = {shown} in {self.source})"


def _allowed(patterns: tuple[str, ...], type_: str | None) -> bool:
    return admits(patterns, type_)  # one reading of type lists, for rules and pattern scopes


#: The rules when there is no permissions file: everything.
ALLOW_ALL = Rules(
    source="no permissions file",
    publish=("*",),
    subscribe=("*",),
    patterns="scripts",
    persist=True,
    client_caches=True,
    quench=True,
    admin=True,  # from loopback only: `Permissions.admin_refusal`
)


class Permissions:
    """The rules of one permissions file, by user. `Permissions.load(path)` raises
    `UsageError` with the line and the reason for a malformed file."""

    def __init__(
        self,
        path: Path | None,
        users: dict[str, Rules],
        others: Rules | None,
        anonymous: Rules | None,
    ) -> None:
        self.path = path
        self._users = users
        self._others = others
        self._anonymous = anonymous
        self._digest: str | None = None

    @classmethod
    def open(cls) -> Permissions:
        """No file: everyone may do everything."""
        return cls(None, {}, ALLOW_ALL, ALLOW_ALL)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Permissions:
        p = Path(path)
        try:
            if p.stat().st_size > MAX_FILE_BYTES:
                raise UsageError(f"permissions file {p} is larger than {MAX_FILE_BYTES} bytes")
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"permissions file {p} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read permissions file {p}: {exc}") from None
        return cls.parse(text, p)

    @classmethod
    def parse(cls, text: str, path: Path | None = None) -> Permissions:
        where = str(path) if path else "the permissions"
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{where}: {exc}") from None
        users: dict[str, Rules] = {}
        others = anonymous = None
        for top, body in data.items():
            if top == ANONYMOUS:
                anonymous = _section(text, where, (top,), body)
            elif top == "users":
                if type(body) is not dict:
                    raise _error(
                        text, where, (), top, "'users' must be a table of [users.NAME] sections"
                    )
                for name, rules in body.items():
                    section = _section(text, where, ("users", name), rules)
                    if name == "*":
                        others = section
                    else:
                        users[name] = section
            else:
                raise _error(
                    text, where, (), top, f"unknown section {top!r} (known: anonymous, users.NAME)"
                )
        return cls(path, users, others, anonymous)

    def rules_for(self, user: str) -> Rules | None:
        """The rules for *user* (`ANONYMOUS` for connections without a certificate); None
        when no section covers it: that user may do nothing."""
        if user == ANONYMOUS:
            return self._anonymous
        return self._users.get(user, self._others)

    def digest(self) -> str | None:
        """A short hash of the rules (not of the file: comments, order and the file's path
        do not count), for routers to tell whether they enforce the same ones; None without
        a file (everything allowed)."""
        if self.path is None:
            return None
        if self._digest is not None:  # the rules never change: a reload makes new Permissions
            return self._digest
        sections: dict[str, Any] = {f"users.{name}": r for name, r in self._users.items()}
        sections["users.*"] = self._others
        sections[ANONYMOUS] = self._anonymous
        canonical = {
            name: None
            if r is None
            else [
                sorted(r.publish),
                sorted(r.subscribe),
                r.patterns,
                r.persist,
                r.client_caches,
                r.quench,
                r.admin,
            ]
            for name, r in sections.items()
        }
        text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
        self._digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return self._digest

    def admin_refusal(self, user: str, host: str) -> str | None:
        """Why *user*, calling from *host*, may not administer the router (`aa mesh
        forget`); None when it may. Without a file only a client on this machine may: anyone
        who reaches the port is anonymous then, and must not reshape the router's mesh. With
        a file, the user's ``admin`` flag decides, wherever it calls from."""
        if self.path is None:
            if _is_loopback(host):
                return None
            return (
                f"not allowed to administer this router from {host}: without a permissions "
                "file only clients on its own machine (loopback) may; give admin = true "
                "to a user in a permissions file to allow others"
            )
        rules = self.rules_for(user)
        if rules is None:
            return "not allowed to administer this router (no rule in the permissions file)"
        if not rules.admin:
            return rules.refusal("admin", "administer this router")
        return None

    def reload(self) -> Permissions:
        """The rules as the file says now; raises `UsageError` (the caller keeps `self`)."""
        if self.path is None:
            return self
        return Permissions.load(self.path)


def _is_loopback(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _section(text: str, where: str, path: tuple[str, ...], body: Any) -> Rules:
    name = ".".join(p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else f'"{p}"' for p in path)
    if type(body) is not dict:
        raise _error(text, where, (), path[-1], f"[{name}] must be a table")
    values: dict[str, Any] = {}
    for key, value in body.items():
        if key not in _KEYS:
            raise _error(
                text,
                where,
                path,
                key,
                f"unknown key {key!r} in [{name}] (known: {', '.join(sorted(_KEYS))})",
            )
        if key in _LISTS:
            if type(value) is not list or not all(type(v) is str for v in value):
                raise _error(
                    text, where, path, key, f"{key} in [{name}] must be a list of type patterns"
                )
            if len(value) > MAX_TYPES:
                raise _error(
                    text, where, path, key, f"{key} in [{name}] has more than {MAX_TYPES} entries"
                )
            values[key] = tuple(value)
        elif key in _FLAGS:
            if type(value) is not bool:
                raise _error(text, where, path, key, f"{key} in [{name}] must be true or false")
            values[key] = value
        elif value not in PATTERN_KINDS:
            raise _error(
                text,
                where,
                path,
                key,
                f"patterns in [{name}] must be one of {', '.join(PATTERN_KINDS)}",
            )
        else:
            values[key] = value
    return Rules(source=f"[{name}] in {where}", **values)


def _error(text: str, where: str, section: tuple[str, ...], key: str, reason: str) -> UsageError:
    return UsageError(f"{where}, line {_line_of(text, section, key)}: {reason}")


def _line_of(text: str, section: tuple[str, ...], key: str) -> int:
    """The line where *key* is set in table *section* (tomllib gives no positions for valid
    TOML; this finds the usual layouts, and the section's header line otherwise)."""
    current: tuple[str, ...] = ()
    header = 1
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("["):
            parts = tuple(p.strip().strip('"').strip("'") for p in stripped.strip("[]").split("."))
            current = parts
            if parts == section:
                header = number
            if not section and parts and parts[0] == key:
                return number
            continue
        if current == section and re.match(rf"""\s*["']?{re.escape(key)}["']?\s*=""", line):
            return number
    return header
