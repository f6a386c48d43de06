"""`aa mesh`: the routers of the mesh, their peers, poison lists and counters; `aa mesh
forget ROUTER`: make a router forget one that is gone."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any, TextIO

from .common import add_router_option, explain, fail, router_endpoints

__all__ = ["add_parser", "show", "forget", "format_mesh"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "mesh",
        help="show the routers of the mesh",
        description="Ask a router about the mesh and print every router it knows of: its peers, "
        "its poison list (routers it failed to reach, with the back-off before the next try) and "
        "its counters — events in and out over peer links, copies dropped as duplicates, events "
        "dispatched. The router answers for the others with the summaries they flood (every "
        "few seconds; AGE says how old each one is, and 'gone' marks a router whose summaries "
        "stopped: it was stopped, or is cut off).",
        epilog="examples: aa mesh --router 127.0.0.1:7447 --json; aa mesh forget laptop-7",
    )
    _options(p)
    p.set_defaults(func=show)
    actions = p.add_subparsers(dest="mesh_action", metavar="ACTION")
    f = actions.add_parser(
        "forget",
        help="make the router forget a router that is gone",
        description="Make the router drop ROUTER from its peer table, its topology file and "
        "its picture of the mesh, so it stops dialling it (a router stopped for good keeps "
        "being dialled until it has been of no use for --forget-after, a week by default). "
        "ROUTER is an id, a name or a host:port, as 'aa mesh' shows them. A router linked "
        "with this one now is not forgotten. Allowed for clients on the router's machine when "
        "it has no permissions file, else for users whose rules say admin = true.",
        epilog="example: aa mesh forget 127.0.0.1:7460 --router 127.0.0.1:7447",
    )
    f.add_argument("target", metavar="ROUTER", help="id, name or host:port of the router")
    _options(f, again=True)
    f.set_defaults(func=forget)


def _options(p: argparse.ArgumentParser, *, again: bool = False) -> None:
    """--router, --json, --timeout; *again*: on ACTION's parser, where a flag not given must
    not overwrite the one given before ACTION (argparse copies a subparser's defaults)."""
    if not again:
        add_router_option(p)
    else:
        p.add_argument(
            "--router",
            metavar="H:P",
            action="append",
            default=argparse.SUPPRESS,
            help="router endpoint, repeatable for fail-over (default: $AA_ROUTER or the default)",
        )
    p.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if again else False,
        help="print the answer as one JSON object",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS if again else 10.0,
        metavar="S",
        help="seconds to wait for a router (default: 10)",
    )


def show(args: argparse.Namespace) -> int:
    import asyncio

    from aa.mesh import AaError

    try:
        info = asyncio.run(_ask(router_endpoints(args), args.timeout))
    except AaError as exc:
        return fail(explain(exc))
    except OSError as exc:
        return fail(f"cannot reach a router: {exc}")
    if args.json:
        json.dump(info, sys.stdout, default=_json_default, indent=1)
        sys.stdout.write("\n")
    else:
        format_mesh(info, sys.stdout)
    sys.stdout.flush()
    return 0


def forget(args: argparse.Namespace) -> int:
    import asyncio

    from aa.mesh import AaError, RemoteError

    try:
        result = asyncio.run(_ask(router_endpoints(args), args.timeout, forget=args.target))
    except RemoteError as exc:
        return fail(f"not forgotten: {exc.message}")
    except AaError as exc:
        return fail(explain(exc))
    except OSError as exc:
        return fail(f"cannot reach a router: {exc}")
    forgotten = result.get("forgotten") or []
    if args.json:
        json.dump(result, sys.stdout, default=_json_default, indent=1)
        sys.stdout.write("\n")
    elif forgotten:
        for r in forgotten:
            named = " ".join(str(v) for v in (r.get("name"), r.get("id")) if v)
            where = r.get("address") or "no address known"
            sys.stdout.write(f"forgot {named or where} ({where})\n")
    sys.stdout.flush()
    if not forgotten:
        return fail(
            f"the router knows of no router {args.target!r} (see 'aa mesh' for ids, names "
            "and addresses)"
        )
    return 0


async def _ask(endpoints: list[str], timeout: float, forget: str | None = None) -> dict[str, Any]:
    from aa.client import AsyncClient, ClientConfig

    config = ClientConfig(
        routers=tuple(endpoints),
        name="aa mesh",
        connect_timeout=timeout,
        request_timeout=timeout,
        wait_for_routers=False,
    )
    client = AsyncClient(config=config)
    try:
        await client.connect(timeout)
        if forget is not None:
            return await client.forget_router(forget, timeout)
        return await client.mesh_info(timeout)
    finally:
        await client.aclose(timeout=0)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot print {type(value).__name__}")


def format_mesh(info: dict[str, Any], out: TextIO) -> None:
    """The human-readable table `aa mesh` prints."""
    routers = info.get("routers") or []
    names = {r.get("id"): r.get("name") or r.get("id") for r in routers}
    out.write(
        f"{len(routers)} router(s), as seen by "
        f"{names.get(info.get('router'), info.get('router'))}\n"
    )
    header = (
        "ROUTER",
        "ID",
        "ENDPOINT",
        "PEERS",
        "CLIENTS",
        "FROM PEERS",
        "TO PEERS",
        "DUPLICATES",
        "DISPATCHED",
        "AGE",
    )
    rows = []
    for r in routers:
        c = r.get("counters") or {}
        rows.append(
            (
                str(r.get("name")),
                str(r.get("id")),
                str(r.get("peer")),
                str(len(r.get("peers") or [])),
                str(r.get("clients", 0)),
                str(c.get("events_in", 0)),
                str(c.get("events_out", 0)),
                str(c.get("duplicates", 0)),
                str(c.get("dispatched", 0)),
                ("gone " if r.get("gone") is True else "") + f"{float(r.get('age', 0.0)):.1f}s",
            )
        )
    widths = [
        max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
        for i, h in enumerate(header)
    ]
    out.write("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip() + "\n")
    for r, row in zip(routers, rows):
        out.write("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n")
        if r.get("open") is True:
            out.write("    open: listens off loopback without TLS (anyone who reaches it is in)\n")
        peers = r.get("peers") or []
        if r.get("gone") is True:
            out.write(
                "    gone: its summaries stopped (it was stopped, or is cut off); if for good: "
                f"aa mesh forget {r.get('name') or r.get('id')}\n"
            )
        elif peers:
            listed = ", ".join(
                f"{p.get('name') or names.get(p.get('id')) or p.get('id')} ({p.get('direction')} "
                f"{p.get('address')})"
                for p in peers
            )
            out.write(f"    peers: {listed}\n")
        poisoned = r.get("poisoned") or []
        if poisoned:
            listed = ", ".join(
                f"{p.get('address')} ({p.get('failures')} failures, next try in "
                f"{float(p.get('retry_in', 0)):.1f} s)"
                for p in poisoned
            )
            out.write(f"    poisoned: {listed}\n")
    for line in mismatches(routers):
        out.write(line + "\n")


def mismatches(routers: list[dict[str, Any]]) -> list[str]:
    """One line for each rule routers enforce differently (their permissions' rules and
    their revocation lists), naming the routers on each side, largest group first:
    ``permissions differ: r1, r2 vs r3``. Routers that do not say (older ones) are left out."""
    lines = []
    for key, what in (("permissions", "permissions"), ("crl", "revocation lists")):
        groups: dict[Any, list[str]] = {}
        for r in routers:
            if key in r:
                groups.setdefault(r[key], []).append(str(r.get("name") or r.get("id")))
        if len(groups) > 1:
            sides = sorted(groups.items(), key=lambda g: (-len(g[1]), sorted(g[1])))
            shown = " vs ".join(_side(key, value, names) for value, names in sides)
            lines.append(f"{what} differ: {shown}")
    return lines


def _side(key: str, value: Any, names: list[str]) -> str:
    listed = ", ".join(sorted(names))
    if value is None:
        return f"{listed} (no {'permissions file' if key == 'permissions' else 'CRL'})"
    return f"{listed} (CRL {value})" if key == "crl" else listed
