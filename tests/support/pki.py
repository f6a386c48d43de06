"""A mesh CA and the certificates a test needs, made once per module (`aa certs`' own code)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from aa.tools.certs_cmd import init_ca, issue

__all__ = ["make_pki"]


def make_pki(folder: Path, routers: Iterable[str] = ("r1",), clients: Iterable[str] = ()) -> Path:
    """*folder*, holding a mesh CA (`ca.pem`, `ca.key`, `crl.pem`) and a 30-day certificate
    and key for each router and client named (`NAME.pem`, `NAME.key`)."""
    init_ca(folder)
    for name in routers:
        issue(folder, name, "router", days=30)
    for name in clients:
        issue(folder, name, "client", days=30)
    return folder
