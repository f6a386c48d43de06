"""`aa send` and `aa subscribe`."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import (
    add_router_option,
    explain,
    fail,
    open_client,
    parse_assignments,
    parse_json_object,
    parse_since,
    print_event,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from aa.mesh import PatternSpec, RemoteError

__all__ = ["add_parsers"]

#: Seconds `aa send` waits for a router's acknowledgement.
SEND_TIMEOUT = 10.0
#: Seconds `aa send` gives its client to close (say goodbye) once the event was acknowledged.
CLOSE_TIMEOUT = 2.0
#: Seconds between two looks, while waiting, at errors the router sent about the event.
ERROR_POLL = 0.1


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "send",
        help="publish one event",
        description="Publish one event. Values: 3 is an int, 2.5 a float, true/false a bool, "
        "anything else a string; --json gives nested or typed values.",
        epilog="example: aa send --type reading Temperature=101 Sensor=lab-1",
    )
    add_router_option(p)
    p.add_argument("--type", help="the event's type")
    p.add_argument(
        "--json",
        metavar="OBJECT",
        help='values as a JSON object, e.g. \'{"Reading": {"t": [1, 2]}}\'',
    )
    p.add_argument(
        "--meta", metavar="NAME=VALUE", action="append", default=[], help="a meta value, repeatable"
    )
    p.add_argument("values", nargs="*", metavar="NAME=VALUE", help="event values")
    keep = p.add_argument_group(
        "persistence",
        "Ask every router to keep the event in its persistent store, replayed to subscribers "
        "that ask for history (aa subscribe --history). The command returns once the router "
        "has written it. Example: --persist --max-age 3h --max-count 5 --type snow keeps "
        "events of type snow for three hours, at most the newest five.",
    )
    keep.add_argument(
        "--persist", action="store_true", help="keep the event in the routers' stores"
    )
    keep.add_argument(
        "--max-age", metavar="DURATION", help="remove it after this long: 90s, 3h, 2d, 1h30m"
    )
    keep.add_argument(
        "--max-count", metavar="N", help="keep at most the newest N stored events of its --type"
    )
    keep.add_argument(
        "--no-mesh-cache",
        action="store_true",
        help="keep the event out of the routers' in-memory mesh cache",
    )
    p.set_defaults(func=send)

    p = sub.add_parser(
        "subscribe",
        help="print matching events",
        description="Subscribe with a Python pattern and print each matching event, one per line.",
        epilog='example: aa subscribe --count 1 --json "Temperature > 100"',
    )
    add_router_option(p)
    p.add_argument(
        "expr",
        nargs="?",
        help="a boolean Python expression over event values (default: every event)",
    )
    p.add_argument(
        "--script", type=Path, metavar="FILE", help="a stateful pattern script (calls forward())"
    )
    p.add_argument("--xpath", metavar="EXPR", help="an XPath pattern instead of a Python one")
    p.add_argument(
        "--param",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="a pattern parameter, repeatable",
    )
    p.add_argument(
        "--needs",
        metavar="NAME",
        action="append",
        default=[],
        help="a value name the pattern needs, repeatable: lets quenching publishers "
        "whose prototype carries the names see this narrow pattern (see aa quench)",
    )
    p.add_argument("--count", type=int, metavar="N", help="exit after N events")
    p.add_argument(
        "--tier",
        dest="verbose_tier",
        action="store_true",
        help="say which tier the router runs the pattern in (predicate: no code run; worker: a "
        "sandbox process)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per line: {"id", "type", "values", "meta"}',
    )
    p.add_argument(
        "--history",
        action="store_true",
        help="first print the stored events the pattern matches, oldest first, marked "
        "(historical); then the live ones",
    )
    p.add_argument(
        "--since",
        metavar="T",
        help="history from time T only (implies --history): ISO 8601 such as "
        "2024-01-02T03:04:05Z, or a duration ago such as 2h",
    )
    p.set_defaults(func=subscribe)


def send(args: argparse.Namespace) -> int:
    from aa.mesh import AaError, AaTimeout, UsageError

    refused = _RouterErrors()
    logging.getLogger("aa.client").addHandler(
        logging.NullHandler()
    )  # aa send says what matters, in one line
    try:
        values: dict[str, Any] = parse_json_object(args.json) if args.json else {}
        values.update(parse_assignments(args.values))
        meta = parse_assignments(args.meta, "meta")
        if not values:
            return fail("nothing to send: give NAME=VALUE pairs or --json", 2)
        meta.update(_storage_meta(args))
        client = open_client(args, "aa send", exit_timeout=0, on_error=refused)
        try:
            event_id = client.publish(values, type=args.type, meta=meta)
            deadline = time.monotonic() + SEND_TIMEOUT
            while not refused.errors:  # an error ends the wait: its ack may be far behind
                try:
                    client.flush(timeout=min(ERROR_POLL, max(0.0, deadline - time.monotonic())))
                    break
                except AaTimeout:
                    if time.monotonic() >= deadline:
                        raise
        finally:
            client.close(timeout=0 if refused.errors else CLOSE_TIMEOUT)
    except UsageError as exc:
        return fail(str(exc), 2)
    except AaError as exc:
        if not refused.errors:
            return fail(explain(exc))
    if refused.errors:  # an ack came, but the router said what it did not do
        code, message = refused.errors[0]
        what = "keep" if code in ("not-persisted", "no-store") else "take"
        return fail(
            f"the router did not {what} event {event_id}: {message}",
            2 if code == "invalid-policy" else 1,
        )
    print(event_id)
    return 0


class _RouterErrors:
    """Collects the errors a router sends about a publish (a persisted event it could not
    keep, a policy it refused): no request waits for them, so the client hands them to its
    `on_error`; `aa send` must not return 0 after one. Called in the client's thread."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    def __call__(self, exc: RemoteError) -> None:
        self.errors.append((exc.code, str(exc)))


def _pattern(args: argparse.Namespace) -> PatternSpec:
    from aa.mesh import PatternSpec, UsageError

    chosen = [x for x in (args.expr, args.script, args.xpath) if x]
    if len(chosen) > 1:
        raise SystemExit(fail("give one of EXPR, --script or --xpath", 2))
    if args.script:
        try:
            source = args.script.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"cannot read the script {args.script}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        return PatternSpec(format="script", source=source)
    if args.xpath:
        return PatternSpec(kernel="xpath", source=args.xpath)
    return PatternSpec(source=args.expr or "True")


def subscribe(args: argparse.Namespace) -> int:
    if args.count is not None and args.count <= 0:
        return fail("--count must be positive", 2)
    from aa.mesh import AaError, UsageError

    try:
        spec = _pattern(args)
        params = parse_assignments(args.param, "param")
        history = (
            {"since": parse_since(args.since)}
            if args.since
            else {"since": None}
            if args.history
            else None
        )
        subs: list[Any] = []  # a stopped subscription ends the command: no "reconnecting" then
        with open_client(
            args,
            "aa subscribe",
            on_disconnect=_say("disconnected from {}; reconnecting", subs),
            on_reconnect=_say("reconnected to {}", subs),
        ) as client:
            sub = client.subscribe(
                spec,
                params=params,
                history=history,
                needs=args.needs,
                on_error=_raised,
                on_missed_away=_missed_away,
            )
            subs.append(sub)
            for warning in sub.warnings:  # a name no event has had, a bare name meant as text
                print(f"aa subscribe: warning: {warning}", file=sys.stderr, flush=True)
            if args.verbose_tier:
                print(
                    f"aa subscribe: the pattern runs in the {sub.tier} tier",
                    file=sys.stderr,
                    flush=True,
                )
            for seen, event in enumerate(sub, 1):
                print_event(event, args.json)
                if args.count is not None and seen >= args.count:
                    break
            if sub.failure is not None:
                return fail(f"the router stopped the pattern: {sub.failure}")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise  # quiet: see aa.tools.cli
    except UsageError as exc:
        return fail(str(exc), 2)
    except OSError as exc:
        return fail(explain(exc))
    except AaError as exc:
        return fail(explain(exc))
    return 0


def _say(text: str, subs: list[Any]) -> Callable[[str], None]:
    """A connection callback that prints *text* (with the router's endpoint) on stderr, unless
    the router stopped the subscription (*subs*): its reason is the line then."""

    def say(endpoint: str) -> None:
        if any(sub.failure is not None for sub in subs):
            return
        print(f"aa subscribe: {text.format(endpoint)}", file=sys.stderr, flush=True)

    return say


def _raised(notice: Any) -> None:
    """The router says the pattern raised (at most once a second): one line on stderr."""
    print(f"aa subscribe: the pattern raised: {notice}", file=sys.stderr, flush=True)


def _missed_away(notice: Any) -> None:
    """Back after a lost router, which counted the stored events matched meanwhile: one line
    on stderr when there were any (live events are gone; stored ones are history)."""
    if notice.count:
        at_least = "at least " if notice.more else ""
        told = f"missed {at_least}{notice.count} events while away"
    elif notice.more:  # it stopped counting before it found one
        told = "missed an unknown number of events while away (too many stored to count)"
    else:
        return
    print(f"aa subscribe: {told} (stored: use --history to get them)", file=sys.stderr, flush=True)


def _storage_meta(args: argparse.Namespace) -> dict[str, Any]:
    """The meta keys --persist, --max-age, --max-count and --no-mesh-cache ask for, checked
    here so that a bad policy is refused before anything is sent."""
    if not (
        args.persist or args.no_mesh_cache or args.max_age is not None or args.max_count is not None
    ):
        return {}  # the common case: aa.router (slow to import) is not needed
    from aa.mesh import Event, UsageError
    from aa.router import ExpiryPolicy
    from aa.router.store import META_MESH_CACHE, persist_policy

    meta: dict[str, Any] = {}
    if args.max_age is not None or args.max_count is not None:
        if not args.persist:
            raise UsageError(
                "--max-age and --max-count limit how long persisted events are kept: add --persist"
            )
    if args.persist:
        meta.update(ExpiryPolicy.parse(max_age=args.max_age, max_count=args.max_count).to_meta())
        persist_policy(Event(values={}, type=args.type, meta=meta))  # e.g. a count needs a type
    if args.no_mesh_cache:
        meta[META_MESH_CACHE] = False
    return meta
