"""aa.addins.adapters — add-ins that republish events with knowledge mined from the event
logs (`aa mine`): the schema adapter (events under another type's schema), the location
adapter (radio scans → locations) and the presence adapter (scans → who is together).

Each adapter loads its artefact from ``<adapters>/<task>/current`` and reloads it when it
changes; `AdapterRunner` runs one on a connected client, and the add-ins of
`aa.addins.adapters.addin` run them in the container.
"""

from .addin import LocationAdapterAddIn, PresenceAdapterAddIn, SchemaAdapterAddIn
from .artefact import (
    ARTEFACT_FORMAT,
    POINTER,
    VERSION_NAME,
    Artefact,
    ArtefactError,
    ArtefactWatch,
    list_versions,
    read_artefact,
    read_pointer,
)
from .base import ADAPTED_BY, ADAPTED_FROM, Adapter, adapted_meta
from .location import LOCATION_TYPE, LocationAdapter
from .presence import PRESENCE_TYPE, PresenceAdapter
from .runner import AdapterRunner
from .schema import SchemaAdapter

__all__ = [
    "ADAPTED_BY",
    "ADAPTED_FROM",
    "ARTEFACT_FORMAT",
    "Adapter",
    "AdapterRunner",
    "Artefact",
    "ArtefactError",
    "ArtefactWatch",
    "LOCATION_TYPE",
    "LocationAdapter",
    "LocationAdapterAddIn",
    "POINTER",
    "PRESENCE_TYPE",
    "PresenceAdapter",
    "PresenceAdapterAddIn",
    "SchemaAdapter",
    "SchemaAdapterAddIn",
    "VERSION_NAME",
    "adapted_meta",
    "list_versions",
    "read_artefact",
    "read_pointer",
]
