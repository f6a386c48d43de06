"""Who is calling: the one place the endpoint turns a request's credentials into the user the
router's gate (`aa.router.security.Gate`) answers for. Every route asks it (`caller_of`),
through the application's one dependency (`gate_dependency`) or, for the feed's fast path,
directly.

A request carries one of:

- ``Authorization: Bearer aa1.…``, a user token signed with the mesh CA's key (``aa certs
  token``): that user, checked by `Gate.authenticate`;
- ``Authorization: Bearer <client token>`` or HTTP Basic ``<client id>:<client token>`` (for
  feed readers), the token ``POST /clients`` returned: the user who registered that client
  (its owner), with the client itself remembered, since that token opens only its own client;
- Basic ``<user>:aa1.…``: a user token in a feed reader's URL, its name the token's;
- on ``GET /stream`` only, ``?ticket=…`` from ``POST /stream/tickets`` (a browser's
  ``EventSource`` sends no headers): the credential the ticket was issued for, resolved
  again now (`tickets`);
- nothing: anonymous, which `Gate.authenticate` refuses under ``--no-anonymous``.

A credential that does not verify is a 401 with the reason, never a silent anonymous: a
client that believes it is someone must learn that it is not. The header is weighed before
anything is decoded (`MAX_AUTHORIZATION`), and nothing about a refused caller is kept, so a
flood of bad or missing credentials costs the router no memory.

Paths a browser needs before it can ask for a token stay open (`OPEN_PATHS`): the monitor's
page and files, the API's documentation pages and the OpenAPI document. They show no data of
the router's: every call they make for data goes through the gate.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Final

from fastapi import Request

from aa.mesh import NotAuthenticated
from aa.router.security import ANONYMOUS, Identity

from .clients import HttpClient, HttpClients

__all__ = ["Caller", "caller_of", "gate_dependency", "OPEN_PATHS", "MAX_AUTHORIZATION"]

#: Longest ``Authorization`` header read, in characters: a user token is about 230, a client's
#: 43 (Basic adds the name and a third); a longer header is refused before it is decoded.
MAX_AUTHORIZATION: Final = 2048

#: Routes answered without credentials: the HTML shells a browser loads before it can ask its
#: user for a token (the monitor at ``/``, ``/docs``, ``/redoc``) and the OpenAPI document those
#: pages read. Mounted file trees (``/static``, ``/docs-static``) are outside the routes and
#: open too. Everything else asks the gate.
OPEN_PATHS: Final = frozenset({"/", "/docs", "/redoc", "/openapi.json"})

#: The one route that takes a stream ticket (`tickets`) in its query instead of a header.
TICKET_PATH: Final = "/stream"

#: Where a request's caller is kept once resolved (one resolution per request).
_KEY: Final = "aa.caller"
_USER_TOKEN: Final = "aa1."


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from."""

    #: The user the gate answers for (the token's user, a client's owner, or anonymous).
    identity: Identity
    #: The HTTP client whose own token the request carried; None for a user token or none.
    client: HttpClient | None = None

    @property
    def user(self) -> str:
        return self.identity.user

    def may_reach(self, client: HttpClient) -> bool:
        """Whether this caller may see and change *client*: with that client's own token, or
        as its owner with a user token (an anonymous owner has only the client's token)."""
        if self.client is not None:
            return self.client is client
        return self.identity.user != ANONYMOUS and client.owner == self.identity.user


def caller_of(request: Request) -> Caller:
    """The caller of *request*; raises `NotAuthenticated` saying why (a bad or unknown
    credential, or none where the router refuses anonymous callers)."""
    scope = request.scope
    known: Caller | None = scope.get(_KEY)  # only this module sets it
    if known is not None:
        return known
    caller = _resolve(request)
    scope[_KEY] = caller
    return caller


async def gate_dependency(request: Request) -> None:
    """The application's dependency on every route: the caller is resolved (401 when it
    cannot be) before any parameter or body is looked at, except on `OPEN_PATHS`."""
    route = request.scope.get("route")
    if getattr(route, "path", None) in OPEN_PATHS:
        return
    caller_of(request)


def _resolve(request: Request) -> Caller:
    state = request.app.state
    gate = state.router.security
    header = request.headers.get("authorization")
    if header is None and request.url.path == TICKET_PATH:
        ticket = request.query_params.get("ticket")
        if ticket is not None:
            found = state.tickets.redeem(ticket, now=state.clock())
            if found is None:
                raise NotAuthenticated(
                    "unknown, used or expired stream ticket: ask 'POST /stream/tickets' for "
                    "another (each opens one stream, within seconds)"
                )
            header = found.credential
    if header is None:
        return Caller(gate.authenticate(None, now=state.wall()))
    name, token = _credentials(header)
    if token.startswith(_USER_TOKEN):
        identity = gate.authenticate(token, now=state.wall())
        if name is not None and name != identity.user:
            raise NotAuthenticated(
                f"the Basic user name {name!r} is not the token's user {identity.user!r}"
            )
        return Caller(identity)
    clients: HttpClients = state.clients
    client = clients.by_token(token)
    if client is None or (name is not None and name != client.id):
        raise NotAuthenticated(
            "unknown token: send a user token from 'aa certs token', or the token "
            "'POST /clients' returned while that client lives"
        )
    now = state.clock()
    if now - client.last_seen > client.keepalive:
        clients.remove(client)
        raise NotAuthenticated(
            f"the token of HTTP client {client.id!r}, which expired: no poll for "
            f"{client.keepalive:.0f} s (register it again)"
        )
    if client.owner != ANONYMOUS and gate.revoked(client.owner, int(client.issued)):
        raise NotAuthenticated(f"the credentials of user {client.owner!r} have been revoked")
    return Caller(Identity(user=client.owner), client)


def _credentials(header: str) -> tuple[str | None, str]:
    """(Basic user name or None, token) of an ``Authorization`` header; raises
    `NotAuthenticated` for one that is too long, empty, of another scheme or not base64."""
    if len(header) > MAX_AUTHORIZATION:
        raise NotAuthenticated(f"Authorization header longer than {MAX_AUTHORIZATION} characters")
    scheme, _, value = header.strip().partition(" ")
    scheme, value = scheme.lower(), value.strip()
    if scheme == "bearer":
        if not value:
            raise NotAuthenticated("'Authorization: Bearer' without a token")
        return None, value
    if scheme == "basic":
        try:
            text = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise NotAuthenticated(
                "Basic credentials are not base64 of 'name:token' (UTF-8)"
            ) from None
        name, colon, token = text.partition(":")
        if not colon or not name or not token:
            raise NotAuthenticated("Basic credentials must be 'name:token', both given")
        return name, token
    raise NotAuthenticated(
        f"Authorization must be 'Bearer <token>' or Basic '<name>:<token>', not {scheme[:20]!r}"
    )
