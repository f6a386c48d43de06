"""Events as Atom (RFC 4287, paged as RFC 5005) and as JSON (pure: no I/O).

An entry per event::

    <entry>
      <id>urn:aa:event:<event id></id>              stable: the same event, the same id
      <title>reading: Temperature=101, Sensor='lab-1'</title>
      <updated>…</updated> <published>…</published>   the router's receiving time stamp
      <author><name><publishing client id></name></author>
      <category scheme="urn:aa:type" term="reading"/>               the event type, if any
      <category scheme="urn:aa:pattern" term="p1" label="<source>"/>  each pattern that took it
      <summary type="text">Temperature = 101 (int) …</summary>    for people
      <content type="application/json">base64…</content>          for programs
    </entry>

The content is the event in the typed JSON of `aa.mesh.jsonvalues` (``{"id", "type",
"values", "meta"}``, bytes and datetimes tagged, ints and floats apart), so a client reads
back exactly what was published. RFC 4287 §4.1.3.3 requires content of a media type that is
neither XML nor text to be Base64-encoded, so it is (feedparser decodes it by itself;
`event_from_content` does it for anyone else).

The feed carries ``link rel="self"``, ``rel="first"`` (from what the client acknowledged)
and, when more events wait, ``rel="next"`` with the cursor after this page (RFC 5005 §3).
There is no ``rel="previous"``: a queue's earlier pages are what the client acknowledged,
and those are gone. The page's cursor is also ``<aa:cursor>`` (namespace `AA_NS`), an
extension element, for a client that polls ``?after=<cursor>`` next.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence
from xml.sax.saxutils import escape, quoteattr

from aa.mesh import Event
from aa.mesh import META_CLIENT, META_TIME
from aa.mesh import event_from_json, event_to_json

__all__ = [
    "ATOM_TYPE",
    "AA_NS",
    "entry_id",
    "event_content",
    "event_from_content",
    "render_atom",
    "render_json",
    "summary",
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
# Characters XML 1.0 cannot carry (control characters, lone surrogates, U+FFFE/U+FFFF).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _text(value: str) -> str:
    return escape(_NOT_XML.sub("\ufffd", value))


def _attr(value: str) -> str:
    return quoteattr(_NOT_XML.sub("\ufffd", value))


def _date(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def entry_id(event: Event) -> str:
    """The entry id of *event*: ``urn:aa:event:<id>`` (ids are unique in the mesh)."""
    return f"urn:aa:event:{event.id}"


def event_content(event: Event) -> str:
    """The Base64 of the event's typed JSON (the text of ``<content>``)."""
    data = json.dumps(event_to_json(event), ensure_ascii=False, separators=(",", ":"))
    return base64.b64encode(data.encode("utf-8", "surrogatepass")).decode("ascii")


def event_from_content(text: str) -> Event:
    """The event in an entry's ``<content type="application/json">`` (Base64 or, as a
    feed reader may hand it over, already decoded). Raises ValueError / `InvalidValue`."""
    text = text.strip()
    if not text.startswith("{"):
        text = base64.b64decode(text, validate=True).decode("utf-8")
    return event_from_json(json.loads(text))  # type: ignore[no-any-return]


def _short(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    if isinstance(value, datetime):
        return value.isoformat()
    return repr(value)


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
) -> bytes:
    """An Atom feed document. *links* are (rel, href); *entries* (event, pattern ids);
    *patterns* maps pattern ids to their source, shown as category labels."""
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
    for event, pids in entries:
        when = _date(_stamp(event, updated))
        out.append(f"<entry><id>{_text(entry_id(event))}</id><title>{_text(_title(event))}</title>")
        out.append(f"<updated>{when}</updated><published>{when}</published>")
        publisher = event.meta.get(META_CLIENT)
        if type(publisher) is str and publisher:
            out.append(f"<author><name>{_text(publisher)}</name></author>")
        if event.type:
            out.append(f'<category scheme="{TYPE_SCHEME}" term={_attr(event.type)}/>')
        for pid in pids:
            label = labels.get(pid)
            extra = f" label={_attr(label[:_LABEL_LENGTH])}" if label else ""
            out.append(f'<category scheme="{PATTERN_SCHEME}" term={_attr(pid)}{extra}/>')
        out.append(f'<summary type="text">{_text(summary(event))}</summary>')
        out.append(f'<content type="application/json">{event_content(event)}</content></entry>')
    out.append("</feed>\n")
    return "".join(out).encode("utf-8", "surrogatepass")


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
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
