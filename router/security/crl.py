"""Revocation: the mesh's certificate revocation list (``DIR/crl.pem``), made by ``aa certs
init`` and ``aa certs revoke``, read and checked by the router's gate (``aa router --crl``).

It is a real X.509 CRL signed by the mesh CA, so OpenSSL and any other tool can read it
(``openssl crl -in crl.pem -text``). It carries two kinds of entries:

- a **certificate** entry: the serial number of a certificate the CA issued (``aa certs``
  keeps them in ``DIR/index.txt``, as OpenSSL's ``ca`` does). A connection presenting that
  certificate is refused right after its handshake, and cut if it is live.
- a **user cut-off** entry, for tokens (``aa certs token``), which have no serial a CRL could
  name and are deliberately not remembered by any router: its serial is derived from the user
  name (`user_serial`: the first 19 bytes of SHA-256 over ``"aa-user-cutoff\\0" + name``), and
  its revocation date is the cut-off: a token of that user *issued at or before* that second
  no longer verifies; tokens issued later do. Real serials are 159 random bits
  (`x509.random_serial_number`), so the two kinds never collide, and the convention needs
  no extension a strict CRL parser could choke on.

A CRL is believed only when the mesh CA's key signed it and its issuer is the CA; each
carries a CRL number (the ``cRLNumber`` extension) that ``aa certs revoke`` raises, and a
router refuses a list whose number is lower than the one in force, so an old file copied
back cannot un-revoke anyone. Its ``nextUpdate`` is not enforced: the list is handed to
routers by the operator, and a deadline nobody re-signed in time would lock every user out.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from aa.mesh import UsageError

__all__ = ["MAX_CRL_BYTES", "RevocationList", "file_stamp", "make_crl", "user_serial"]

#: Largest CRL file read, bytes: an entry is about 40 bytes, so a million revocations fit.
MAX_CRL_BYTES: Final = 64 * 1024 * 1024
_USER_TAG: Final = b"aa-user-cutoff\0"


def user_serial(user: str) -> int:
    """The serial of *user*'s cut-off entry (see the module docstring)."""
    return int.from_bytes(hashlib.sha256(_USER_TAG + user.encode()).digest()[:19], "big") | 1


def _unix(when: datetime) -> int:
    return int(when.timestamp())


@dataclass(frozen=True, slots=True)
class RevocationList:
    """The revocations in force: serial number → Unix second it was revoked."""

    entries: Mapping[int, int] = field(default_factory=dict)
    #: The list's CRL number (0: the empty list of a router without ``--crl``).
    number: int = 0
    #: The file it came from, and that file's (mtime_ns, size, inode) when read.
    path: Path | None = None
    stamp: tuple[int, int, int] | None = None

    def certificate_revoked(self, serial: int | None) -> bool:
        return serial is not None and serial in self.entries

    def token_revoked(self, user: str, issued: int) -> bool:
        """Whether a token of *user* issued at Unix second *issued* is revoked."""
        cutoff = self.entries.get(user_serial(user))
        return cutoff is not None and issued <= cutoff

    def changed(self) -> bool:
        """Whether the file differs from what was read (a cheap `stat`, for polling)."""
        if self.path is None:
            return False
        return file_stamp(self.path) != self.stamp

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], ca: x509.Certificate, *, at_least: int = 0
    ) -> RevocationList:
        """Read and check the CRL at *path*. Raises `UsageError` saying why it is refused:
        missing, unreadable, not a PEM CRL, not issued or not signed by *ca*, or numbered
        below *at_least* (an older list than the one in force)."""
        p = Path(path)
        try:
            stamp = file_stamp(p)
            if stamp is None:
                raise FileNotFoundError(p)
            if stamp[1] > MAX_CRL_BYTES:
                raise UsageError(f"CRL {p} is larger than {MAX_CRL_BYTES} bytes")
            data = p.read_bytes()
        except FileNotFoundError:
            raise UsageError(f"CRL {p} does not exist (made by 'aa certs init')") from None
        except OSError as exc:
            raise UsageError(f"cannot read CRL {p}: {exc.strerror or exc}") from None
        try:
            crl = x509.load_pem_x509_crl(data)
        except ValueError:
            raise UsageError(f"CRL {p} is not a PEM certificate revocation list") from None
        if crl.issuer != ca.subject:
            raise UsageError(f"CRL {p} was not issued by this mesh's CA")
        key = ca.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey) or not crl.is_signature_valid(key):
            raise UsageError(f"CRL {p} is not signed by this mesh's CA")
        try:
            number = crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
        except x509.ExtensionNotFound:
            raise UsageError(f"CRL {p} has no CRL number (made by 'aa certs'?)") from None
        if number < at_least:
            raise UsageError(f"CRL {p} is number {number}, older than number {at_least} in force")
        entries = {r.serial_number: _unix(r.revocation_date_utc) for r in crl}
        return cls(entries, number, p, stamp)


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(mtime_ns, size, inode) of *path*; None when it cannot be read."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def make_crl(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    entries: Mapping[int, datetime],
    *,
    number: int,
    now: datetime,
) -> bytes:
    """A CRL (PEM) revoking *entries* (serial → when), signed with the CA's key."""
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.subject)
        .last_update(now - timedelta(minutes=5))
        .next_update(max(ca.not_valid_after_utc, now + timedelta(days=1)))
        .add_extension(x509.CRLNumber(number), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    for serial, when in sorted(entries.items()):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder()
            .serial_number(serial)
            .revocation_date(when.astimezone(UTC))
            .build()
        )
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
