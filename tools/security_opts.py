"""`aa router`'s security flags and the `SecurityConfig` they make: a module of
its own so that `aa router --help` imports neither the `cryptography` package nor the router."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aa.router.security import SecurityConfig

__all__ = ["add_security_options", "security_config"]


def add_security_options(p: argparse.ArgumentParser) -> None:
    """`aa router`'s security flags."""
    g = p.add_argument_group(
        "security",
        "Open by default: plaintext, anyone who reaches the port may join as a router or a client. "
        "'aa certs' makes the files; see docs/security.md.",
    )
    g.add_argument(
        "--cert",
        type=Path,
        metavar="FILE",
        help="this router's certificate: the port then speaks TLS only (default: $AA_CERT)",
    )
    g.add_argument("--key", type=Path, metavar="FILE", help="its key (default: $AA_KEY)")
    g.add_argument(
        "--ca",
        type=Path,
        metavar="FILE",
        help="the mesh CA: peers must show a router certificate it "
        "signed (mutual TLS), clients with one are users (default: $AA_CA)",
    )
    g.add_argument(
        "--no-anonymous", action="store_true", help="refuse clients without a certificate"
    )
    g.add_argument(
        "--permissions",
        type=Path,
        metavar="FILE",
        help="per-user permissions (TOML); re-read on SIGHUP, live sessions held to the new "
        "rules (default: everyone may do everything)",
    )
    g.add_argument(
        "--crl",
        type=Path,
        metavar="FILE",
        help="the mesh's revocation list (DIR/crl.pem from 'aa certs init' and 'aa certs "
        "revoke'); re-read when it changes and on SIGHUP, revoked users' connections cut",
    )
    g.add_argument(
        "--allow-clients",
        metavar="CIDR",
        action="append",
        default=[],
        help="address range clients may connect from; repeatable (default: any)",
    )
    g.add_argument(
        "--allow-peers",
        metavar="CIDR",
        action="append",
        default=[],
        help="address range peer routers may connect from and be dialled at; repeatable (default: "
        "any)",
    )
    g.add_argument(
        "--http-cert",
        type=Path,
        metavar="FILE",
        help="HTTPS certificate of the HTTP endpoint (default: --cert)",
    )
    g.add_argument("--http-key", type=Path, metavar="FILE", help="its key (default: --key)")


def security_config(args: argparse.Namespace, env: Mapping[str, str]) -> SecurityConfig:
    """The `SecurityConfig` the flags and $AA_CERT, $AA_KEY, $AA_CA ask for."""
    from aa.router.security import SecurityConfig

    def pick(flag: Path | None, name: str) -> Path | None:
        return (
            flag if flag is not None else (Path(env[name]) if env.get(name, "").strip() else None)
        )

    return SecurityConfig(
        cert=pick(args.cert, "AA_CERT"),
        key=pick(args.key, "AA_KEY"),
        ca=pick(args.ca, "AA_CA"),
        anonymous=not args.no_anonymous,
        permissions=args.permissions,
        crl=getattr(args, "crl", None),
        allow_clients=tuple(args.allow_clients),
        allow_peers=tuple(args.allow_peers),
    )
