"""Small HTTP helpers the routes share: content negotiation, error bodies, credentials,
HTTP dates."""

from __future__ import annotations

import base64
import binascii
import functools
from email.utils import formatdate, parsedate_to_datetime
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

__all__ = ["negotiate", "error", "token_of", "http_date", "parse_http_date", "etag_matches"]


def error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    """The error body every route uses: ``{"error": code, "message": text}``."""
    return JSONResponse(
        {"error": code, "message": message, **extra}, status_code=status, headers=headers
    )


def negotiate(accept: str | None, offers: tuple[str, ...]) -> str:
    """The offer the ``Accept`` header prefers (highest q, then earliest); the first offer
    when it names none of them. ``*/*`` and ``type/*`` match, less than an exact type."""
    if not accept:
        return offers[0]
    best, best_rank = offers[0], (0.0, 0, 0)
    for pos, part in enumerate(accept.split(",")):
        media, _, params = part.strip().partition(";")
        media = media.strip().lower()
        q = 1.0
        for p in params.split(";"):
            name, _, value = p.strip().partition("=")
            if name == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        for offer in offers:
            exact = media == offer
            if exact or media == "*/*" or media == offer.split("/")[0] + "/*":
                rank = (q, 1 if exact else 0, -pos)
                if q > 0 and rank > best_rank:
                    best, best_rank = offer, rank
    return best


def token_of(request: Request, client_id: str) -> str | None:
    """The client token a request carries: ``Authorization: Bearer <token>``, or HTTP Basic
    with the client id as user name and the token as password (for feed readers, which
    take ``http://<id>:<token>@host/…`` URLs)."""
    auth = request.headers.get("authorization")
    if not auth:
        return None
    scheme, _, value = auth.partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        return value.strip() or None
    if scheme == "basic":
        try:
            user, _, password = (
                base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password if user == client_id and password else None
    return None


@functools.lru_cache(maxsize=256)
def _http_date(second: int) -> str:
    return formatdate(second, usegmt=True)


def http_date(epoch: float) -> str:
    """An HTTP date (whole seconds). Each feed answer carries one, mostly the same few
    seconds: formatted once each."""
    return _http_date(int(epoch))


def parse_http_date(text: str) -> float | None:
    """Seconds since the epoch of an HTTP date, or None when it is not one."""
    try:
        return parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def etag_matches(header: str, etag: str) -> bool:
    """If-None-Match: ``*`` or a list of (weak or strong) tags; weak comparison (RFC 9110)."""
    if header.strip() == "*":
        return True
    bare = etag.removeprefix("W/")
    return any(t.strip().removeprefix("W/") == bare for t in header.split(","))
