"""`aa send` and `aa subscribe`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aa.client import Client
from aa.mesh import AaError, PatternSpec, UsageError

from .common import (
    add_router_option,
    fail,
    parse_assignments,
    parse_json_object,
    parse_since,
    print_event,
    router_endpoints,
)

__all__ = ["add_parsers"]


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "send",
        help="publish one event",
        description="Publish one event. Values: 3 is an int, 2.5 a float, true/false a bool, "
        "anything else a string; --json gives nested or typed values.",
        epilog="example: aa send --type reading Temperature=101 Sensor=lab-1",
    )
    add_router_option(p)
    p.add_argument("--type", help="the event's type")
    p.add_argument("--json", metavar="OBJECT", help='values as a JSON object, e.g. \'{"Reading": {"t": [1, 2]}}\'')
    p.add_argument("--meta", metavar="NAME=VALUE", action="append", default=[], help="a meta value, repeatable")
    p.add_argument("values", nargs="*", metavar="NAME=VALUE", help="event values")
    keep = p.add_argument_group(
        "persistence",
        "Ask every router to keep the event in its persistent store, replayed to subscribers "
        "that ask for history (aa subscribe --history). The command returns once the router "
        "has written it. Example: --persist --max-age 3h --max-count 5 --type snow keeps "
        "events of type snow for three hours, at most the newest five.",
    )
    keep.add_argument("--persist", action="store_true", help="keep the event in the routers' stores")
    keep.add_argument("--max-age", metavar="DURATION", help="remove it after this long: 90s, 3h, 2d, 1h30m")
    keep.add_argument("--max-count", metavar="N", help="keep at most the newest N stored events of its --type")
    keep.add_argument("--no-mesh-cache", action="store_true",
                      help="keep the event out of the routers' in-memory mesh cache")
    p.set_defaults(func=send)

    p = sub.add_parser(
        "subscribe",
        help="print matching events",
        description="Subscribe with a Python pattern and print each matching event, one per line.",
        epilog='example: aa subscribe --count 1 --json "Temperature > 100"',
    )
    add_router_option(p)
    p.add_argument("expr", nargs="?", help="a boolean Python expression over event values (default: every event)")
    p.add_argument("--script", type=Path, metavar="FILE", help="a stateful pattern script (calls forward())")
    p.add_argument("--xpath", metavar="EXPR", help="an XPath pattern instead of a Python one")
    p.add_argument("--param", metavar="NAME=VALUE", action="append", default=[], help="a pattern parameter, repeatable")
    p.add_argument("--needs", metavar="NAME", action="append", default=[],
                   help="a value name the pattern needs, repeatable: lets quenching publishers "
                   "whose prototype carries the names see this narrow pattern (see aa quench)")
    p.add_argument("--count", type=int, metavar="N", help="exit after N events")
    p.add_argument("--json", action="store_true", help='one JSON object per line: {"id", "type", "values", "meta"}')
    p.add_argument("--history", action="store_true",
                   help="first print the stored events the pattern matches, oldest first, marked "
                   "(historical); then the live ones")
    p.add_argument("--since", metavar="T",
                   help="history from time T only (implies --history): ISO 8601 such as "
                   "2030-01-02T03:04:05Z, or a duration ago such as 2h")
    p.set_defaults(func=subscribe)


def send(args: argparse.Namespace) -> int:
    try:
        values: dict[str, Any] = parse_json_object(args.json) if args.json else {}
        values.update(parse_assignments(args.values))
        meta = parse_assignments(args.meta, "meta")
        if not values:
            return fail("nothing to send: give NAME=VALUE pairs or --json", 2)
        meta.update(_storage_meta(args))
        with Client(router_endpoints(args), name="aa send") as client:
            event_id = client.publish(values, type=args.type, meta=meta)
            client.flush(timeout=10)
    except UsageError as exc:
        return fail(str(exc), 2)
    except AaError as exc:
        return fail(str(exc))
    print(event_id)
    return 0


def _pattern(args: argparse.Namespace) -> PatternSpec:
    chosen = [x for x in (args.expr, args.script, args.xpath) if x]
    if len(chosen) > 1:
        raise SystemExit(fail("give one of EXPR, --script or --xpath", 2))
    if args.script:
        return PatternSpec(format="script", source=args.script.read_text())
    if args.xpath:
        return PatternSpec(kernel="xpath", source=args.xpath)
    return PatternSpec(source=args.expr or "True")


def subscribe(args: argparse.Namespace) -> int:
    if args.count is not None and args.count <= 0:
        return fail("--count must be positive", 2)
    try:
        spec = _pattern(args)
        params = parse_assignments(args.param, "param")
        history = {"since": parse_since(args.since)} if args.since else {"since": None} if args.history else None
        with Client(router_endpoints(args), name="aa subscribe") as client:
            sub = client.subscribe(spec, params=params, history=history, needs=args.needs)
            seen = 0
            for event in sub:
                print_event(event, args.json)
                seen += 1
                if args.count is not None and seen >= args.count:
                    break
            if sub.failure is not None:
                return fail(f"the router stopped the pattern: {sub.failure}")
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        return fail(str(exc))
    except AaError as exc:
        return fail(str(exc))
    return 0


def _storage_meta(args: argparse.Namespace) -> dict[str, Any]:
    """The meta keys --persist, --max-age, --max-count and --no-mesh-cache ask for, checked
    here so that a bad policy is refused before anything is sent."""
    from aa.mesh import Event
    from aa.router.store import META_MESH_CACHE, persist_policy
    from aa.router import ExpiryPolicy

    meta: dict[str, Any] = {}
    if args.max_age is not None or args.max_count is not None:
        if not args.persist:
            raise UsageError("--max-age and --max-count limit how long persisted events are kept: add --persist")
    if args.persist:
        meta.update(ExpiryPolicy.parse(max_age=args.max_age, max_count=args.max_count).to_meta())
        persist_policy(Event(values={}, type=args.type, meta=meta))  # e.g. a count needs a type
    if args.no_mesh_cache:
        meta[META_MESH_CACHE] = False
    return meta
