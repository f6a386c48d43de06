"""`SecurityConfig` (what the operator asked for) and `Gate` (the router's one object for
it): contexts, identities, admission of clients and peers, permissions, reload.

The router asks the gate at a few points only — accepting a connection (`serve`), a
client's hello (`admit_client`), a peer's hello (`admit_peer`), a publish (`screen`), a
subscribe or cache or quench request (`rules_for`) — and never otherwise, so a router
without any of it pays nothing per event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.x509.oid import NameOID

from aa.mesh import Event, NotAuthenticated, PatternSpec, PermissionDenied, UsageError

from .admission import (
    HELLO_DEADLINE,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_ADDRESS,
    Admission,
    RateLimited,
)
from .crl import RevocationList, file_stamp
from .guard import AllowList, HandshakeGuard
from .listener import Listener
from .permissions import Permissions, Rules
from .refusals import RefusalBudget
from .tls import (
    ANONYMOUS,
    NAME_RE,
    Identity,
    check_cert_file,
    client_context,
    id_matches,
    identity_of,
    server_context,
)
from .tokens import TokenVerifier

__all__ = ["SecurityConfig", "Gate", "NO_RULE"]

log = logging.getLogger("aa.router.security")

_Path = str | os.PathLike[str] | None

#: Why a user that no section of the permissions file covers is refused (after its name).
NO_RULE = "may do nothing: no rule in the permissions file covers this user"
#: What an operator who meets `NO_RULE` as anonymous does about it (`aa mesh` on their own
#: router, say).
_ANONYMOUS_HINT: Final = (
    " (callers without a certificate or token: give them an [anonymous] section, an empty "
    "one to let them look, or connect with a certificate or token)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SecurityConfig:
    """Who may connect and what they may do. All off by default: an open router.

    >>> SecurityConfig().tls
    False
    """

    #: The router's certificate and key (PEM); with them the port speaks TLS only.
    cert: Path | None = None
    key: Path | None = None
    #: The mesh CA (PEM). With it, peer links are mutual TLS (only routers this CA signed
    #: join), and clients presenting a certificate it signed are users.
    ca: Path | None = None
    #: Whether clients without a certificate (user "anonymous") may connect.
    anonymous: bool = True
    #: The permissions file (TOML, `aa.router.security.permissions`); None: all allowed.
    permissions: Path | None = None
    #: The mesh's revocation list (``DIR/crl.pem`` from ``aa certs``); None: nothing revoked.
    #: Re-read on SIGHUP and when the file changes (`aa.router.security.crl`).
    crl: Path | None = None
    #: Address ranges (CIDR) clients / peer routers may connect from; empty: any.
    allow_clients: tuple[str, ...] = ()
    allow_peers: tuple[str, ...] = ()
    #: Connections in all and from one address (`aa.router.security.admission`; the total
    #: is also kept below the open-file limit), and seconds a connection may take to say hello.
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS
    hello_deadline: float = HELLO_DEADLINE

    def __post_init__(self) -> None:
        for name in ("cert", "key", "ca", "permissions", "crl"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))
        if (self.cert is None) != (self.key is None):
            raise UsageError(
                "give the router's certificate and its key together (--cert and --key)"
            )
        if self.ca is not None and self.cert is None:
            raise UsageError("a CA needs the router's own certificate and key too (--cert, --key)")
        if self.crl is not None and self.ca is None:
            raise UsageError("a revocation list needs the mesh CA that signed it (--ca)")
        if not self.anonymous and self.ca is None:
            raise UsageError("refusing anonymous clients needs a CA to recognise users by (--ca)")
        for name in ("allow_clients", "allow_peers"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
            AllowList(getattr(self, name))  # raises UsageError for a bad range
        for name in ("max_connections", "max_connections_per_address"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 1:
                raise UsageError(f"{name} must be a positive int")
        if not isinstance(self.hello_deadline, (int, float)) or not 0 < self.hello_deadline < float(
            "inf"
        ):
            raise UsageError("hello_deadline must be a positive number of seconds")

    @property
    def tls(self) -> bool:
        return self.cert is not None

    @property
    def active(self) -> bool:
        """Whether anything is asked for at all."""
        return (
            self.tls
            or bool(self.permissions or self.allow_clients or self.allow_peers or self.crl)
            or not self.anonymous
        )


class Gate:
    """The router's security, built from a `SecurityConfig`. Raises `UsageError` for a
    missing, unreadable or expired file and a malformed permissions file."""

    def __init__(self, config: SecurityConfig | None = None) -> None:
        self.config = cfg = config or SecurityConfig()
        self.server_tls: ssl.SSLContext | None = None
        #: The context peer links are dialled with (None: plaintext).
        self.dial_tls: ssl.SSLContext | None = None
        #: The name in the router's certificate (its ids begin with it when there is a CA).
        self.name: str | None = None
        if cfg.cert is not None and cfg.key is not None:
            self.server_tls = server_context(cfg.cert, cfg.key, cfg.ca)
            if cfg.ca is not None:
                self.dial_tls = client_context(cfg.ca, cfg.cert, cfg.key)
                cert = check_cert_file(cfg.cert)
                cn = [a.value for a in cert.subject if a.oid == NameOID.COMMON_NAME]
                if not cn or not NAME_RE.match(str(cn[0])):
                    raise UsageError(
                        f"certificate {cfg.cert} has no usable name (made by 'aa certs router'?)"
                    )
                self.name = str(cn[0])
            else:
                # No CA: clients get encryption and the router's identity cannot be checked
                # by peers; peer links are encrypted but not authenticated (docs/security.md).
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                self.dial_tls = ctx
        #: Verifies bearer tokens (`aa.router.security.tokens`); None without a mesh CA.
        self.tokens: TokenVerifier | None = None
        self._ca: x509.Certificate | None = None
        if cfg.ca is not None:
            self._ca = check_cert_file(cfg.ca)
            self.tokens = TokenVerifier(self._ca)
        #: The revocations in force (`aa.router.security.crl`); empty without ``--crl``.
        self.crl = (
            RevocationList.load(cfg.crl, self._ca)
            if cfg.crl is not None and self._ca is not None
            else RevocationList()
        )
        #: One log line per refused source per interval (`RefusalLog`).
        self.refusals = RefusalLog()
        #: Refused connections per address at the TCP port (`RefusalBudget`): an address
        #: refused again and again has its new connections closed as they are accepted.
        self.strangers = RefusalBudget()
        #: Called after every reload of the rules or the revocation list, once the router held
        #: its TCP sessions to them: other doors (the HTTP endpoint's streams) re-check theirs.
        self.reloaded: list[Callable[[], None]] = []
        self.permissions = (
            Permissions.load(cfg.permissions) if cfg.permissions else Permissions.open()
        )
        self.clients = AllowList(cfg.allow_clients)
        self.peers = AllowList(cfg.allow_peers)
        #: Back-off for dialled addresses whose handshake or identity was refused.
        self.guard = HandshakeGuard()
        #: Caps and the hello deadline of the router's connections.
        self.admission = Admission(
            max_total=cfg.max_connections,
            max_per_address=cfg.max_connections_per_address,
            hello_deadline=cfg.hello_deadline,
        )
        _quiet_accept_errors()

    @property
    def mutual(self) -> bool:
        """Peers must show a certificate the mesh CA signed."""
        return self.config.ca is not None

    # -- connections ------------------------------------------------------------------------

    async def serve(
        self,
        factory: Callable[[], asyncio.Protocol],
        host: str,
        port: int,
        counters: dict[str, int],
    ) -> Listener:
        """Listen on (host, port) with TLS and the address checks; ready on return."""
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(1024)
        except BaseException:
            sock.close()
            raise
        both = self.clients and self.peers
        allow = (
            (lambda h: self.clients.allows(h) or self.peers.allows(h))
            if both
            else AllowList().allows
        )
        listener = Listener(
            sock,
            factory,
            tls=self.server_tls,
            allow=allow,
            counters=counters,
            note=self.refusals.note,
            budget=self.strangers,
        )
        listener.start()
        return listener

    def identity(self, transport: asyncio.BaseTransport) -> Identity:
        return identity_of(transport.get_extra_info("ssl_object"))

    def authenticate(self, token: str | None, now: float) -> Identity:
        """The identity a bearer *token* names (``aa certs token``; the HTTP endpoint's way
        in). Without one: anonymous, unless this router refuses anonymous clients. Raises
        `NotAuthenticated` saying why: no token where one is needed, or a token that does
        not verify with the mesh CA (malformed, another CA's, expired, revoked)."""
        if not token:
            if not self.config.anonymous:
                raise NotAuthenticated(
                    "this router refuses anonymous clients: send a token from 'aa certs token' "
                    "(Authorization: Bearer TOKEN)"
                )
            return Identity()
        if self.tokens is None:
            raise NotAuthenticated("this router has no mesh CA (--ca): it accepts no user tokens")
        claims = self.tokens.verify(token, now=now, revoked=self.revoked)
        return Identity(user=claims.user)

    def revoked(self, user: str, issued: int) -> bool:
        """Whether a token issued to *user* at Unix time *issued* is revoked (``aa certs
        revoke``: a cut-off per user in the CRL, `aa.router.security.crl`)."""
        return self.crl.token_revoked(user, issued)

    def admit_client(self, identity: Identity, host: str, now: float | None = None) -> str | None:
        """Why a client hello is refused, or None. A refusal spends one of *host*'s
        (`strangers`) at *now* (monotonic seconds; default: the clock's now)."""
        refusal = self._client_refusal(identity, host)
        if refusal is not None:
            self.strangers.refused(host, time.monotonic() if now is None else now)
        return refusal

    def _client_refusal(self, identity: Identity, host: str) -> str | None:
        if not self.clients.allows(host):
            return f"clients from {host} are not allowed here (--allow-clients)"
        revoked = self.certificate_refusal(identity)
        if revoked is not None:
            return revoked
        if identity.server_auth:
            return (
                f"certificate {identity.user!r} is a router's (key usage serverAuth), not a "
                "user's: clients need one from 'aa certs client'"
            )
        if identity.user == ANONYMOUS and not self.config.anonymous:
            return (
                "this router refuses anonymous clients: present a certificate the mesh CA signed "
                "(AA_CERT, AA_KEY)"
            )
        return None

    def admit_peer(self, identity: Identity, host: str | None, router_id: str) -> str | None:
        """Why a peer router's hello is refused, or None (ids are bound to certificates)."""
        if host is not None and not self.peers.allows(host):
            return f"routers from {host} are not allowed here (--allow-peers)"
        if not self.mutual:
            return None
        revoked = self.certificate_refusal(identity)
        if revoked is not None:
            return revoked
        if not identity.router:
            return (
                "peer links need a router certificate the mesh CA signed ('aa certs router': "
                "key usages serverAuth and clientAuth, unit aa-router)"
            )
        if not id_matches(router_id, identity):
            return f"router id {router_id!r} does not belong to certificate {identity.user!r}"
        return None

    def may_dial(self, address: str, host: str, now: float) -> bool:
        return self.peers.allows(host) and self.guard.admit(address, now)

    # -- permissions ------------------------------------------------------------------------

    def rules_for(self, identity: Identity) -> Rules | None:
        return self.permissions.rules_for(identity.user)

    def screen(
        self, rules: Rules | None, events: Sequence[Event], persist_key: str
    ) -> tuple[list[Event], str | None]:
        """The events *rules* allow to be published, and why the others were refused (one
        line naming the first rule broken)."""
        if rules is None:
            return [], NO_RULE
        reason = None
        if rules.publish_any and rules.persist:
            return list(events), None
        out = []
        for ev in events:
            if not rules.may_publish(ev.type):
                reason = reason or rules.refusal("publish", f"publish events of type {ev.type!r}")
            elif not rules.persist and ev.meta and ev.meta.get(persist_key) is True:
                reason = reason or rules.refusal("persist", "persist events")
            else:
                out.append(ev)
        return out, reason

    def reload(self) -> str:
        """Read the permissions file again (SIGHUP). A malformed file is refused — the rules
        in force stay — and the reason returned; so is success."""
        try:
            self.permissions = self.permissions.reload()
        except UsageError as exc:
            log.error("permissions not reloaded, the old rules stay: %s", exc)
            return f"permissions not reloaded, the old rules stay: {exc}"
        log.warning("permissions reloaded from %s", self.permissions.path)
        return f"permissions reloaded from {self.permissions.path}"

    # -- revocation -------------------------------------------------------------------------

    def certificate_refusal(self, identity: Identity) -> str | None:
        """Why the certificate *identity* came with is refused (revoked), or None."""
        if self.crl.certificate_revoked(identity.serial):
            return f"certificate {identity.user!r} has been revoked (aa certs revoke)"
        return None

    def reload_crl(self) -> str | None:
        """Read the CRL file again (SIGHUP, or `crl_changed`); None without one. A malformed,
        foreign or older list is refused — the list in force stays — and the reason
        returned; so is success."""
        path = self.config.crl
        if path is None or self._ca is None:
            return None
        try:
            self.crl = RevocationList.load(path, self._ca, at_least=self.crl.number)
        except UsageError as exc:
            # Remember the file's state: the next poll does not read the same bad file again.
            self.crl = dataclasses.replace(self.crl, stamp=file_stamp(path))
            log.error("revocation list not reloaded, the old one stays: %s", exc)
            return f"revocation list not reloaded, the old one stays: {exc}"
        log.warning("revocation list %s loaded: %d entries", path, len(self.crl.entries))
        return f"revocation list {path} loaded: {len(self.crl.entries)} entries"

    def crl_changed(self) -> bool:
        """Whether the CRL file changed since it was read (a `stat`; poll it every second)."""
        return self.config.crl is not None and self.crl.changed()

    def receive_filter(self, identity: Identity) -> Callable[[str | None], bool] | None:
        """Whether *identity*'s user may receive an event type, by the rules in force at each
        call (a reload applies at the next event); None when nothing can ever be refused
        (no permissions file: a reload keeps everything allowed)."""
        if self.permissions.path is None:
            return None
        user = identity.user

        def receives(type_: str | None) -> bool:
            rules = self.permissions.rules_for(user)
            return rules is not None and (rules.subscribe_any or rules.may_receive(type_))

        return receives

    # -- the questions every door asks (TCP sessions and the HTTP endpoint alike) -----------
    #
    # Each reads the rules in force now (`rules_for`), so a reloaded permissions file takes
    # effect at the next request, and raises `PermissionDenied` with the one line the TCP
    # side sends as its error frame.

    def denial(self, identity: Identity, rules: Rules | None, reason: str | None) -> str:
        """One line telling *identity* why it was refused: ``user 'bob' is not allowed to
        persist events (rule persist = false in [users.bob] in perms.toml)``, or, when no
        section covers the user (*rules* None), that it may do nothing."""
        if rules is None:
            if identity.user == ANONYMOUS:
                return f"user {identity.user!r} {NO_RULE}{_ANONYMOUS_HINT}"
            return f"user {identity.user!r} {NO_RULE}"
        return f"user {identity.user!r} is {reason}"

    def require(self, identity: Identity, rule: str, what: str) -> Rules:
        """The rules of *identity* when its flag *rule* (``client_caches``, ``persist``,
        ``quench``) is true; else raises `PermissionDenied` naming the rule."""
        rules = self.rules_for(identity)
        if rules is None or not getattr(rules, rule):
            reason = rules.refusal(rule, what) if rules is not None else None
            raise PermissionDenied(self.denial(identity, rules, reason))
        return rules

    def require_covered(self, identity: Identity) -> Rules:
        """The rules of *identity*; raises `PermissionDenied` when no section covers it (the
        mesh's picture and counters are for users the permissions file knows)."""
        rules = self.rules_for(identity)
        if rules is None:
            raise PermissionDenied(self.denial(identity, None, None))
        return rules

    def require_pattern(self, identity: Identity, spec: PatternSpec, tier: str) -> Rules:
        """The rules of *identity* when it may run *spec* in *tier* (`PatternEngine.tier`,
        `Rules.pattern_refusal`); else raises `PermissionDenied` naming the rule."""
        rules = self.rules_for(identity)
        reason = rules.pattern_refusal(spec, tier) if rules is not None else None
        if rules is None or reason is not None:
            raise PermissionDenied(self.denial(identity, rules, reason))
        return rules

    def require_publish(self, identity: Identity, event: Event, persist_key: str) -> None:
        """Raises `PermissionDenied` unless *identity* may publish *event* (its type, and
        persisting it when its meta asks), with `screen`'s reason."""
        rules = self.rules_for(identity)
        allowed, reason = self.screen(rules, (event,), persist_key)
        if not allowed:
            raise PermissionDenied(self.denial(identity, rules, reason))

    def receives(self, identity: Identity) -> Callable[[str | None], bool]:
        """`receive_filter` for a reader that wants a test either way (an HTTP stream, a
        feed): every type passes when nothing can ever be refused."""
        return self.receive_filter(identity) or _any_type

    def scope_of(self, identity: Identity) -> tuple[str, ...] | None:
        """The event types *identity*'s pattern code may see (`aa.router.patterns.scope`):
        its ``subscribe`` list by the rules in force, None for any type."""
        rules = self.rules_for(identity)
        if rules is None:
            return ()
        return None if rules.subscribe_any else rules.subscribe

    # -- what the mesh picture says of this router's rules ----------------------------------

    def rules_digest(self) -> str | None:
        """A short hash of the permissions in force (`Permissions.digest`: the parsed rules,
        not the file), so `aa mesh` can tell routers that enforce different ones apart; None
        without a permissions file."""
        return self.permissions.digest()

    def crl_number(self) -> int | None:
        """The CRL number of the revocation list in force; None without ``--crl``."""
        return self.crl.number if self.config.crl is not None else None


#: Seconds between two log lines about refusals from one source.
REFUSAL_LOG_INTERVAL: Final = 60.0
#: Sources remembered for that: past it the oldest is forgotten (one more line for it, later).
MAX_REFUSAL_SOURCES: Final = 4096


class RefusalLog:
    """Logs a refusal (a hello, a peer) once per source per `REFUSAL_LOG_INTERVAL`, with the
    number held back since: a stranger repeating a refused hello must not flood the log."""

    def __init__(self, interval: float = REFUSAL_LOG_INTERVAL) -> None:
        self.interval = interval
        self._last: OrderedDict[str, list[float | int]] = OrderedDict()

    def note(self, source: str, message: str, now: float, level: int = logging.WARNING) -> bool:
        """Log *message* about *source* unless one was logged lately; whether it was."""
        seen = self._last.get(source)
        if seen is not None and now - seen[0] < self.interval:
            seen[1] += 1
            return False
        held = int(seen[1]) if seen is not None else 0
        self._last.pop(source, None)
        self._last[source] = [now, 0]
        while len(self._last) > MAX_REFUSAL_SOURCES:
            self._last.popitem(last=False)
        more = f" ({held} more from {source} in the last {self.interval:g} s)" if held else ""
        log.log(level, "%s%s", message, more)
        return True


def _any_type(type_: str | None) -> bool:
    return True


_ACCEPT_FILTER = RateLimited(("out of system resource", "accept failed", "Too many open files"))


def _quiet_accept_errors() -> None:
    """One log line per interval about failing accepts (EMFILE), not one per attempt: the
    loop's own (logger "asyncio"), the TLS listener's and uvicorn's."""
    for name in ("asyncio", "aa.router.security", "uvicorn.error"):
        logger = logging.getLogger(name)
        if _ACCEPT_FILTER not in logger.filters:
            logger.addFilter(_ACCEPT_FILTER)
