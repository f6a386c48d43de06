"""Bearer tokens for phones and scripts: a user's name signed with the mesh CA's key, so that
every router of the mesh verifies one with `ca.pem` alone (no router-local state: a phone that
roams between routers keeps working).

A token is three dot-separated parts, ``aa1.<payload>.<signature>``: the payload is compact
JSON, base64url without padding, ``{"sub": USER, "iat": ISSUED, "exp": EXPIRES, "jti": ID}``
(times in whole Unix seconds), and the signature is the CA key's ECDSA P-256 / SHA-256
signature (DER, base64url) over the ASCII bytes ``aa1.<payload>``. The same shape as a JWT
(ES256) without its header, so no ``alg`` field can be turned against the verifier.

`issue_token` is what ``aa certs token`` runs; `TokenVerifier.verify` is what the router's
gate runs on an ``Authorization: Bearer`` header. Revocation (``aa certs revoke``) names a
user and a time: a token issued to that user at or before that time no longer verifies
(`TokenVerifier.verify` takes the revocation test as an argument, from the CRL's owner).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from aa.mesh import NotAuthenticated, UsageError

from .tls import NAME_RE

__all__ = [
    "MAX_KNOWN_TOKENS",
    "MAX_TOKEN_BYTES",
    "PREFIX",
    "TokenClaims",
    "TokenVerifier",
    "issue_token",
]

#: Every token begins with this (the format's version: a later format gets another).
PREFIX: Final = "aa1"
#: Longest token accepted, in characters: a header longer than this is refused before any
#: decoding (a user name is at most 64 characters; a real token is about 230).
MAX_TOKEN_BYTES: Final = 1024
#: Longest validity `issue_token` grants, in days (ten years: tokens are meant to be revoked,
#: not to expire by surprise, yet never to live for ever).
MAX_TOKEN_DAYS: Final = 3650
#: Tokens whose signature verified, remembered so that the next request with the same token
#: skips the ECDSA check (a phone polling every second would otherwise cost the router one
#: verification per poll), and so that the HTTP endpoint can tell a known user's token from
#: a stranger's without verifying anything (`TokenVerifier.known`). Expiry and revocation
#: are checked again on every use; the oldest goes when the table is full (it then costs
#: one verification again). About 600 bytes each.
MAX_KNOWN_TOKENS: Final = 4096
_PART: Final = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a verified token says."""

    #: The user it names (as in a client certificate's common name).
    user: str
    #: When it was issued and when it expires, Unix seconds.
    issued: int
    expires: int
    #: Its own random id (for logs; revocation is by user and time).
    id: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not _PART.match(text):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue_token(ca_key: ec.EllipticCurvePrivateKey, user: str, *, now: float, days: int) -> str:
    """A token naming *user*, valid *days* days from *now*, signed with the CA's key. Raises
    `UsageError` for a name a certificate could not carry or a validity out of range."""
    if not NAME_RE.match(user):
        raise UsageError(f"user name {user!r} must be 1-64 letters, digits, '.', '_' or '-'")
    if type(days) is not int or not 1 <= days <= MAX_TOKEN_DAYS:
        raise UsageError(f"--days must be 1..{MAX_TOKEN_DAYS}, not {days!r}")
    issued = int(now)
    claims = {"sub": user, "iat": issued, "exp": issued + days * 86400, "jti": os.urandom(8).hex()}
    payload = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
    signed = f"{PREFIX}.{payload}"
    signature = ca_key.sign(signed.encode("ascii"), ec.ECDSA(hashes.SHA256()))
    return f"{signed}.{_b64(signature)}"


class TokenVerifier:
    """Verifies tokens against the mesh CA's public key (from ``ca.pem``)."""

    def __init__(self, ca_cert: x509.Certificate) -> None:
        key = ca_cert.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise UsageError("the mesh CA's key is not the EC key 'aa certs init' makes")
        self._key = key
        self._known: OrderedDict[str, TokenClaims] = OrderedDict()

    def known(self, token: str) -> TokenClaims | None:
        """The claims of *token* if its signature verified before (and it is still
        remembered), else None; nothing is verified, and expiry and revocation are not
        checked here: `verify` checks them."""
        return self._known.get(token)

    def verify(
        self,
        token: str,
        *,
        now: float,
        revoked: Callable[[str, int], bool] = lambda user, issued: False,
    ) -> TokenClaims:
        """The claims of *token*; raises `NotAuthenticated` saying why it is refused
        (malformed, not signed by this mesh's CA, not yet valid, expired, revoked). The
        signature is checked before anything in the payload is believed."""
        seen = self._known.get(token)
        if seen is not None:
            return _valid(seen, now, revoked)
        if len(token) > MAX_TOKEN_BYTES:
            raise NotAuthenticated(f"token longer than {MAX_TOKEN_BYTES} characters")
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != PREFIX:
            raise NotAuthenticated("malformed token (expected one from 'aa certs token')")
        try:
            signature = _unb64(parts[2])
            payload = _unb64(parts[1])
        except (ValueError, binascii.Error):
            raise NotAuthenticated("malformed token (not base64url)") from None
        try:
            self._key.verify(
                signature, f"{parts[0]}.{parts[1]}".encode("ascii"), ec.ECDSA(hashes.SHA256())
            )
        except InvalidSignature:
            raise NotAuthenticated("token not signed by this mesh's CA") from None
        try:
            claims = json.loads(payload)
            user, issued, expires, jti = claims["sub"], claims["iat"], claims["exp"], claims["jti"]
        except (ValueError, KeyError, TypeError):
            raise NotAuthenticated("malformed token payload") from None
        if (
            type(user) is not str
            or not NAME_RE.match(user)
            or type(issued) is not int
            or type(expires) is not int
            or type(jti) is not str
        ):
            raise NotAuthenticated("malformed token payload")
        claims = TokenClaims(user=user, issued=issued, expires=expires, id=jti)
        self._known[token] = claims
        while len(self._known) > MAX_KNOWN_TOKENS:
            self._known.popitem(last=False)
        return _valid(claims, now, revoked)


def _valid(claims: TokenClaims, now: float, revoked: Callable[[str, int], bool]) -> TokenClaims:
    """*claims* if they hold at *now*; raises `NotAuthenticated` saying why not."""
    user = claims.user
    if now < claims.issued - 300:  # five minutes of clock skew between routers
        raise NotAuthenticated(f"token for {user!r} is not valid yet (clocks apart?)")
    if now >= claims.expires:
        raise NotAuthenticated(f"token for {user!r} has expired")
    if revoked(user, claims.issued):
        raise NotAuthenticated(f"token for {user!r} has been revoked")
    return claims
