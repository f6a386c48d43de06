"""`aa cache`: this machine's client cache in the mesh, and the routers' mesh cache."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from aa.client import Client
from aa.mesh import AaError, PatternSpec, RemoteError, UsageError

from .common import (
    add_client_id_option,
    add_router_option,
    client_id,
    explain,
    fail,
    open_client,
    parse_since,
    print_event,
)

__all__ = ["add_parser"]

EPILOG = """\
examples:
  aa cache register --max-age 3h --max-count 100 'Alarm == True'
  aa cache get                 # print what was kept, then acknowledge it
  aa cache policy --max-count 10
  aa cache clear
  aa cache mesh --since 10m 'Temperature > 30'

The cache belongs to a client id: every 'aa cache' command of this user on this machine
uses the same one (see --client-id), so 'aa cache get' finds what 'aa cache register'
asked for, through any router of the mesh.
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "cache",
        help="keep events in the mesh for this client while it is away",
        description="Manage this client's event cache: every router of the mesh keeps the events "
        "its pattern matches, under its expiry policy, until 'aa cache get' takes them. The cache "
        "is removed everywhere when no command used it for its --timeout.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmds = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)

    def action(name: str, help: str, description: str) -> argparse.ArgumentParser:
        a = cmds.add_parser(name, help=help, description=description)
        add_router_option(a)
        add_client_id_option(a)
        return a

    a = action(
        "register",
        "start (or change) this client's cache",
        "Ask every router to keep the events PATTERN matches for this client. Registering "
        "again with the same pattern changes the policy and keeps the events; another "
        "pattern starts an empty cache.",
    )
    a.add_argument(
        "pattern", metavar="PATTERN", help="a boolean Python expression over event values"
    )
    a.add_argument("--xpath", action="store_true", help="PATTERN is an XPath expression")
    _policy_options(a)
    a.add_argument(
        "--timeout",
        metavar="DURATION",
        default="1d",
        help="remove the cache when no 'aa cache' command used it for this long (default: 1d)",
    )
    a.set_defaults(func=_run, go=_register)

    a = action(
        "get",
        "print the cached events, then acknowledge them",
        "Print the events the cache kept, oldest first, one per line; then acknowledge them, "
        "so that every router drops them (unless --peek).",
    )
    a.add_argument("--limit", type=int, metavar="N", help="at most N events")
    a.add_argument(
        "--peek", action="store_true", help="do not acknowledge: the next 'get' prints them again"
    )
    a.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per line: {"id", "type", "values", "meta"}',
    )
    a.set_defaults(func=_run, go=_get)

    a = action(
        "policy",
        "change the cache's expiry policy",
        "Change how long and how many events the cache keeps. A limit not given stays as it "
        "is; 'none' removes it.",
    )
    _policy_options(a, removable=True)
    a.set_defaults(func=_run, go=_policy)

    a = action(
        "clear",
        "empty the cache (it stays registered)",
        "Drop every event the cache holds, everywhere.",
    )
    a.set_defaults(func=_run, go=lambda c, args: _show(c.cache_clear()))

    a = action("info", "show the cache's pattern, policy and size", "Show what the cache is.")
    a.set_defaults(func=_run, go=lambda c, args: _show(c.cache_info()))

    a = action(
        "remove",
        "remove the cache everywhere",
        "Remove the cache and its events from every router.",
    )
    a.set_defaults(
        func=_run, go=lambda c, args: print("removed" if c.cache_remove() else "there was no cache")
    )

    a = action(
        "mesh",
        "print what the routers' mesh cache holds",
        "Print the events the router's in-memory mesh cache holds that PATTERN matches, "
        "oldest first. It keeps the newest events of the mesh, unless their publishers opted "
        "out; nothing needs registering.",
    )
    a.add_argument(
        "pattern",
        metavar="PATTERN",
        nargs="?",
        default="True",
        help="a boolean Python expression over event values (default: every event)",
    )
    a.add_argument(
        "--since", metavar="T", help="from time T: ISO 8601, or a duration ago such as 10m"
    )
    a.add_argument("--limit", type=int, metavar="N", help="at most N events")
    a.add_argument("--json", action="store_true", help="one JSON object per line")
    a.set_defaults(func=_run, go=_mesh)


def _policy_options(a: argparse.ArgumentParser, removable: bool = False) -> None:
    none = " ('none': no limit)" if removable else ""
    a.add_argument(
        "--max-age", metavar="DURATION", help=f"drop events older than this: 90s, 3h, 2d{none}"
    )
    a.add_argument("--max-count", metavar="N", help=f"keep only the newest N events{none}")


def _run(args: argparse.Namespace) -> int:
    go: Callable[[Client, argparse.Namespace], Any] = args.go
    try:
        cid = client_id(args)
        with open_client(args, "aa cache", cid) as client:
            go(client, args)
    except RemoteError as exc:
        if exc.code == "unknown-cache":
            return fail(
                f"no cache is registered for client {cid!r}: run 'aa cache register PATTERN' first"
            )
        return fail(
            f"the router refused: {exc}", 2 if exc.code in ("invalid-policy", "bad-request") else 1
        )
    except UsageError as exc:
        return fail(str(exc), 2)
    except AaError as exc:
        return fail(explain(exc))
    except KeyboardInterrupt:
        return 130
    return 0


def _show(info: dict[str, Any]) -> None:
    print(json.dumps(info, ensure_ascii=False))


def _timeout(text: str) -> float:
    from aa.router import parse_duration

    try:
        return float(text)
    except ValueError:
        return parse_duration(text).total_seconds()


def _register(client: Client, args: argparse.Namespace) -> None:
    spec = (
        PatternSpec(kernel="xpath", source=args.pattern)
        if args.xpath
        else PatternSpec(source=args.pattern)
    )
    _show(
        client.cache_register(
            spec, max_age=args.max_age, max_count=args.max_count, timeout=_timeout(args.timeout)
        )
    )


def _policy(client: Client, args: argparse.Namespace) -> None:
    """Change the limits given, keep the others (the router's request replaces the whole
    policy, so the current one is asked for first)."""
    if args.max_age is None and args.max_count is None:
        raise UsageError(
            "give --max-age, --max-count or both (see aa cache info for the current policy)"
        )
    current = client.cache_info()

    def chosen(given: str | None, key: str) -> Any:
        if given is None:
            return current.get(key)
        return None if given.strip().lower() == "none" else given

    _show(
        client.cache_policy(
            max_age=chosen(args.max_age, "max_age"), max_count=chosen(args.max_count, "max_count")
        )
    )


def _get(client: Client, args: argparse.Namespace) -> None:
    if args.limit is not None and args.limit <= 0:
        raise UsageError("--limit must be positive")
    events = client.cache_fetch(args.limit)
    for event in events:
        print_event(event, args.json)
    if events and not args.peek:
        client.cache_ack()


def _mesh(client: Client, args: argparse.Namespace) -> None:
    if args.limit is not None and args.limit <= 0:
        raise UsageError("--limit must be positive")
    since = parse_since(args.since) if args.since else None
    for event in client.cached(args.pattern, since=since, limit=args.limit):
        print_event(event, args.json)
