"""The `xpath` kernel: an XPath 2.0 expression (XPath 1.0 is a subset, in all but a few
corner cases) over the event as XML, evaluated by elementpath; its effective boolean value
decides the match. Parameters are XPath variables: `/event/values/Temperature > $threshold`.

The event as XML (built once per event, and only when some xpath pattern is evaluated)::

    <event type="reading" id="...">              type/id attributes only when set
      <values>
        <Temperature type="int">101</Temperature>
        <value name="not an XML name" type="str">x</value>
        <Readings type="list"><item type="float">1.5</item>...</Readings>
        <Location type="map"><Room type="str">A1</Room></Location>
        <Photo type="bytes">base64...</Photo>
        <When type="datetime">2024-05-01T12:00:00+00:00</When>
        <Nothing type="none"/>
      </values>
      <meta><client type="str">c1</client>...</meta>
    </event>

Names matching `[A-Za-z_][A-Za-z0-9_.-]*` (and not starting with "xml") become element
names; any other name goes as `<value name="...">`. Booleans are `true`/`false`, floats use
the xs:double forms (`INF`, `-INF`, `NaN`), so comparisons in XPath behave as expected.

Sandbox. XPath 2.0 can loop (`for`, quantifiers, nested predicates) inside elementpath's
Python code, where no tick of ours can be inserted, so evaluations (and compilations:
elementpath evaluates constant sub-expressions while parsing) run under a `sys.setprofile`
hook that checks the deadline on every Python call and return, a cost on top of
elementpath's own. The parser is a restricted copy of elementpath's
XPath 2.0 parser without `doc`, `doc-available` and `collection`, whose integer ranges
(`1 to N`) are capped at `MAX_XPATH_RANGE` and whose `string-join` and `replace` check the
size of their result before building it.
"""

from __future__ import annotations

import base64
import math
import re
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import cache
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeVar
from xml.etree.ElementTree import Element, SubElement

from aa.mesh import Event, PatternError

from .assembly import Sandbox
from .budget import MEMORY, SandboxStop
from .limits import COMPILE_TIME_FACTOR, MAX_XPATH_RANGE

if TYPE_CHECKING:
    from ..index import Bucket

__all__ = ["XPathProgram", "XmlCache", "event_to_xml"]

T = TypeVar("T")
_XML_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_REMOVED = ("doc", "doc-available", "collection")
#: Longest text `string-join` and `replace` may build in an XPath pattern, in characters.
_MAX_XPATH_TEXT = 1_000_000


@cache
def _sandbox_parser() -> Any:
    """elementpath's XPath 2.0 parser without the functions that read files, with the
    operations that can build huge results guarded. Built on the first XPath pattern:
    elementpath is imported only by a router that compiles one."""
    from elementpath import XPath2Parser

    parser = XPath2Parser.create_restricted_parser(
        "Sandbox", [s for s in XPath2Parser.symbol_table if s not in _REMOVED]
    )
    _guarded_token(parser, "to", _check_range)
    _guarded_token(parser, "string-join", _check_join)
    _guarded_token(parser, "replace", _check_replace)
    return parser


def _guarded_token(parser: Any, symbol: str, check: Callable[[Any, Any], None]) -> None:
    original = parser.symbol_table[symbol]

    def evaluate(self: Any, context: Any = None) -> Any:
        check(self, context)
        return original.evaluate(self, context)

    parser.symbol_table[symbol] = type(
        f"_Sandbox{original.__name__}", (original,), {"evaluate": evaluate}
    )


def _check_range(token: Any, context: Any) -> None:
    start, stop = token.get_operands(context)
    if isinstance(start, int) and isinstance(stop, int) and stop - start + 1 > MAX_XPATH_RANGE:
        raise SandboxStop(
            MEMORY, f"pattern stopped: range {start} to {stop} is longer than {MAX_XPATH_RANGE:,}"
        )


def _check_join(token: Any, context: Any) -> None:
    items = list(token[0].atomization(context))
    sep = token.get_argument(context, 1) or ""
    total = sum(len(str(i)) for i in items) + len(sep) * max(len(items) - 1, 0)
    if total > _MAX_XPATH_TEXT:
        raise SandboxStop(MEMORY, f"pattern stopped: string-join would build {total:,} characters")


def _check_replace(token: Any, context: Any) -> None:
    text = token.get_argument(context, default="") or ""
    replacement = token.get_argument(context, 2) or ""
    per_match = len(replacement) + str(replacement).count("$") * len(text)
    if len(text) * max(per_match, 1) > _MAX_XPATH_TEXT:
        raise SandboxStop(
            MEMORY, "pattern stopped: replace() could build more than 1,000,000 characters"
        )


class XmlCache:
    """The XML of the event being matched, shared by all xpath patterns of an engine."""

    __slots__ = ("event", "root")

    def __init__(self) -> None:
        self.event: Event | None = None
        self.root: Element | None = None

    def get(self, event: Event) -> Element:
        if self.event is not event:
            self.root = event_to_xml(event)
            self.event = event
        assert self.root is not None
        return self.root


class XPathProgram:
    """A compiled `xpath`/`expr` pattern."""

    kind = "xpath"

    def __init__(self, sandbox: Sandbox, source: str, xml: XmlCache) -> None:
        self.sandbox = sandbox
        self.xml = xml
        self.mentions = frozenset(re.findall(r"[A-Za-z_][\w.\-]*", source))
        budget = sandbox.budget
        from elementpath import ElementPathError, XPathContext

        parser = self.load()  # outside the compile budget: once per process
        self._context = XPathContext
        try:
            self.token = _timed(
                sandbox, lambda: parser().parse(source), budget.limit * COMPILE_TIME_FACTOR
            )
        except SandboxStop as stop:
            raise PatternError(
                f"pattern refused: {stop.message.removeprefix('pattern stopped: ')} while "
                "compiling",
                code="pattern-refused",
            ) from None
        except ElementPathError as exc:
            raise PatternError(f"pattern does not compile: {exc}", code="pattern-compile") from None
        except (RecursionError, MemoryError):
            raise PatternError(
                "pattern does not compile: it is nested too deeply", code="pattern-compile"
            ) from None
        except Exception as exc:  # elementpath raises plain ValueError/TypeError for some inputs
            raise PatternError(f"pattern does not compile: {exc}", code="pattern-compile") from None
        finally:
            budget.violation = None

    @staticmethod
    def load() -> Any:
        """Import elementpath and build the sandboxed parser now, not at the first XPath
        pattern: a worker process does, before its lock-down leaves it no file to open."""
        return _sandbox_parser()

    def prepare(self, bucket: Bucket) -> None:
        bucket.context = {name: _xpath_value(v) for name, v in bucket.params.items()}

    def run(self, bucket: Bucket, event: Event) -> bool:
        root = self.xml.get(event)
        token = self.token
        variables = bucket.context
        context = self._context
        try:
            return _timed(
                self.sandbox,
                lambda: bool(
                    token.boolean_value(token.evaluate(context(root, variables=variables)))
                ),
            )
        except SandboxStop:
            raise
        except MemoryError:
            raise SandboxStop(MEMORY, "pattern stopped: it ran out of memory") from None
        except Exception:
            return False


def _timed(sandbox: Sandbox, fn: Callable[[], T], limit: float | None = None) -> T:
    """Run *fn* with the budget checked on every Python call and return inside it."""
    budget = sandbox.budget
    budget.start(limit)
    perf = perf_counter

    def hook(frame: Any, event: str, arg: Any) -> None:
        if perf() > budget.deadline:
            budget.expired()  # raises; CPython then drops the hook and propagates

    old = sys.getprofile()
    sys.setprofile(hook)
    try:
        result = fn()
    finally:
        sys.setprofile(old)
    if budget.violation is not None:  # swallowed by elementpath
        raise budget.violation
    return result


def event_to_xml(event: Event) -> Element:
    """The event as an ElementTree element (see the module docstring)."""
    root = Element("event")
    if event.type is not None:
        root.set("type", event.type)
    if event.id is not None:
        root.set("id", event.id)
    _fill(SubElement(root, "values"), event.values)
    _fill(SubElement(root, "meta"), event.meta)
    return root


def _fill(parent: Element, mapping: Mapping[str, Any]) -> None:
    for name, value in mapping.items():
        if _XML_NAME.match(name) and name[:3].lower() != "xml":
            el = SubElement(parent, name)
        else:
            el = SubElement(parent, "value")
            el.set("name", name)
        _put(el, value)


def _put(el: Element, v: Any) -> None:
    if v is None:
        el.set("type", "none")
    elif isinstance(v, bool):
        el.set("type", "bool")
        el.text = "true" if v else "false"
    elif isinstance(v, int):
        el.set("type", "int")
        el.text = str(v)
    elif isinstance(v, float):
        el.set("type", "float")
        el.text = (
            "NaN" if math.isnan(v) else ("INF" if v > 0 else "-INF") if math.isinf(v) else repr(v)
        )
    elif isinstance(v, str):
        el.set("type", "str")
        el.text = v
    elif isinstance(v, bytes):
        el.set("type", "bytes")
        el.text = base64.b64encode(v).decode("ascii")
    elif isinstance(v, datetime):
        el.set("type", "datetime")
        el.text = v.isoformat()
    elif isinstance(v, (list, tuple)):
        el.set("type", "list")
        for item in v:
            _put(SubElement(el, "item"), item)
    elif isinstance(v, dict):
        el.set("type", "map")
        _fill(el, v)
    else:  # not in the value model; events are checked, so only for robustness
        el.set("type", "str")
        el.text = str(v)


def _xpath_value(v: Any) -> Any:
    """A parameter as an XPath variable value."""
    if v is None:
        return []
    if isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return [_xpath_value(x) for x in v]
    return str(v)
