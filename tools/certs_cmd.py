"""`aa certs`: a mesh's certificates, tokens and revocations.

    aa certs init DIR              the mesh CA: DIR/ca.pem, DIR/ca.key, an empty DIR/crl.pem
    aa certs router DIR NAME       a router's certificate, signed by it: DIR/NAME.pem, DIR/NAME.key
    aa certs client DIR USER       a user's certificate: DIR/USER.pem, DIR/USER.key
    aa certs token DIR USER        a bearer token for USER (phones, scripts), printed
    aa certs revoke DIR NAME       every certificate and token issued to NAME so far: DIR/crl.pem

Keys are EC P-256 (a TLS handshake costs a fraction of an RSA one) written 0600;
certificates 0644. Router certificates carry extended key usage serverAuth and clientAuth (a
router accepts connections and dials its peers), user certificates clientAuth only, so a
user's certificate can pose as a router to no one (`aa.router.security.tls`). An existing
certificate or key is never overwritten without ``--force``.

What the CA issued is listed in ``DIR/index.txt``, one line each, tab-separated: kind
(router, client, token), name, serial number in hex (a token's id), expiry (ISO 8601 UTC);
``revoke`` reads it to find a name's certificates. The revocation list and its convention
for tokens: `aa.router.security.crl`.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aa.mesh import UsageError
from aa.router.security import (
    MAX_TOKEN_DAYS,
    NAME_RE,
    ROUTER_UNIT,
    USER_UNIT,
    RevocationList,
    check_cert_file,
    issue_token,
    make_crl,
    user_serial,
)

__all__ = [
    "add_parser",
    "init_ca",
    "issue",
    "make_token",
    "revoke",
    "CA_DAYS",
    "ROUTER_DAYS",
    "CLIENT_DAYS",
    "TOKEN_DAYS",
]

#: Default lifetimes in days: the CA outlives what it signs; a user's certificate is renewed
#: yearly (a lost laptop stops being a user within a year even if nobody revokes it).
CA_DAYS = 3650
ROUTER_DAYS = 825
CLIENT_DAYS = 365
#: A token is a bearer secret kept on a phone or in a script's config, copied more easily than
#: a key file: it lives a quarter of a user certificate's year, and a new one is one command.
TOKEN_DAYS = 90
_UNITS = {"router": ROUTER_UNIT, "client": USER_UNIT}
_INDEX = "index.txt"
_CRL = "crl.pem"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        help="replace an existing CA (every certificate it signed stops being trusted; the "
        "list of what it issued and its revocations start afresh)",
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
        a.add_argument(
            "--force",
            action="store_true",
            help=f"replace an existing DIR/{what}.pem or DIR/{what}.key",
        )
        if kind == "router":
            a.add_argument(
                "--host",
                action="append",
                default=[],
                metavar="H",
                help="a host name or address to name in the certificate too; repeatable",
            )
        a.set_defaults(func=_issue, kind=kind)
    t = actions.add_parser(
        "token",
        help="print a bearer token for USER, signed by the CA in DIR",
        description="Print a bearer token naming USER, signed with DIR/ca.key, for phones and "
        "scripts over HTTP(S) ('Authorization: Bearer TOKEN'). Every router of the mesh "
        "verifies it with ca.pem alone. Keep it secret: whoever holds it is USER until it "
        "expires or 'aa certs revoke DIR USER'.",
    )
    t.add_argument("dir", type=Path, metavar="DIR", help="the CA's folder")
    t.add_argument("user", metavar="USER", help='letters, digits and . _ @ -; becomes meta["user"]')
    t.add_argument(
        "--days",
        type=int,
        default=TOKEN_DAYS,
        help=f"days it is valid, 1 to {MAX_TOKEN_DAYS} (default: {TOKEN_DAYS})",
    )
    t.set_defaults(func=_token)
    r = actions.add_parser(
        "revoke",
        help="revoke every certificate and token issued to NAME so far (DIR/crl.pem)",
        description="Revoke every certificate (by its serial number, from DIR/index.txt and "
        "DIR/NAME.pem) and every token issued to NAME until now, in DIR/crl.pem. Routers "
        "given '--crl DIR/crl.pem' read it again when it changes (or on SIGHUP) and cut "
        "NAME's live connections within seconds. Certificates and tokens issued to NAME "
        "afterwards are valid.",
    )
    r.add_argument("dir", type=Path, metavar="DIR", help="the CA's folder")
    r.add_argument("name", metavar="NAME", help="the user or router to revoke")
    r.set_defaults(func=_revoke)

    def usage(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=usage)


def _write(path: Path, data: bytes, secret: bool) -> None:
    """Write *path* whole or not at all (a temporary file renamed over it): routers poll the
    CRL and must never read half of one."""
    mode = 0o600 if secret else 0o644
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_EXCL, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have narrowed or widened it: set it
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
    for path in (key_path, cert_path):
        if path.exists() and not force:
            raise UsageError(
                f"{path} exists already (--force replaces the CA, and every certificate it "
                "signed stops being trusted)"
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
        _write(folder / _INDEX, b"", secret=False)
        _write(folder / _CRL, make_crl(cert, key, {}, number=1, now=now), secret=False)
    except OSError as exc:
        raise UsageError(f"cannot write the CA in {folder}: {exc.strerror or exc}") from None
    return cert_path


def _load_ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
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
    return ca_cert, ca_key


def _record(folder: Path, kind: str, name: str, serial: str, expires: datetime) -> None:
    """Append one line to DIR/index.txt (what the CA issued)."""
    line = f"{kind}\t{name}\t{serial}\t{expires.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}\n"
    try:
        with open(folder / _INDEX, "a", encoding="utf-8") as f:
            f.write(line)
    except OSError as exc:
        raise UsageError(f"cannot write {folder / _INDEX}: {exc.strerror or exc}") from None


def _issued(folder: Path) -> list[tuple[str, str, str]]:
    """(kind, name, serial) of every line of DIR/index.txt (none if there is no index)."""
    try:
        text = (folder / _INDEX).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {folder / _INDEX}: {exc}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split("\t")
        if len(parts) != 4:
            raise UsageError(f"{folder / _INDEX}, line {number}: not 4 tab-separated fields")
        rows.append((parts[0], parts[1], parts[2]))
    return rows


def make_token(folder: Path, user: str, *, days: int = TOKEN_DAYS, now: float) -> str:
    """A bearer token for *user* signed by the CA in *folder* (`aa.router.security.tokens`),
    recorded in DIR/index.txt by its id. Raises `UsageError`."""
    ca_cert, ca_key = _load_ca(folder)
    if user == "anonymous":
        raise UsageError("'anonymous' is no user a token can name")
    token = issue_token(ca_key, user, now=now, days=days)
    expires = datetime.fromtimestamp(int(now) + days * 86400, UTC)
    if expires > ca_cert.not_valid_after_utc:
        raise UsageError(
            f"the token would outlive the CA (valid until {ca_cert.not_valid_after_utc:%Y-%m-%d}): "
            "give fewer --days"
        )
    _record(folder, "token", user, _token_id(token), expires)
    return token


def _token_id(token: str) -> str:
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return str(claims["jti"])


def revoke(folder: Path, name: str, *, now: datetime | None = None) -> tuple[int, int]:
    """Revoke every certificate and token issued to *name* until *now* in DIR/crl.pem;
    returns (certificates, tokens) newly revoked that DIR/index.txt lists (the tokens are
    revoked by user and time whatever the index says). Raises `UsageError`."""
    if not NAME_RE.match(name):
        raise UsageError(f"{name!r} is not a name 'aa certs' issues to")
    ca_cert, ca_key = _load_ca(folder)
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    crl_path = folder / _CRL
    if crl_path.exists():
        current = RevocationList.load(crl_path, ca_cert)
    else:  # a CA made before revocation existed: its first list
        current = RevocationList()
    entries = {
        serial: datetime.fromtimestamp(when, UTC) for serial, when in current.entries.items()
    }
    serials = set()
    tokens = 0
    for kind, who, number in _issued(folder):
        if who != name:
            continue
        if kind == "token":
            tokens += 1
            continue
        try:
            serials.add(int(number, 16))
        except ValueError:
            raise UsageError(f"{folder / _INDEX}: {number!r} is not a serial number") from None
    own = folder / f"{name}.pem"
    if own.exists():  # also one issued before the index existed (expired or not)
        try:
            serials.add(x509.load_pem_x509_certificate(own.read_bytes()).serial_number)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read {own}: {exc}") from None
    fresh = [s for s in serials if s not in entries]
    for s in fresh:
        entries[s] = now
    entries[user_serial(name)] = now  # tokens of *name* issued up to now (the cut-off)
    data = make_crl(ca_cert, ca_key, entries, number=current.number + 1, now=now)
    try:
        _write(crl_path, data, secret=False)
    except OSError as exc:
        raise UsageError(f"cannot write {crl_path}: {exc.strerror or exc}") from None
    return len(fresh), tokens


def issue(
    folder: Path,
    name: str,
    kind: str,
    *,
    days: int,
    hosts: tuple[str, ...] = (),
    now: datetime | None = None,
    force: bool = False,
) -> tuple[Path, Path]:
    """Make *kind* ("router" or "client") certificate *name* signed by the CA in *folder*;
    returns (certificate, key) paths. *now* may lie in the past (tests make expired ones).
    Raises `UsageError`, also when DIR/NAME.pem or DIR/NAME.key exists and not *force*."""
    _check_days(days)
    if not NAME_RE.match(name) or name in ("ca", "anonymous"):
        raise UsageError(
            f"{name!r} is not a usable name: letters, digits and . _ @ - (at most 64), "
            "not 'ca' nor 'anonymous'"
        )
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    for path in (cert_path, key_path):
        if path.exists() and not force:
            raise UsageError(
                f"{path} exists already (a router's or a user's): pick another name, or "
                "--force to replace it"
            )
    ca_cert, ca_key = _load_ca(folder)
    now = now or datetime.now(UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    # A user's certificate never carries serverAuth: routers take exactly the router profile
    # as a peer, and refuse serverAuth from clients (`aa.router.security.tls`).
    usages = (
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        if kind == "router"
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
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
    try:
        _write(key_path, _key_pem(key), secret=True)
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), secret=False)
    except OSError as exc:
        raise UsageError(f"cannot write {cert_path}: {exc.strerror or exc}") from None
    _record(folder, kind, name, f"{cert.serial_number:x}", cert.not_valid_after_utc)
    return cert_path, key_path


def _init(args: argparse.Namespace) -> int:
    path = init_ca(args.dir, days=args.days, force=args.force)
    print(
        f"wrote {path} and {args.dir / 'ca.key'} (keep ca.key secret: it admits routers and "
        f"users), and an empty revocation list {args.dir / _CRL}"
    )
    return 0


def _issue(args: argparse.Namespace) -> int:
    cert, key = issue(
        args.dir,
        args.name,
        args.kind,
        days=args.days,
        hosts=tuple(getattr(args, "host", ())),
        force=args.force,
    )
    who = "router" if args.kind == "router" else "user"
    print(f"wrote {cert} and {key} ({who} {args.name}, valid {args.days} days)")
    return 0


def _token(args: argparse.Namespace) -> int:
    import time

    print(make_token(args.dir, args.user, days=args.days, now=time.time()))
    return 0


def _revoke(args: argparse.Namespace) -> int:
    certificates, tokens = revoke(args.dir, args.name)
    print(
        f"revoked {args.name}: {certificates} certificate(s) and every token issued so far "
        f"({tokens} listed) in {args.dir / _CRL}; routers with --crl read it within seconds"
    )
    return 0
