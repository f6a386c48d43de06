"""aa.client — publish and subscribe: `Client` (blocking) and `AsyncClient`."""

from .aio import AsyncClient
from .config import ClientConfig
from .dial import NOTHING_LISTENS
from .quench import AsyncQuench, Quench
from .subscription import Subscription as AsyncSubscription
from .sync import Client, Subscription

__all__ = [
    "AsyncClient",
    "AsyncQuench",
    "AsyncSubscription",
    "Client",
    "ClientConfig",
    "NOTHING_LISTENS",
    "Quench",
    "Subscription",
]
