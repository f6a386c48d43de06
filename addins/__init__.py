"""aa.addins — the container service and its add-ins (Å §4.7).

- `AddIn`, `Context`: the add-in API (`aa.addins.api`).
- `Container`, `ContainerConfig`: hosts add-ins from folders and entry points, restarts the
  ones that fail, reloads the ones that change (`aa.addins.container`).
- `aa.addins.office`: the simulated office (`OfficeWorld`) the bundled add-ins publish from.
- `aa.addins.bundled`: the bundled add-ins — weather, quotes, a quote→ticker adapter,
  laptops' and phones' scans and positions (`aa container --bundled`).
"""

from .api import AddIn, Context
from .container import DEFAULT_POLL_INTERVAL, Container, ContainerConfig, default_data_dir
from .loader import ENTRY_POINT_GROUP, AddInLoadError
from .runner import Backoff

__all__ = [
    "AddIn",
    "AddInLoadError",
    "Backoff",
    "Container",
    "ContainerConfig",
    "Context",
    "DEFAULT_POLL_INTERVAL",
    "ENTRY_POINT_GROUP",
    "default_data_dir",
]
