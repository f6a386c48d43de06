"""One TCP connection from a client to a router: the codec over an asyncio protocol, over
TLS when the client has the mesh CA (`ClientConfig.ca`, `$AA_CA`).

TLS on the client side: the router must show a certificate the mesh CA signed for a router
(OpenSSL checks the chain and the serverAuth usage; host names are not checked, since
routers are reached at whatever address discovery or the mesh gives). The user's own
certificate, when configured, is presented and makes the client that user. A mismatch —
TLS towards a plaintext router, a router another CA signed, an expired certificate — ends
the attempt at once with a `ConnectionLost` saying which (the router, for its part, answers
a plaintext client on its TLS port with an error frame, `tls-required`): never a hang.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import ssl
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

from aa.mesh import Connection, ConnectionLost, ForeignProtocol, ProtocolError, UsageError
from aa.mesh.protocol import Message

from .deliveries import DeliveryReader

if TYPE_CHECKING:
    from .config import ClientConfig

__all__ = ["Link", "open_link", "client_tls"]

#: TLS contexts built, by (ca, cert, key): a context is made once per configuration (loading
#: files costs milliseconds), not per connection attempt. Capped: configurations are few.
_CONTEXTS: dict[tuple[Path | None, ...], ssl.SSLContext] = {}
_MAX_CONTEXTS = 32

log = logging.getLogger("aa.client")


class Link(asyncio.Protocol):
    """Feeds frames to `on_message`; `lost` resolves when the connection ends."""

    def __init__(
        self, on_message: Callable[[Link, Message], None], on_writable: Callable[[], None]
    ) -> None:
        self.codec = Connection()
        self._deliveries = DeliveryReader(self.codec)
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.paused = False
        #: Monotonic time bytes last came from the router: what the client last had from it.
        self.heard = time.monotonic()
        self._on_message = on_message
        self._on_writable = on_writable

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream's: a Transport

    def data_received(self, data: bytes) -> None:
        self.heard = time.monotonic()
        self.codec.receive_data(data)
        # The cyclic collector is held off while the frames of this read are decoded and
        # handed over (at most one frame cap of bytes and one read). A delivery frame's events
        # (a few objects each) all live until its last one is handed over: a collection in
        # between finds them all alive, moves them to the older generations, and a full
        # collection of the whole heap follows every few frames. Handed over and freed, they
        # leave the collector's count where it was. It is switched back on however the
        # frames end (a callback or the codec raising), and left off if it was off.
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            self._read_frames()
        finally:
            if collecting:
                gc.enable()

    def _read_frames(self) -> None:
        next_deliver = self._deliveries.next_deliver
        next_message = self.codec.next_message
        try:
            while True:
                msg = next_deliver() or next_message()
                if not isinstance(msg, Message):
                    return
                self._on_message(self, msg)
        except ProtocolError as exc:
            # (another protocol altogether is what `connect` then says, once)
            log.log(
                logging.INFO if isinstance(exc, ForeignProtocol) else logging.WARNING,
                "router sent a bad frame: %s",
                exc,
            )
            self.close(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._on_writable()

    def send(self, msg: Message) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionLost("not connected")
        self.transport.write(self.codec.send(msg))

    def send_publish(self, seq: int, packed: list[bytes]) -> None:
        """`send` of a `Publish` of events given as their bytes (`Connection.send_publish`)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionLost("not connected")
        self.transport.write(self.codec.send_publish(seq, packed))

    def close(self, exc: Exception | None = None) -> None:
        if self.transport is not None:
            self.transport.close()
        if not self.lost.done():
            self.lost.set_result(exc)


def _check_cert(path: Path, what: str) -> None:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise UsageError(f"{what} {path} is not a PEM certificate") from None
    if cert.not_valid_after_utc < datetime.now(UTC):
        raise UsageError(f"{what} {path} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")


def client_tls(config: ClientConfig) -> ssl.SSLContext | None:
    """The TLS context *config* asks for (None: plaintext). Raises `UsageError` for a
    missing, unreadable or expired file, or a key that does not fit its certificate."""
    if config.ca is None:
        return None
    token = (config.ca, config.cert, config.key)
    ctx = _CONTEXTS.get(token)
    if ctx is not None:
        return ctx
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    _check_cert(config.ca, "CA certificate")
    try:
        ctx.load_verify_locations(cafile=os.fspath(config.ca))
    except ssl.SSLError as exc:
        raise UsageError(f"CA certificate {config.ca}: {exc.reason}") from None
    if config.cert is not None and config.key is not None:
        _check_cert(config.cert, "certificate")
        try:
            ctx.load_cert_chain(os.fspath(config.cert), os.fspath(config.key))
        except FileNotFoundError:
            raise UsageError(f"key {config.key} does not exist") from None
        except (ssl.SSLError, OSError) as exc:
            raise UsageError(
                f"certificate {config.cert} and key {config.key} cannot be used together "
                f"({getattr(exc, 'reason', None) or exc})"
            ) from None
    if len(_CONTEXTS) >= _MAX_CONTEXTS:
        _CONTEXTS.clear()
    _CONTEXTS[token] = ctx
    return ctx


def _tls_failure(exc: ssl.SSLError, endpoint: str) -> str:
    reason = (exc.reason or str(exc)).upper()
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"router {endpoint}'s certificate is not one the mesh CA signed for a router "
            f"({exc.verify_message})"
        )
    if (
        "WRONG_VERSION_NUMBER" in reason
        or "RECORD_LAYER_FAILURE" in reason
        or "PACKET_LENGTH_TOO_LONG" in reason
    ):
        return (
            f"router {endpoint} does not speak TLS (a router without --cert?): "
            "unset AA_CA to talk to it"
        )
    if "EXPIRED" in reason:
        return f"router {endpoint} refused our certificate: it expired"
    if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason:
        return f"router {endpoint} refused our certificate: another CA signed it"
    return f"TLS with router {endpoint} failed: {exc.reason or exc}"


async def open_link(
    config: ClientConfig | None, factory: Callable[[], Link], host: str, port: int
) -> Link:
    """Connect a `Link` to (host, port), with TLS when *config* has a CA. Raises OSError
    when the router cannot be reached, `ConnectionLost` (saying why) when TLS fails."""
    loop = asyncio.get_running_loop()
    ctx = client_tls(config) if config is not None else None
    if config is None or ctx is None:
        _, link = await loop.create_connection(factory, host, port)
        return link
    try:
        _, link = await loop.create_connection(
            factory,
            host,
            port,
            ssl=ctx,
            server_hostname=host,
            ssl_handshake_timeout=config.connect_timeout,
        )
    except ssl.SSLError as exc:
        raise ConnectionLost(_tls_failure(exc, f"{host}:{port}")) from exc
    except ConnectionResetError as exc:  # the router closed during the handshake
        raise ConnectionLost(
            f"router {host}:{port} closed the TLS handshake (our certificate refused?)"
        ) from exc
    return link
