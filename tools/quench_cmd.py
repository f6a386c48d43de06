"""`aa quench NAME=VALUE ...`: register an event prototype and show interest in it appearing
and going, as subscriptions anywhere in the mesh start and stop matching it (Å §4.4).

Output, one line per change (``--json``: ``{"sub", "router", "interested", "any"}``)::

    + alice#3 on router 9f2c…        a subscription matches now
    - alice#3 on router 9f2c…        it stopped matching (unsubscribed, expired, its router gone)

``--wait`` exits 0 as soon as anyone is interested, for scripts::

    aa quench --wait --type quote StockSymbol=ABB Price=1.0 && start-the-expensive-feed
"""

from __future__ import annotations

import argparse
import json
import queue
import sys

from aa.mesh import AaError, AaTimeout, UsageError

from .common import (
    add_router_option,
    explain,
    fail,
    open_client,
    parse_assignments,
    parse_json_object,
)

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "quench",
        help="show interest in an event prototype appearing and going",
        description="Register an event prototype (an example of the events you would publish) and "
        "print a line each time a subscription somewhere in the mesh starts (+) or stops (-) "
        "matching it.",
        epilog="example: aa quench --type snow SnowDepthSensor=true SnowDepth=50",
    )
    add_router_option(p)
    p.add_argument("values", nargs="*", metavar="NAME=VALUE", help="the prototype's values")
    p.add_argument("--type", help="the prototype's event type")
    p.add_argument(
        "--values-json",
        metavar="OBJECT",
        dest="json_values",
        help='values as a JSON object, e.g. \'{"Where": {"floor": 2}}\'',
    )
    p.add_argument(
        "--mentioned-only",
        action="store_true",
        help="ignore catch-all patterns that name none of the prototype's values",
    )
    p.add_argument("--wait", action="store_true", help="exit 0 as soon as anyone is interested")
    p.add_argument(
        "--timeout", type=float, metavar="S", help="with --wait: give up (exit 1) after S seconds"
    )
    p.add_argument("--count", type=int, metavar="N", help="exit after N changes")
    p.add_argument(
        "--json",
        dest="as_json",
        action="store_true",
        help='one JSON object per line: {"sub", "router", "interested", "any"}',
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        values = parse_json_object(args.json_values) if args.json_values else {}
        values.update(parse_assignments(args.values))
    except UsageError as exc:
        return fail(str(exc), 2)
    if not values:
        return fail("give the prototype's values as NAME=VALUE pairs or --values-json", 2)
    if args.count is not None and args.count <= 0:
        return fail("--count must be positive", 2)
    changes: queue.Queue[tuple[str, str, bool]] = queue.Queue()
    try:
        with open_client(args, "aa quench") as client:
            q = client.quench(
                values,
                lambda s, r, i: changes.put((s, r, i)),
                type=args.type,
                mentioned_only=args.mentioned_only,
            )
            if args.wait:
                try:
                    q.wait_interested(args.timeout)
                except AaTimeout:
                    return fail(f"nobody became interested within {args.timeout:g} s")
                return 0
            seen = 0
            interested: set[tuple[str, str]] = set()
            while args.count is None or seen < args.count:
                sub_id, router_id, now = changes.get()
                (interested.add if now else interested.discard)((router_id, sub_id))
                _print(sub_id, router_id, now, bool(interested), args.as_json)
                seen += 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise  # quiet: see aa.tools.cli
    except (OSError, AaError) as exc:
        return fail(explain(exc))
    return 0


def _print(sub_id: str, router_id: str, interested: bool, anyone: bool, as_json: bool) -> None:
    if as_json:
        line = json.dumps(
            {"sub": sub_id, "router": router_id, "interested": interested, "any": anyone}
        )
    else:
        line = f"{'+' if interested else '-'} {sub_id} on router {router_id}"
        if not anyone:
            line += "   (nobody is interested now)"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
