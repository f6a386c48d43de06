"""What the `aa` commands share: value parsing, the router option, output."""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # aa.mesh is imported when needed: `aa --help` stays quick
    from aa.client import Client
    from aa.mesh import Event

__all__ = [
    "parse_scalar",
    "parse_assignments",
    "add_router_option",
    "router_endpoints",
    "open_client",
    "print_event",
    "fail",
    "report",
    "explain",
    "set_program",
    "parse_since",
    "add_client_id_option",
    "client_id",
]

DEFAULT_ROUTER = "127.0.0.1:7447"


def parse_scalar(text: str) -> Any:
    """`3` → int, `2.5` → float, `true`/`false` → bool, anything else → the string. A number
    is one only as JSON writes it: `007` (a room, an id), `1_000`, `0x10`, `2.`, `nan` stay
    strings, so nothing a user typed loses characters.

    >>> [parse_scalar(t) for t in ("3", "-2.5", "true", "FALSE", "lab-1", "1e3", "007")]
    [3, -2.5, True, False, 'lab-1', 1000.0, '007']
    """
    low = text.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    m = _NUMBER.fullmatch(text)
    if m is None:
        return text
    if m["fraction"] is None and m["exponent"] is None:
        try:
            return int(text)
        except ValueError:  # past Python's 4,300 digits
            return text
    value = float(text)
    return text if value in (float("inf"), float("-inf")) else value  # 1e999: meant as text


#: A number as JSON writes it.
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?P<fraction>\.[0-9]+)?(?P<exponent>[eE][-+]?[0-9]+)?")


def parse_assignments(items: list[str], what: str = "value") -> dict[str, Any]:
    """`["A=1", "B=x"]` → `{"A": 1, "B": "x"}`; raises `UsageError` for an item without `=`."""
    from aa.mesh import UsageError

    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise UsageError(
                f"{what} {item!r} is not NAME=VALUE: write it as Temperature=21 (no spaces around "
                "=)"
            )
        out[name] = parse_scalar(text)
    return out


def parse_json_object(text: str, what: str = "--json") -> dict[str, Any]:
    from aa.mesh import InvalidValue, UsageError, from_json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from None
    if type(data) is not dict:
        raise UsageError(f"{what} must be a JSON object")
    try:
        values: dict[str, Any] = from_json(data)  # a JSON object in, a map out
        return values
    except InvalidValue as exc:
        raise UsageError(f"{what}: {exc}") from None


#: The event loops `aa router` can run on (`--event-loop`): uvloop (libuv) when it is installed,
#: asyncio's own otherwise. uvloop routes a little faster for a little less CPU (figures:
#: docs/decisions.md); an embedded router runs on its host's loop.
EVENT_LOOPS = ("uvloop", "asyncio")


def add_event_loop_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=None,
        help="the event loop to run on (default: uvloop where it is installed, else asyncio; "
        "AA_EVENT_LOOP sets the default)",
    )


def loop_runner(choice: str | None = None) -> Callable[[Any], Any]:
    """What runs `aa router`'s main coroutine to its end (`asyncio.run` or `uvloop.run`) on the
    event loop *choice* (`EVENT_LOOPS`; None: the `AA_EVENT_LOOP` environment variable, else
    uvloop if importable). Raises UsageError for a loop that is not there."""
    import asyncio

    from aa.mesh import UsageError

    choice = choice or os.environ.get("AA_EVENT_LOOP") or None
    if choice not in (None, *EVENT_LOOPS):
        raise UsageError(f"AA_EVENT_LOOP must be one of {', '.join(EVENT_LOOPS)}, not {choice!r}")
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise UsageError(
                    "--event-loop uvloop: uvloop is not installed (pip install uvloop)"
                ) from None
        else:
            return uvloop.run
    return asyncio.run


def add_router_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--router",
        metavar="H:P",
        action="append",
        help=f"router endpoint, repeatable for fail-over (default: $AA_ROUTER or {DEFAULT_ROUTER})",
    )


def router_endpoints(args: argparse.Namespace) -> list[str]:
    """--router values, else $AA_ROUTER (comma-separated), else the default; a bare host
    gets the default port."""
    if args.router:
        found = list(args.router)
    elif os.environ.get("AA_ROUTER"):
        found = [e.strip() for e in os.environ["AA_ROUTER"].split(",") if e.strip()]
    else:
        found = [DEFAULT_ROUTER]
    return [
        e if e.rpartition(":")[2].isdigit() and not e.endswith("]") else f"{e}:7447" for e in found
    ]


def open_client(
    args: argparse.Namespace, name: str, client_id: str | None = None, **kwargs: Any
) -> Client:
    """A connected `Client` of the routers the command line names (`router_endpoints`)
    that gives up at once when nothing listens at any of them, instead of waiting for one
    to start (`ClientConfig.wait_for_routers`); *kwargs* go to `Client`."""
    from aa.client import Client, ClientConfig

    config = ClientConfig(
        routers=tuple(router_endpoints(args)),
        name=name,
        client_id=client_id,
        wait_for_routers=False,
    )
    return Client(config=config, **kwargs)


def _human(value: Any) -> str:
    if isinstance(value, str):
        return value if value and " " not in value and "=" not in value else json.dumps(value)
    return (
        json.dumps(value)
        if isinstance(value, (bool, type(None)))
        else repr(value)
        if isinstance(value, (bytes,))
        else str(value)
    )


def print_event(event: Event, as_json: bool, out: Any = None) -> None:
    """One line per event: JSON (`--json`) or `[type] Name=Value …` for people."""
    from aa.mesh import event_to_json

    out = out or sys.stdout
    if as_json:
        out.write(json.dumps(event_to_json(event), ensure_ascii=False) + "\n")
    else:
        head = f"[{event.type}] " if event.type else ""
        hist = "(historical) " if event.meta.get("historical") else ""
        out.write(
            head + hist + " ".join(f"{k}={_human(v)}" for k, v in event.values.items()) + "\n"
        )
    out.flush()


#: How messages on stderr start: ``aa send: …`` once `main` knows the subcommand.
_program = "aa"


def set_program(name: str) -> None:
    global _program
    _program = name


def fail(message: str, code: int = 1) -> int:
    """Say *message* on stderr as one line (``aa COMMAND: message``); return *code*."""
    print(f"{_program}: {message}", file=sys.stderr, flush=True)
    return code


def explain(exc: BaseException) -> str:
    """An error's message, with what to do where the message does not say it."""
    from aa.client import NOTHING_LISTENS

    text = str(exc)
    if text.startswith("no router answered") or text.endswith(NOTHING_LISTENS):
        text += (
            "; is a router running there? ('aa router' starts one; --router H:P or $AA_ROUTER "
            "names another)"
        )
    return text


def report(exc: BaseException) -> int:
    """One line for an exception no command handled, and the exit status: 2 for a usage
    mistake, 1 otherwise. The traceback is for `aa -v`."""
    from aa.mesh import AaError, UsageError

    if isinstance(exc, UsageError):
        return fail(str(exc), 2)
    if isinstance(exc, AaError):
        return fail(explain(exc))
    if isinstance(exc, PermissionError):
        where = f" on {exc.filename}" if exc.filename else ""
        return fail(
            f"permission denied{where}: give a folder you may write to, or fix its permissions"
        )
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return fail(f"{exc.strerror or exc}{where}")
    return fail(
        f"unexpected error: {type(exc).__name__}: {exc} (run 'aa -v {_program[3:] or 'COMMAND'} …' "
        "for the traceback)"
    )


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """A point in time from the command line: ISO 8601 (``2030-01-02T03:04:05+00:00``; a time
    without zone is this machine's local time) or a duration ago (``2h``, ``90s``, ``1d``).
    Raises `UsageError` saying which forms it takes.

    >>> parse_since("2030-01-02T03:04:05Z").isoformat()
    '2030-01-02T03:04:05+00:00'
    """
    from aa.mesh import UsageError
    from aa.router import parse_duration

    text = text.strip()
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        pass
    else:
        return t if t.tzinfo is not None else t.astimezone()
    try:
        ago = parse_duration(text)
    except UsageError:
        raise UsageError(
            f"cannot read time {text!r}: give ISO 8601 (2030-01-02T03:04:05Z) or a "
            "duration ago such as 2h, 90s or 1d"
        ) from None
    return (now or datetime.now(UTC)) - ago


#: Environment variable naming this machine's client id for `aa` commands.
ENV_CLIENT_ID = "AA_CLIENT_ID"


def client_id_file() -> Path:
    """Where the stable client id of `aa` commands is kept: ``$XDG_CONFIG_HOME/aa/client-id``
    (``~/.config/aa/client-id`` by default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "aa" / "client-id"


def client_id(args: argparse.Namespace) -> str:
    """--client-id, else $AA_CLIENT_ID, else the id kept in `client_id_file()` (made the first
    time): the same id on every run, so `aa cache get` finds what `aa cache register` asked for."""
    if getattr(args, "client_id", None):
        return str(args.client_id)
    env = os.environ.get(ENV_CLIENT_ID, "").strip()
    if env:
        return env
    path = client_id_file()
    try:
        kept = path.read_text().strip()
        if kept:
            return kept
    except OSError:
        pass
    from aa.mesh import UsageError

    new = f"aa-{secrets.token_hex(8)}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(new + "\n")
    except OSError as exc:
        raise UsageError(
            f"cannot keep a client id in {path} ({exc}): give --client-id or ${ENV_CLIENT_ID}"
        ) from None
    return new


def add_client_id_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--client-id",
        metavar="ID",
        help=f"this client's id; client caches belong to it (default: ${ENV_CLIENT_ID}, else an id "
        "made once and kept in ~/.config/aa/client-id)",
    )
