"""One TCP connection from a client to a router: the codec over an asyncio protocol."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from aa.mesh import ConnectionLost, Connection, ProtocolError
from aa.mesh.protocol import Message

__all__ = ["Link"]

log = logging.getLogger("aa.client")


class Link(asyncio.Protocol):
    """Feeds frames to `on_message`; `lost` resolves when the connection ends."""

    def __init__(self, on_message: Callable[["Link", Message], None], on_writable: Callable[[], None]) -> None:
        self.codec = Connection()
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.paused = False
        self._on_message = on_message
        self._on_writable = on_writable

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.codec.receive_data(data)
        try:
            while True:
                msg = self.codec.next_message()
                if not isinstance(msg, Message):
                    return
                self._on_message(self, msg)
        except ProtocolError as exc:
            log.warning("router sent a bad frame: %s", exc)
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

    def close(self, exc: Exception | None = None) -> None:
        if self.transport is not None:
            self.transport.close()
        if not self.lost.done():
            self.lost.set_result(exc)
