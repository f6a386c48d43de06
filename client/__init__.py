"""aa.client — publish and subscribe: `Client` (blocking) and `AsyncClient`."""

from .aio import AsyncClient
from .blocking import Client, Subscription
from .config import ClientConfig
from .dial import NOTHING_LISTENS
from .quench import AsyncQuench, Quench
from .subscription import Subscription as AsyncSubscription

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
