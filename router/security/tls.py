"""TLS for the one TCP port: contexts from PEM files, and who is on the other end.

Trust model (Å §4.6): a mesh has one CA (`aa certs init`). It signs *router*
certificates (extended key usage serverAuth and clientAuth: a router accepts connections and
dials its peers; unit ``aa-router``) and *user* certificates (clientAuth only). Names are not
host names: routers are reached at whatever address discovery finds, so host names are not
checked; what is checked is the chain to the mesh CA, and the key usage. OpenSSL checks the
usage itself (a client verifies the "SSL server" purpose), so a user's certificate cannot pose
as a router to a client. A router takes a peer link only from a certificate of exactly the
router profile (`Identity.router`: both usages, nothing else, unit ``aa-router``), and a client
only with a certificate without serverAuth (`Identity.server_auth`): a router's certificate is
no user's, and a user's certificate that somehow carries serverAuth is neither.

A router's id is bound to its certificate: with TLS on, the id is
``<certificate name>~<random hex>`` (`router_id_for`), and a peer whose hello claims an id
that does not begin with its own certificate's name is refused (`id_matches`).
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aa.mesh import UsageError

__all__ = [
    "ANONYMOUS",
    "Identity",
    "check_cert_file",
    "check_key_file",
    "server_context",
    "client_context",
    "identity_of",
    "id_matches",
    "router_id_for",
    "NAME_RE",
    "HANDSHAKE_TIMEOUT",
    "ROUTER_UNIT",
    "USER_UNIT",
]

#: The user of a connection that presented no certificate.
ANONYMOUS = "anonymous"

#: Names the certificate tool accepts for routers and users: they become event metadata
#: (`meta["user"]`) and router-id prefixes, so no spaces, no `~`, nothing to escape.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}\Z")

#: A router certificate's profile: exactly these extended key usages, and this unit.
_ROUTER_USAGE = frozenset((ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH))
ROUTER_UNIT = "aa-router"
USER_UNIT = "aa-user"

#: Seconds a connection may take from accept to a finished TLS handshake. A stranger that
#: opens the port and stalls holds one socket this long, no more (and no CPU meanwhile).
HANDSHAKE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is on the other end of a connection: a user name from a certificate the mesh CA
    signed (`user`), or `ANONYMOUS`; *router* when that certificate is a router's."""

    user: str = ANONYMOUS
    router: bool = False
    #: The certificate carries extended key usage serverAuth (a router's, or something odd):
    #: never a client's.
    server_auth: bool = False
    #: The certificate's serial number (revocation, `aa.router.security.crl`); None without one.
    serial: int | None = None

    @property
    def anonymous(self) -> bool:
        return self.user == ANONYMOUS and not self.router


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{what} {p} does not exist") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {p}: {exc.strerror or exc}") from None


def check_cert_file(
    path: str | os.PathLike[str], what: str = "certificate", *, now: datetime | None = None
) -> x509.Certificate:
    """Load the first certificate of a PEM file. Raises `UsageError` (one line, naming the
    file) when it is missing, unreadable, not PEM, not yet valid or expired."""
    data = _read(path, what)
    try:
        cert = x509.load_pem_x509_certificate(data)
    except ValueError:
        raise UsageError(f"{what} {path} is not a PEM certificate") from None
    now = now or datetime.now(UTC)
    if cert.not_valid_after_utc < now:
        raise UsageError(f"{what} {path} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    if cert.not_valid_before_utc > now:
        raise UsageError(
            f"{what} {path} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )
    return cert


def check_key_file(path: str | os.PathLike[str]) -> None:
    """Raise `UsageError` unless *path* holds an unencrypted PEM private key."""
    data = _read(path, "key")
    try:
        load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"key {path} is not an unencrypted PEM private key ({exc})") from None


def _base(purpose: int) -> ssl.SSLContext:
    ctx = ssl.SSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    return ctx


def _load_chain(
    ctx: ssl.SSLContext, cert: str | os.PathLike[str], key: str | os.PathLike[str]
) -> None:
    check_cert_file(cert)
    check_key_file(key)
    try:
        ctx.load_cert_chain(os.fspath(cert), os.fspath(key))
    except ssl.SSLError as exc:
        raise UsageError(
            f"certificate {cert} and key {key} do not belong together ({exc.reason})"
        ) from None


def _load_ca(ctx: ssl.SSLContext, ca: str | os.PathLike[str]) -> None:
    check_cert_file(ca, "CA certificate")
    try:
        ctx.load_verify_locations(cafile=os.fspath(ca))
    except ssl.SSLError as exc:
        raise UsageError(f"CA certificate {ca}: {exc.reason}") from None


def server_context(
    cert: str | os.PathLike[str],
    key: str | os.PathLike[str],
    ca: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """The context a router accepts connections with: TLS 1.2 or later, its own certificate,
    and — with *ca* — certificates the mesh CA signed are asked for and verified (a client
    may come without one and is anonymous; a foreign or expired one fails the handshake).
    Raises `UsageError` for a missing, unreadable, expired or mismatched file."""
    ctx = _base(ssl.PROTOCOL_TLS_SERVER)
    _load_chain(ctx, cert, key)
    if ca is not None:
        _load_ca(ctx, ca)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_context(
    ca: str | os.PathLike[str],
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """The context a client (or a router dialling a peer) connects with: the other end must
    show a router certificate the mesh CA signed; *cert*/*key* are presented when given (a
    user, or a router dialling). Host names are not checked (see the module docstring).
    Raises `UsageError` as `server_context` does."""
    if (cert is None) != (key is None):
        raise UsageError("give both a certificate and its key, or neither")
    ctx = _base(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load_ca(ctx, ca)
    if cert is not None and key is not None:
        _load_chain(ctx, cert, key)
    return ctx


def identity_of(ssl_object: Any) -> Identity:
    """Who presented the certificate on this connection (`transport.get_extra_info(
    "ssl_object")`); anonymous for a plain connection or one without a certificate. Only
    verified certificates count: with `CERT_OPTIONAL` the handshake already refused others."""
    if ssl_object is None:
        return Identity()
    der = ssl_object.getpeercert(binary_form=True)
    if not der or not ssl_object.getpeercert():  # the dict form is empty unless verified
        return Identity()
    cert = x509.load_der_x509_certificate(der)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    name = str(names[0].value) if names else ""
    if not NAME_RE.match(name):
        return Identity()
    try:
        usage = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        usage = set()
    units = {
        str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    }
    return Identity(
        user=name,
        router=usage == _ROUTER_USAGE and units == {ROUTER_UNIT},
        server_auth=ExtendedKeyUsageOID.SERVER_AUTH in usage,
        serial=cert.serial_number,
    )


def router_id_for(name: str) -> str:
    """A fresh router id bound to certificate name *name*."""
    return f"{name}~{os.urandom(8).hex()}"


def id_matches(router_id: str, identity: Identity) -> bool:
    """Whether a peer presenting *identity* may claim *router_id*."""
    return identity.router and router_id.rpartition("~")[0] == identity.user
