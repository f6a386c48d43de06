"""aa.router.security — who may connect to a router and what they may do (Å §4.6).

Owns: TLS on the router's one TCP port (contexts from PEM files, `tls`), the identity a
certificate gives (`Identity`: a user, a router, or anonymous), a router id bound to its
certificate, CIDR allow-lists and the back-off for strangers' handshakes (`guard`), the
accepting side of the port with TLS (`listener`), per-user permissions from a TOML file
(`permissions`), revocation (`crl`: certificates by serial, tokens by user and time), and
the `Gate` the router consults at a connection's hello, at publish, subscribe, cache and
quench requests, and on SIGHUP or a changed revocation list.

Does not own: the certificates themselves (made by `aa certs`, `aa.tools.certs_cmd`), the
client's side of TLS (`aa.client`), the HTTP endpoint's TLS (`aa.http_api`), nor what the
router does with an admitted connection (sessions, dispatch, peer links).
"""

from .admission import MAX_PARTIAL_TOTAL, PartialFrames
from .crl import RevocationList, make_crl, user_serial
from .gate import Gate, SecurityConfig
from .guard import AllowList, HandshakeGuard
from .listener import TLS_REQUIRED, Listener
from .permissions import ALLOW_ALL, Permissions, Rules
from .refusals import RefusalBudget
from .tls import (
    ANONYMOUS,
    HANDSHAKE_TIMEOUT,
    NAME_RE,
    ROUTER_UNIT,
    USER_UNIT,
    Identity,
    check_cert_file,
    check_key_file,
    client_context,
    id_matches,
    identity_of,
    router_id_for,
    server_context,
)
from .tokens import MAX_TOKEN_DAYS, TokenVerifier, issue_token

__all__ = [
    "ALLOW_ALL",
    "ANONYMOUS",
    "AllowList",
    "Gate",
    "HANDSHAKE_TIMEOUT",
    "HandshakeGuard",
    "Identity",
    "Listener",
    "MAX_PARTIAL_TOTAL",
    "MAX_TOKEN_DAYS",
    "NAME_RE",
    "PartialFrames",
    "Permissions",
    "ROUTER_UNIT",
    "RefusalBudget",
    "RevocationList",
    "Rules",
    "SecurityConfig",
    "TLS_REQUIRED",
    "TokenVerifier",
    "USER_UNIT",
    "check_cert_file",
    "check_key_file",
    "client_context",
    "id_matches",
    "identity_of",
    "issue_token",
    "make_crl",
    "router_id_for",
    "server_context",
    "user_serial",
]
