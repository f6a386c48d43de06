"""aa.http_api — the RESTful endpoint every router exposes (Å §4.8): a FastAPI application
over the router's public interface, served by uvicorn inside the router's event loop; Atom
feeds of HTTP clients' cached events for polling phones; the live web monitor at ``/``.

Compose it with a router (the router never imports this package)::

    from aa.router import Router, RouterConfig
    from aa.http_api import HttpEndpoint

    async with Router(RouterConfig(), endpoints=[HttpEndpoint(port=7448)]) as router:
        ...

The browser's client is the ES module served at ``/static/aa.js`` (class `AaClient`).

Decisions (details in the module named):

- An HTTP client's patterns are one router client cache each, keyed
  ``http:<client>:<pattern>``; its feed is their union, each event once, tagged with the
  patterns that took it, in arrival order, paged by one cursor (`clients`).
- Polling (``GET /clients/{id}/feed``, ``?after=<cursor>`` for only what is newer) is safe
  and is the keep-alive; acknowledgement is explicit, ``POST /clients/{id}/ack`` with a
  cursor or an event id, and drops what it covers (`clients`).
- Atom entries are for people and programs at once: XHTML content a feed reader shows (the
  values with their types, the event type, time and publisher), the event's exact typed
  JSON in an ``<aa:event>`` extension element, and a link to the event's JSON
  (``GET /clients/{id}/events/{event id}``); the whole page is JSON by ``Accept`` or
  ``?format=json`` (`atom`).
- A poll is cheap: ``GET /clients/{id}/feed`` skips FastAPI's routing and parameter
  machinery (`fastfeed`), an event's entry is rendered once for every feed it is on
  (`atom.EntryCache`), and uvicorn parses HTTP with httptools.
- ``/docs`` and ``/redoc`` read the OpenAPI 3.1 document from local files (`docs`); the
  schema says what the router accepts (bounds, 64-bit ints, the duplicate answer), checked
  by schemathesis in the tests.
- Only loopback may call by default; other ranges are the operator's choice
  (``HttpEndpoint(allow=...)``, ``aa router --http-allow``); bodies are capped at 1 MiB
  (`guard`, `limits`).
"""

from .app import create_app
from .atom import ATOM_TYPE, entry_id, event_from_content
from .clients import BadToken, Capacity, UnknownClient
from .endpoint import HttpConfig, HttpEndpoint
from .limits import DEFAULT_ALLOW, DEFAULT_HTTP_PORT, MAX_BODY_BYTES, MAX_BODY_VALUES

__all__ = [
    "ATOM_TYPE",
    "BadToken",
    "Capacity",
    "DEFAULT_ALLOW",
    "DEFAULT_HTTP_PORT",
    "HttpConfig",
    "HttpEndpoint",
    "MAX_BODY_BYTES",
    "MAX_BODY_VALUES",
    "UnknownClient",
    "create_app",
    "entry_id",
    "event_from_content",
]
