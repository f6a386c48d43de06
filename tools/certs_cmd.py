"""`aa certs`: a mesh's certificates in three commands (issue 13).

    aa certs init DIR              the mesh CA: DIR/ca.pem, DIR/ca.key
    aa certs router DIR NAME       a router's certificate, signed by it: DIR/NAME.pem, DIR/NAME.key
    aa certs client DIR USER       a user's certificate: DIR/USER.pem, DIR/USER.key

Keys are EC P-256 (a TLS handshake costs a fraction of an RSA one) written 0600;
certificates 0644. Router certificates carry extended key usage serverAuth and clientAuth (a
router accepts connections and dials its peers), user certificates clientAuth only, so a
user's certificate can pose as a router to no one (`aa.router.security.tls`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aa.mesh import UsageError
from aa.router.security import NAME_RE, check_cert_file

__all__ = [
    "add_parser",
    "init_ca",
    "issue",
    "CA_DAYS",
    "ROUTER_DAYS",
    "CLIENT_DAYS",
]

#: Default lifetimes in days: the CA outlives what it signs; a user's certificate is renewed
#: yearly (a lost laptop stops being a user within a year even if nobody revokes it).
CA_DAYS = 3650
ROUTER_DAYS = 825
CLIENT_DAYS = 365
_UNITS = {"router": "aa-router", "client": "aa-user"}


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "certs",
        help="make the mesh's CA, router and user certificates",
        description="Make a mesh CA and certificates it signs, for 'aa router --cert/--key/--ca' "
        "and for clients (AA_CERT, AA_KEY, AA_CA).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = actions.add_parser(
        "init",
        help="make the mesh CA: DIR/ca.pem and DIR/ca.key",
        description="Make the mesh's certificate authority in DIR (created if need be): "
        "DIR/ca.pem, which every router and client is given (--ca, AA_CA), and DIR/ca.key, "
        "which signs the others and stays on this machine.",
    )
    init.add_argument("dir", type=Path, metavar="DIR", help="the CA's folder")
    init.add_argument(
        "--days", type=int, default=CA_DAYS, help=f"days it is valid (default: {CA_DAYS})"
    )
    init.add_argument(
        "--force",
        action="store_true",
        help="replace an existing CA (every certificate it signed stops being trusted)",
    )
    init.set_defaults(func=_init)
    for kind, days, what in (("router", ROUTER_DAYS, "NAME"), ("client", CLIENT_DAYS, "USER")):
        text = (
            f"a {'router' if kind == 'router' else 'user'}'s certificate signed by the CA in DIR: "
            f"DIR/{what}.pem and DIR/{what}.key"
        )
        use = (
            "'aa router --cert DIR/NAME.pem --key DIR/NAME.key --ca DIR/ca.pem'"
            if kind == "router"
            else "a client's AA_CERT=DIR/USER.pem AA_KEY=DIR/USER.key AA_CA=DIR/ca.pem"
        )
        a = actions.add_parser(kind, help=text, description=f"Make {text}, for {use}.")
        a.add_argument(
            "dir", type=Path, metavar="DIR", help="the CA's folder (from 'aa certs init DIR')"
        )
        a.add_argument(
            "name",
            metavar=what,
            help="letters, digits and . _ @ -; becomes "
            + ("the router's name (its ids begin with it)" if kind == "router" else 'meta["user"]'),
        )
        a.add_argument("--days", type=int, default=days, help=f"days it is valid (default: {days})")
        if kind == "router":
            a.add_argument(
                "--host",
                action="append",
                default=[],
                metavar="H",
                help="a host name or address to name in the certificate too; repeatable",
            )
        a.set_defaults(func=_issue, kind=kind)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _write(path: Path, data: bytes, secret: bool) -> None:
    mode = 0o600 if secret else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # an existing file keeps its mode through O_CREAT: set it
        os.write(fd, data)
    finally:
        os.close(fd)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _check_days(days: int) -> None:
    if not 1 <= days <= 36500:
        raise UsageError(f"--days must be 1 to 36500, not {days}")


def init_ca(
    folder: Path, *, days: int = CA_DAYS, force: bool = False, now: datetime | None = None
) -> Path:
    """Make the mesh CA in *folder*; returns the certificate's path. Raises `UsageError`."""
    _check_days(days)
    cert_path, key_path = folder / "ca.pem", folder / "ca.key"
    if key_path.exists() and not force:
        raise UsageError(
            f"{key_path} exists already (--force replaces it, and every certificate it signed "
            "stops being trusted)"
        )
    now = now or datetime.now(UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "Aa mesh CA"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "aa-ca"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write(key_path, _key_pem(key), secret=True)
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), secret=False)
    except OSError as exc:
        raise UsageError(f"cannot write the CA in {folder}: {exc.strerror or exc}") from None
    return cert_path


def issue(
    folder: Path,
    name: str,
    kind: str,
    *,
    days: int,
    hosts: tuple[str, ...] = (),
    now: datetime | None = None,
) -> tuple[Path, Path]:
    """Make *kind* ("router" or "client") certificate *name* signed by the CA in *folder*;
    returns (certificate, key) paths. *now* may lie in the past (tests make expired ones)."""
    _check_days(days)
    if not NAME_RE.match(name) or name in ("ca", "anonymous"):
        raise UsageError(
            f"{name!r} is not a usable name: letters, digits and . _ @ - (at most 64), "
            "not 'ca' nor 'anonymous'"
        )
    ca_cert = check_cert_file(folder / "ca.pem", "CA certificate")
    try:
        ca_key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None)
    except FileNotFoundError:
        raise UsageError(
            f"{folder / 'ca.key'} does not exist: run 'aa certs init {folder}' first"
        ) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the CA key {folder / 'ca.key'}: {exc}") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise UsageError(f"{folder / 'ca.key'} is not the EC key 'aa certs init' makes")
    now = now or datetime.now(UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if kind == "router":
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, _UNITS[kind]),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if kind == "router":
        alt: list[x509.GeneralName] = [
            x509.DNSName(name),
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        for h in hosts:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                alt.append(x509.DNSName(h))
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    try:
        _write(key_path, _key_pem(key), secret=True)
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), secret=False)
    except OSError as exc:
        raise UsageError(f"cannot write {cert_path}: {exc.strerror or exc}") from None
    return cert_path, key_path


def _init(args: argparse.Namespace) -> int:
    path = init_ca(args.dir, days=args.days, force=args.force)
    print(
        f"wrote {path} and {args.dir / 'ca.key'} (keep ca.key secret: it admits routers and users)"
    )
    return 0


def _issue(args: argparse.Namespace) -> int:
    cert, key = issue(
        args.dir, args.name, args.kind, days=args.days, hosts=tuple(getattr(args, "host", ()))
    )
    who = "router" if args.kind == "router" else "user"
    print(f"wrote {cert} and {key} ({who} {args.name}, valid {args.days} days)")
    return 0
