"""`aa top`: a live terminal view of one router (or, with ``--mesh``, of every router it knows
of), refreshed every ``--interval`` seconds, over the router's HTTP endpoint.

Each frame reads ``GET /health`` (the router's counters), ``GET /clients/live`` (its clients,
the slowest first, with their rates), ``GET /patterns/live`` (the patterns whose evaluation
took the most CPU) and ``GET /mesh`` (its peer links, and the summaries the other routers
flood); rates of the router's counters, of its links and of the patterns' CPU are the
differences between two frames. ``--once`` prints one frame (two reads ``--interval`` apart, for the
rates) and exits, for scripts. Like nats-top: a header of totals and rates, then tables
(clients slowest first, links, or routers), sized to the terminal; Ctrl-C leaves.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from .common import fail
from .defaults import DEFAULT_HTTP_PORT

__all__ = ["add_parser", "run", "Frame", "render"]

#: The endpoint asked when none is given: the HTTP port of a router on this machine.
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_HTTP_PORT}/"
#: Seconds one request may take before the frame says the router does not answer.
REQUEST_TIMEOUT = 5.0
#: Patterns the patterns pane lists, and characters of a pattern's text it shows.
PATTERNS_SHOWN = 8
PATTERN_WIDTH = 60


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "top",
        help="a live view of a router: rates, clients, slow subscribers, links",
        description="Watch a router over its HTTP endpoint (aa router --http-port): events "
        "published, dispatched, delivered and dropped per second; its clients, the slowest "
        "subscribers first (bytes written to them they have not read, events dropped for "
        "them), with their rates and subscriptions; the patterns that took the most CPU; its peer "
        "links with their traffic. "
        "--mesh shows every router of the mesh instead. Ctrl-C leaves.",
        epilog="example: aa top http://127.0.0.1:7448/ --interval 2",
    )
    p.add_argument(
        "url",
        nargs="?",
        default=os.environ.get("AA_HTTP", DEFAULT_URL),
        help=f"the router's HTTP endpoint (default: $AA_HTTP or {DEFAULT_URL})",
    )
    p.add_argument(
        "--interval",
        type=_positive,
        default=1.0,
        metavar="S",
        help="seconds between frames (default: 1)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("AA_TOKEN"),
        help="a user token for a secured router ('aa certs token'; default: $AA_TOKEN)",
    )
    p.add_argument(
        "--ca",
        metavar="FILE",
        help="the CA certificate an HTTPS endpoint's certificate is checked against (the "
        "mesh CA's ca.pem; default: the system's)",
    )
    p.add_argument("--mesh", action="store_true", help="show every router of the mesh")
    p.add_argument("--once", action="store_true", help="print one frame and exit (for scripts)")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="clients shown (default: as many as the terminal has room for)",
    )
    p.set_defaults(func=run)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError("--interval must be between 0.05 and 3600 seconds")
    return value


# -- reading ---------------------------------------------------------------------------------


class Unreachable(Exception):
    """The router cannot be asked (no answer, refused credentials): one line says why."""


@dataclass
class Frame:
    """What one look at the router read, and when (monotonic seconds)."""

    at: float
    health: dict[str, Any]
    live: dict[str, Any]
    mesh: dict[str, Any]
    errors: list[str] = field(default_factory=list)
    #: ``GET /patterns/live``'s answer; empty from a router without that route.
    patterns: dict[str, Any] = field(default_factory=dict)


def read_frame(http: Any, limit: int) -> Frame:
    """One look at the router; raises `Unreachable` with the reason."""
    import httpx

    at = time.monotonic()
    out: dict[str, dict[str, Any]] = {}
    for key, path, params in (
        ("health", "/health", None),
        ("live", "/clients/live", {"limit": limit}),
        ("mesh", "/mesh", None),
        ("patterns", "/patterns/live", {"limit": PATTERNS_SHOWN}),
    ):
        try:
            r = http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise Unreachable(f"cannot reach {http.base_url}: {_why(exc)}") from None
        if r.status_code == 404 and key == "patterns":  # an older router
            out[key] = {}
            continue
        if r.status_code == 401:
            raise Unreachable(
                f"{http.base_url} asks for credentials: pass --token or set $AA_TOKEN "
                f"({_message(r)})"
            )
        if r.status_code != 200:
            raise Unreachable(
                f"{http.base_url}{path.lstrip('/')} answered {r.status_code}: {_message(r)}"
            )
        try:
            out[key] = r.json()
        except ValueError:
            raise Unreachable(f"{http.base_url} is not an Aa router (no JSON at {path})") from None
    return Frame(
        at=at,
        health=out["health"],
        live=out["live"],
        mesh=out["mesh"],
        patterns=out["patterns"],
    )


def _why(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if "refused" in text.lower():
        return "connection refused; is a router serving HTTP there? ('aa router --http-port')"
    return text


def _message(r: Any) -> str:
    try:
        return str(r.json().get("message", r.text[:200]))
    except ValueError:
        text: str = r.text[:200]
        return text


# -- rendering -------------------------------------------------------------------------------


def _rate(now: float | int | None, before: float | int | None, seconds: float) -> float | None:
    if now is None or before is None or seconds <= 0:
        return None
    return max(0.0, (now - before) / seconds)


def _num(value: float | None) -> str:
    if value is None:
        return "–"
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def render(prev: Frame | None, cur: Frame, *, url: str, mesh: bool = False) -> Any:
    """The rich renderable of *cur* (rates against *prev* when there is one)."""
    from rich.console import Group
    from rich.text import Text

    h = cur.health
    seconds = cur.at - prev.at if prev is not None else 0.0
    c = h.get("counters", {})
    pc = prev.health.get("counters", {}) if prev is not None else {}
    own = _own_router(cur.mesh, h.get("id"))
    peers = own.get("peers", []) if own else []
    title = Text.assemble(
        ("aa top", "bold"),
        f"  {h.get('name')} ({h.get('id')}) at {url}  up {_duration(h.get('uptime', 0))}",
    )
    totals = Text(
        f"clients {h.get('clients', 0)}   links {len(peers)}   subscriptions "
        f"{h.get('subscriptions', 0)}   patterns {h.get('patterns', 0)}   "
        f"buffered {_bytes(sum(x.get('buffered', 0) for x in cur.live.get('items', [])))}"
    )
    dropped = sum(v for k, v in c.items() if k.startswith("dropped"))
    was_dropped = sum(v for k, v in pc.items() if k.startswith("dropped"))
    rates = Text.assemble(
        ("events/s  ", "bold"),
        *(
            f"{label} {_num(_rate(c.get(key, 0), pc.get(key, 0) if prev else None, seconds))}   "
            for label, key in (
                ("published", "published"),
                ("dispatched", "dispatched"),
                ("delivered", "delivered"),
            )
        ),
        f"dropped {_num(_rate(dropped, was_dropped if prev else None, seconds))}",
        style="",
    )
    parts: list[Any] = [title, totals, rates]
    workers = h.get("workers")
    if workers:
        parts.append(
            Text(
                f"workers {workers.get('regular_workers', 0) + workers.get('probation_workers', 0)}"
                f"   kills {workers.get('kills', 0)}   crashes {workers.get('crashes', 0)}   "
                f"restarts {workers.get('replaced', 0)}   patterns on probation "
                f"{workers.get('patterns_on_probation', 0)}"
            )
        )
    if mesh:
        parts.append(_routers_table(prev, cur, seconds))
    else:
        parts.append(_clients_table(prev, cur, seconds))
        if cur.patterns.get("items"):
            parts.append(_patterns_table(prev, cur, seconds))
        parts.append(_links_table(prev, peers, cur, seconds))
    parts.extend(Text(e, style="red") for e in cur.errors)
    return Group(*parts)


def _own_router(mesh: dict[str, Any], rid: Any) -> dict[str, Any] | None:
    routers: list[dict[str, Any]] = mesh.get("routers", [])  # GET /mesh's
    for r in routers:
        if r.get("id") == rid:
            return r
    return None


def _clients_table(prev: Frame | None, cur: Frame, seconds: float) -> Any:
    """Rates between the two frames where the client was in both (else the router's own,
    over the time since someone last asked it)."""
    from rich.table import Table

    live = cur.live
    shown = live.get("items", [])
    before = {
        (x.get("id"), x.get("address")): x for x in (prev.live if prev else {}).get("items", [])
    }
    table = Table(
        title=f"clients, slowest first ({len(shown)} of {live.get('clients', 0)})",
        title_justify="left",
        expand=True,
        box=None,
        header_style="bold reverse",
    )
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("CLIENT", "left"),
        ("NAME", "left"),
        ("USER", "left"),
        ("ADDRESS", "left"),
        ("UP", "right"),
        ("IN/s", "right"),
        ("OUT/s", "right"),
        ("BUFFERED", "right"),
        ("DROPPED", "right"),
        ("SUBSCRIPTIONS", "left"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    for x in shown:
        was = before.get((x.get("id"), x.get("address")))
        rate_in, rate_out = x.get("in_rate"), x.get("out_rate")
        if was is not None:
            rate_in = _rate(x.get("events_in"), was.get("events_in"), seconds)
            rate_out = _rate(x.get("events_out"), was.get("events_out"), seconds)
        tiers: dict[str, int] = {}
        for s in x.get("subscriptions", []):
            tiers[str(s.get("tier"))] = tiers.get(str(s.get("tier")), 0) + 1
        subs = f"{x.get('subscription_count', 0)}"
        if tiers:
            subs += " (" + ", ".join(f"{k} {v}" for k, v in sorted(tiers.items())) + ")"
        slow = x.get("buffered", 0) > 0 or x.get("dropped", 0) > 0
        table.add_row(
            str(x.get("id")),
            str(x.get("name") or ""),
            str(x.get("user")),
            str(x.get("address")),
            _duration(x.get("connected", 0)),
            _num(rate_in),
            _num(rate_out),
            _bytes(x.get("buffered", 0)),
            _num(x.get("dropped", 0)),
            subs,
            style="yellow" if slow else None,
        )
    return table


def _patterns_table(prev: Frame | None, cur: Frame, seconds: float) -> Any:
    """The patterns that took the most CPU, by their share of a core between the two frames
    (those the first frame did not list have none yet, and come last)."""
    from rich.table import Table

    def key(x: dict[str, Any]) -> tuple[Any, ...]:
        return x.get("kernel"), x.get("format"), x.get("pattern"), x.get("tier")

    before = {key(x): x.get("cpu", 0.0) for x in (prev.patterns if prev else {}).get("items", [])}
    rows = []
    for x in cur.patterns.get("items", []):
        was = before.get(key(x))
        share = _rate(x.get("cpu"), was, seconds)
        rows.append((share if share is not None else -1.0, x))
    rows.sort(key=lambda row: -row[0])
    table = Table(
        title="patterns, the most CPU first",
        title_justify="left",
        expand=True,
        box=None,
        header_style="bold reverse",
    )
    for name in ("PATTERN", "KIND", "TIER", "SUBSCRIBERS", "CPU%", "CPU"):
        table.add_column(name, justify="left" if name in ("PATTERN", "KIND", "TIER") else "right")
    for share, x in rows:
        text = " ".join(str(x.get("pattern", "")).split())  # a script on one line
        if len(text) > PATTERN_WIDTH:
            text = text[: PATTERN_WIDTH - 1] + "…"
        table.add_row(
            text,
            f"{x.get('kernel')}/{x.get('format')}",
            str(x.get("tier")),
            str(x.get("subscribers", 0)),
            "–" if share < 0 else f"{share * 100:.1f}",
            f"{float(x.get('cpu', 0.0)):.3f}s",
        )
    return table


def _links_table(
    prev: Frame | None, peers: list[dict[str, Any]], cur: Frame, seconds: float
) -> Any:
    from rich.table import Table

    before: dict[Any, dict[str, Any]] = {}
    if prev is not None:
        own = _own_router(prev.mesh, prev.health.get("id"))
        before = {p.get("id"): p for p in (own or {}).get("peers", [])}
    table = Table(
        title=f"peer links ({len(peers)})",
        title_justify="left",
        expand=True,
        box=None,
        header_style="bold reverse",
    )
    for name in ("PEER", "ID", "ADDRESS", "DIR", "UP", "IN/s", "OUT/s", "IN", "OUT"):
        table.add_column(name, justify="left" if name in ("PEER", "ID", "ADDRESS") else "right")
    for p in peers:
        was = before.get(p.get("id"), {})
        table.add_row(
            str(p.get("name") or ""),
            str(p.get("id")),
            str(p.get("address")),
            str(p.get("direction")),
            _duration(p.get("since", 0)),
            _num(_rate(p.get("events_in"), was.get("events_in"), seconds)),
            _num(_rate(p.get("events_out"), was.get("events_out"), seconds)),
            _num(p.get("events_in")),
            _num(p.get("events_out")),
        )
    return table


def _routers_table(prev: Frame | None, cur: Frame, seconds: float) -> Any:
    from rich.table import Table

    before = {r.get("id"): r for r in (prev.mesh.get("routers", []) if prev else [])}
    routers = cur.mesh.get("routers", [])
    table = Table(
        title=f"routers of the mesh ({len(routers)}; others' counters as of their last summary)",
        title_justify="left",
        expand=True,
        box=None,
        header_style="bold reverse",
    )
    for name in (
        "ROUTER",
        "ID",
        "ENDPOINT",
        "CLIENTS",
        "LINKS",
        "PUBLISHED/s",
        "DISPATCHED/s",
        "PEER IN/s",
        "PEER OUT/s",
        "AGE",
    ):
        table.add_column(name, justify="left" if name in ("ROUTER", "ID", "ENDPOINT") else "right")
    for r in routers:
        c = r.get("counters", {})
        was = before.get(r.get("id"), {}).get("counters", {}) if prev else {}
        table.add_row(
            str(r.get("name")),
            str(r.get("id")),
            str(r.get("client") or r.get("peer")),
            str(r.get("clients", 0)),
            str(len(r.get("peers", []))),
            *(
                _num(_rate(c.get(k), was.get(k) if was else None, seconds))
                for k in ("published", "dispatched", "events_in", "events_out")
            ),
            f"{r.get('age', 0):.0f}s",
        )
    return table


# -- the command -------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    import httpx
    from rich.console import Console

    url = args.url if "://" in args.url else f"http://{args.url}"
    url = url.rstrip("/") + "/"
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    tty = sys.stdout.isatty() and not args.once
    size = shutil.get_terminal_size((140, 40))
    console = Console(width=None if tty else max(size.columns, 140), highlight=False)
    limit = args.limit if args.limit is not None else max(5, size.lines - 16 - PATTERNS_SHOWN)
    if not 1 <= limit <= 1000:
        return fail("--limit must be between 1 and 1000", 2)
    timeout = min(REQUEST_TIMEOUT, max(args.interval, 1.0))
    verify: Any = True
    if args.ca:
        import ssl

        try:
            verify = ssl.create_default_context(cafile=args.ca)
        except (OSError, ssl.SSLError) as exc:
            return fail(f"cannot read the CA certificate {args.ca}: {exc}", 2)
    with httpx.Client(base_url=url, headers=headers, timeout=timeout, verify=verify) as http:
        try:
            first = read_frame(http, limit)
        except Unreachable as exc:
            return fail(str(exc))
        if args.once:
            time.sleep(args.interval)  # a second look, for the rates
            try:
                second = read_frame(http, limit)
            except Unreachable as exc:
                return fail(str(exc))
            console.print(render(first, second, url=url, mesh=args.mesh))
            return 0
        return _live(http, console, first, url=url, limit=limit, args=args)


def _live(
    http: Any, console: Any, first: Frame, *, url: str, limit: int, args: argparse.Namespace
) -> int:
    from rich.live import Live

    prev: Frame | None = None
    cur = first
    try:
        with Live(
            render(prev, cur, url=url, mesh=args.mesh),
            console=console,
            screen=console.is_terminal,
            auto_refresh=False,
        ) as live:
            while True:
                time.sleep(args.interval)
                try:
                    nxt = read_frame(http, limit)
                except Unreachable as exc:  # keep the last frame, say why, try again
                    cur.errors = [f"{time.strftime('%H:%M:%S')} {exc}"]
                    live.update(render(prev, cur, url=url, mesh=args.mesh), refresh=True)
                    continue
                prev, cur = cur, nxt
                live.update(render(prev, cur, url=url, mesh=args.mesh), refresh=True)
    except KeyboardInterrupt:
        return 0
