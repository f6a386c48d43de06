"""Events as Atom (RFC 4287, paged as RFC 5005) and as JSON (pure: no I/O).

An entry per event, readable in a feed reader and exact for a program::

    <entry>
      <id>urn:aa:event:<event id></id>              stable: the same event, the same id
      <title>reading: Temperature=101, Sensor='lab-1'</title>
      <updated>…</updated> <published>…</published>   the router's receiving time stamp
      <author><name>lab-sensor</name></author>       the publisher (an HTTP one by address)
      <link rel="alternate" href="…/clients/<id>/events/<event id>"/>      the event as JSON
      <category scheme="urn:aa:type" term="reading"/>               the event type, if any
      <category scheme="urn:aa:pattern" term="p1" label="<source>"/>  each pattern that took it
      <summary type="text">Temperature = 101 (int) …</summary>
      <content type="xhtml"><div xmlns="http://www.w3.org/1999/xhtml">
        <ul><li><b>Temperature</b>: 101 <i>(int)</i></li>…</ul>       for people: values,
        <p>type reading · 2026-… · from lab-sensor (…) via router …</p>  type, time, publisher
      </div></content>
      <aa:event>{"id":…,"type":…,"values":…,"meta":…}</aa:event>      for programs
    </entry>

Feed readers show the XHTML content; a program reads ``<aa:event>`` (an RFC 4287 §6.4.1
simple extension element in namespace `AA_NS`, which readers ignore), the link (the event's
JSON on its own), or the whole page as JSON (`render_json`, ``Accept: application/json`` or
``?format=json``). All three carry the typed JSON of `aa.mesh.jsonvalues` (``{"id", "type",
"values", "meta"}``, bytes and datetimes tagged, ints and floats apart), so a client reads
back exactly what was published (`event_from_content`).

The feed carries ``link rel="self"``, ``rel="first"`` (from what the client acknowledged)
and, when more events wait, ``rel="next"`` with the cursor after this page (RFC 5005 §3).
There is no ``rel="previous"``: a queue's earlier pages are what the client acknowledged,
and those are gone. The page's cursor is also ``<aa:cursor>``, for a client that polls
``?after=<cursor>`` next.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote
from xml.sax.saxutils import escape, quoteattr

from aa.mesh import (
    META_ADDRESS,
    META_CLIENT,
    META_ROUTER,
    META_TIME,
    Event,
    event_from_json,
    event_to_json,
    to_json,
)

__all__ = [
    "ATOM_TYPE",
    "AA_NS",
    "entry_id",
    "event_content",
    "publisher",
    "event_from_content",
    "render_atom",
    "render_json",
    "EntryCache",
    "summary",
    "HTTP_PUBLISHER",
]

#: Media type of an Atom feed.
ATOM_TYPE = "application/atom+xml"
#: Namespace of Aa's Atom extension elements (``aa:cursor``).
AA_NS = "urn:aa:atom:1"
#: Scheme of the category naming an event's type / a pattern that took it.
TYPE_SCHEME = "urn:aa:type"
PATTERN_SCHEME = "urn:aa:pattern"

_TITLE_LENGTH = 120  # characters of an entry title; the whole event is in the content
_LABEL_LENGTH = 200  # characters of a pattern's source shown as its category label
_VALUE_LENGTH = 200  # characters of one value shown to people; the whole event is in aa:event
_XHTML = "http://www.w3.org/1999/xhtml"
#: Events whose rendered entry parts `EntryCache` keeps: phones poll within seconds of an
#: event's arrival, and at 200 events/s this is the last 20 s; some 1.5 kB each, so a few MB.
MAX_CACHED_ENTRIES = 4096
#: Bytes (UTF-8) `EntryCache` holds in all, and the largest entry it keeps: a publisher of big
#: events (up to the 1 MiB body cap) must not make the cache hold gigabytes; a big entry is
#: rendered anew each time.
MAX_CACHED_CHARS = 32 * 1024 * 1024
MAX_CACHED_ENTRY_CHARS = 64 * 1024
_QUOTE = {'"': "&quot;"}
#: The client id the HTTP endpoint publishes under (`app`): such a publisher is named by address.
HTTP_PUBLISHER = "http"
# Characters XML 1.0 cannot carry (control characters, lone surrogates, U+FFFE/U+FFFF).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _text(value: str) -> str:
    return escape(_NOT_XML.sub("\ufffd", value))


def _attr(value: str) -> str:
    return quoteattr(_NOT_XML.sub("\ufffd", value))


def _date(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def entry_id(event: Event) -> str:
    """The entry id of *event*: ``urn:aa:event:<id>`` (ids are unique in the mesh)."""
    return f"urn:aa:event:{event.id}"


def event_content(event: Event) -> str:
    """The event's typed JSON, as text (the text of ``<aa:event>``). ASCII, every other
    character escaped by JSON: exact even for strings XML cannot carry (control characters,
    lone surrogates), which the readable content replaces with U+FFFD."""
    return json.dumps(event_to_json(event), separators=(",", ":"))


def event_from_content(text: str) -> Event:
    """The event in an entry's ``<aa:event>`` text (also Base64 of it, as feeds of earlier
    versions carried it in ``<content>``). Raises ValueError / `InvalidValue`."""
    text = text.strip()
    if not text.startswith("{"):
        text = base64.b64decode(text, validate=True).decode("utf-8")
    return event_from_json(json.loads(text))


def _short(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    if isinstance(value, datetime):
        return value.isoformat()
    return repr(value)


def _shown(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, (list, tuple, dict)):
        text = json.dumps(to_json(value), ensure_ascii=False)
    else:
        text = _short(value)
    return text if len(text) <= _VALUE_LENGTH else text[: _VALUE_LENGTH - 1] + "…"


def publisher(event: Event) -> str:
    """Who published *event*, for people: its client id, or for an event published over
    HTTP (where every publisher shares one client id) the address it came from."""
    client, address = event.meta.get(META_CLIENT), event.meta.get(META_ADDRESS)
    name = client if type(client) is str and client else "unknown"
    if name == HTTP_PUBLISHER and type(address) is str:
        return f"HTTP client at {address}"
    return name


def summary(event: Event) -> str:
    """One line per value, with its type: ``Temperature = 101 (int)``."""
    return "\n".join(f"{k} = {_short(v)} ({type(v).__name__})" for k, v in event.values.items())


def _title(event: Event) -> str:
    body = ", ".join(f"{k}={_short(v)}" for k, v in event.values.items())
    title = f"{event.type}: {body}" if event.type else body or "(no values)"
    return title if len(title) <= _TITLE_LENGTH else title[: _TITLE_LENGTH - 1] + "…"


def _stamp(event: Event, default: datetime) -> datetime:
    t = event.meta.get(META_TIME)
    return t if type(t) is datetime and t.tzinfo is not None else default


def render_atom(
    *,
    feed_id: str,
    title: str,
    updated: datetime,
    author: str,
    links: Sequence[tuple[str, str]],
    entries: Iterable[tuple[Event, Sequence[str]]],
    patterns: Mapping[str, str] | None = None,
    cursor: int | None = None,
    event_url: str | None = None,
    cache: EntryCache | None = None,
) -> bytes:
    """An Atom feed document. *links* are (rel, href); *entries* (event, pattern ids);
    *patterns* maps pattern ids to their source, shown as category labels; *event_url* is
    the URL an event's id is appended to for its JSON, each entry's link; *cache* keeps
    entries' shared parts."""
    labels = patterns or {}
    out = [
        '<?xml version="1.0" encoding="utf-8"?>\n',
        f'<feed xmlns="http://www.w3.org/2005/Atom" xmlns:aa="{AA_NS}">',
        f"<id>{_text(feed_id)}</id><title>{_text(title)}</title><updated>{_date(updated)}</updated>",
        f"<author><name>{_text(author)}</name></author>",
        '<generator uri="urn:aa" version="1">Aa</generator>',
    ]
    out.extend(f'<link rel="{rel}" href={_attr(href)}/>' for rel, href in links)
    if cursor is not None:
        out.append(f"<aa:cursor>{cursor}</aa:cursor>")
    parts = cache.parts if cache is not None else _parts
    categories: dict[Sequence[str], bytes] = {}  # most entries of a feed share their patterns
    # The link's URL is escaped once per feed (its host comes from the request: anyone's text).
    prefix = (
        b'<link rel="alternate" href="' + _utf8(escape(_NOT_XML.sub("\ufffd", event_url), _QUOTE))
        if event_url is not None
        else None
    )
    # Bytes from here: entries are kept encoded (`EntryCache`), so a page of them is joined,
    # not encoded anew for every poll.
    chunks = [_utf8("".join(out))]
    for event, pids in entries:
        head, link, body = parts(event, updated)
        chunks.append(head)
        if prefix is not None:  # untyped: feed readers take it as the entry's link
            chunks += (prefix, link, b'"/>')
        tags = categories.get(pids)
        if tags is None:
            tags = categories[pids] = _utf8(
                "".join(_category(pid, labels.get(pid)) for pid in pids)
            )
        chunks.append(tags)
        chunks.append(body)
    chunks.append(b"</feed>\n")
    return b"".join(chunks)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class EntryCache:
    """The parts of an event's entry that do not depend on the feed it is in, rendered once.

    A busy router's event goes to many phones' feeds (every client whose pattern takes it),
    each polled within a second or two of its arrival; rendering the entry anew for each
    would be most of a poll's cost. Only the link and the pattern categories are the client's
    own. Keyed by event id, and the event object checked too (an id names one event in the
    mesh, but a cache must never answer for another object); the oldest go first."""

    __slots__ = ("size", "chars", "_parts")

    def __init__(self, size: int = MAX_CACHED_ENTRIES) -> None:
        self.size = size
        self.chars = 0  # bytes held in all (the name predates keeping them encoded)
        self._parts: dict[str, tuple[Event, bytes, bytes, bytes]] = {}

    def __len__(self) -> int:
        return len(self._parts)

    def parts(self, event: Event, updated: datetime) -> tuple[bytes, bytes, bytes]:
        """(head, link, body) of *event*'s entry (`_parts`); *updated* stands in for a
        missing time stamp."""
        key = event.id
        got = self._parts.get(key) if key else None
        if got is not None and got[0] is event:
            return got[1], got[2], got[3]
        stamped = type(event.meta.get(META_TIME)) is datetime
        head, link, body = _parts(event, updated)
        length = len(head) + len(link) + len(body)
        if (
            key and stamped and length <= MAX_CACHED_ENTRY_CHARS
        ):  # one dated by its feed is that feed's
            parts = self._parts
            old = parts.pop(key, None)
            if old is not None:
                self.chars -= len(old[1]) + len(old[2]) + len(old[3])
            while parts and (len(parts) >= self.size or self.chars + length > MAX_CACHED_CHARS):
                _, h, k, b = parts.pop(next(iter(parts)))
                self.chars -= len(h) + len(k) + len(b)
            parts[key] = (event, head, link, body)
            self.chars += length
        return head, link, body


def _parts(event: Event, updated: datetime) -> tuple[bytes, bytes, bytes]:
    """An entry but for its link and pattern categories, in UTF-8: what goes before them,
    the event's id as the link's last path segment (percent-encoded), and what goes after
    them."""
    stamp = _stamp(event, updated)
    when = _date(stamp)
    who = _text(publisher(event))
    head = [
        f"<entry><id>{_text(entry_id(event))}</id><title>{_text(_title(event))}</title>",
        f"<updated>{when}</updated><published>{when}</published><author><name>{who}</name></author>",
    ]
    if event.type:
        head.append(f'<category scheme="{TYPE_SCHEME}" term={_attr(event.type)}/>')
    # For people: what a feed reader shows. Every piece of text is escaped (_text): values
    # are strangers' strings, and this is markup a reader renders.
    body = [
        f'<summary type="text">{_text(summary(event))}</summary>',
        f'<content type="xhtml"><div xmlns="{_XHTML}"><ul>',
    ]
    for name, value in event.values.items():
        body.append(
            f"<li><b>{_text(name)}</b>: {_text(_shown(value))} <i>({type(value).__name__})</i></li>"
        )
    body.append("</ul><p>")
    if event.type:
        body.append(f"Type <b>{_text(event.type)}</b> · ")
    via = event.meta.get(META_ROUTER)
    body.append(f"{_text(stamp.isoformat())} · published by {who}")
    if type(via) is str and via:
        body.append(f" via router {_text(via)}")
    body.append(f"</p></div></content><aa:event>{escape(event_content(event))}</aa:event></entry>")
    return _utf8("".join(head)), _utf8(quote(event.id or "", safe="")), _utf8("".join(body))


def _category(pid: str, label: str | None) -> str:
    extra = f" label={_attr(label[:_LABEL_LENGTH])}" if label else ""
    return f'<category scheme="{PATTERN_SCHEME}" term={_attr(pid)}{extra}/>'


def render_json(
    *,
    links: Mapping[str, str],
    entries: Iterable[tuple[Event, Sequence[str]]],
    cursor: int | None = None,
    more: bool = False,
    **extra: Any,
) -> bytes:
    """The same page as JSON: ``{"cursor", "more", "links", "entries": [{"patterns",
    "event"}]}`` with events in typed JSON."""
    body = {
        **extra,
        "cursor": cursor,
        "more": more,
        "links": dict(links),
        "entries": [{"patterns": list(pids), "event": event_to_json(e)} for e, pids in entries],
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )
