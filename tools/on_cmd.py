"""`aa on PATTERN --exec CMD [ARGS...]` and `aa on PATTERN --log`: simple per-event actions
(Å §4.7) — start a program, or append to the system log, for each matching event.

Running a program, never through a shell: the program and its arguments are a list given to
the operating system as they are (``subprocess`` with ``shell=False``), so a value such as
``"; rm -rf ~"`` or ``$(reboot)`` arrives as those characters and nothing else. Values reach
the program two ways:

- in arguments: ``{Name}`` in an argument is replaced by the event's value of that name
  (strings as they are; ``true``/``false``; numbers; datetimes in ISO 8601; empty for a
  value the event lacks or None; JSON for lists, maps and bytes); ``{{Name}}`` is a literal
  ``{Name}``, and braces around anything that is not a name stay as they are (a ``python -c``
  script's dicts pass through). A placeholder never splits or joins arguments.
- in the environment: ``AA_VALUE_<NAME>`` for each value (the name upper-cased, every
  character other than a letter, digit or ``_`` made ``_``), ``AA_EVENT_JSON`` (the whole
  event as `aa subscribe --json` prints it), ``AA_EVENT_ID``, ``AA_EVENT_TYPE``.

Programs run one at a time, in the order of the events; one that fails (or outlives
``--timeout``) is reported and the next event goes on. A value holding a NUL character
cannot be passed to a program at all: that event is skipped, with a warning.

The system log: one line per event, ``<type> <id> <values as JSON>``, to the local syslog
socket (``/dev/log``; ``--log-socket`` or ``$AA_LOG_SOCKET`` name another), facility
``user``, tag ``aa-on`` — what `logger(1)` writes, so journald and rsyslog take it.
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime
from typing import Any, Final

from aa.mesh import AaError, Event, PatternSpec, UsageError, event_to_json, to_json

from .common import add_router_option, explain, fail, open_client

__all__ = ["add_parser", "render_argument", "event_environment", "ENV_LOG_SOCKET"]

#: Environment variable naming the syslog socket (tests point it at a fake one).
ENV_LOG_SOCKET: Final = "AA_LOG_SOCKET"
#: Where the system log listens, by platform.
_LOG_SOCKETS: Final = ("/dev/log", "/var/run/syslog")
#: {{Name}} (a literal "{Name}") or {Name}; a name as in patterns. Other braces stay as they
#: are, so a `python -c` script with dicts and sets passes through untouched.
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_][\w.\-]*)\}\}|\{([A-Za-z_][\w.\-]*)\}")
_ENV_NAME = re.compile(r"[^A-Za-z0-9_]")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "on",
        # by hand: argparse puts PATTERN last, after --exec, which takes all that follows it
        usage="aa on [-h] [--router H:P] [--xpath] [--count N] [--timeout S] [--log-socket PATH] "
        "[--log-tag TAG]\n             PATTERN (--log | --exec CMD [ARG ...])",
        help="run a program, or write the system log, for each matching event",
        description="For each event PATTERN matches: run a program (--exec), never through a "
        "shell, with the event's values in its arguments ({Name} placeholders) and environment "
        "(AA_VALUE_<NAME>, AA_EVENT_JSON, AA_EVENT_ID, AA_EVENT_TYPE); or append a line to the "
        "system log (--log).",
        epilog="examples: aa on 'Temperature > 100' --exec notify-send 'hot: {Temperature}'   |   "
        "aa on 'type == \"alarm\"' --log",
    )
    add_router_option(p)
    p.add_argument(
        "pattern", metavar="PATTERN", help="a Python expression over event values (or see --xpath)"
    )
    p.add_argument("--xpath", action="store_true", help="PATTERN is an XPath expression")
    p.add_argument("--count", type=int, metavar="N", help="exit after N events")
    p.add_argument(
        "--timeout", type=float, metavar="S", help="stop a program that runs longer than S seconds"
    )
    p.add_argument(
        "--log-socket",
        metavar="PATH",
        help=f"the syslog socket for --log (default: ${ENV_LOG_SOCKET}, else /dev/log)",
    )
    p.add_argument("--log-tag", default="aa-on", metavar="TAG", help="syslog tag (default: aa-on)")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--log", action="store_true", help="append each event to the system log")
    action.add_argument(
        "--exec",
        dest="command",
        nargs=argparse.REMAINDER,
        metavar="CMD",
        help="the program and its arguments: everything after --exec",
    )
    p.set_defaults(func=run)


# -- values into arguments and environment ----------------------------------------------------


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return json.dumps(to_json(value), ensure_ascii=False, separators=(",", ":"))


def render_argument(template: str, values: dict[str, Any]) -> str:
    """*template* with each ``{Name}`` replaced by that value's text.

    >>> render_argument("{Name} said {{T}} at {T} {not: a placeholder}", {"Name": "a; b", "T": 2.5})
    'a; b said {T} at 2.5 {not: a placeholder}'
    """

    def sub(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return "{" + m.group(1) + "}"
        return _text(values.get(m.group(2)))

    return _PLACEHOLDER.sub(sub, template)


def event_environment(event: Event, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a program gets for *event* (see the module docstring)."""
    env = dict(os.environ if base is None else base)
    for k in [k for k in env if k.startswith("AA_VALUE_")]:
        del env[k]  # never let an outer event's values leak in
    for name, value in event.values.items():
        env["AA_VALUE_" + _ENV_NAME.sub("_", name).upper()] = _text(value)
    env["AA_EVENT_JSON"] = json.dumps(event_to_json(event), ensure_ascii=False)
    env["AA_EVENT_ID"] = event.id or ""
    env["AA_EVENT_TYPE"] = event.type or ""
    return env


# -- the command -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    if args.count is not None and args.count <= 0:
        return fail("--count must be positive", 2)
    if not args.log and not args.command:
        return fail("--exec needs a program to run", 2)
    if args.command and shutil.which(args.command[0]) is None:
        return fail(f"no program {args.command[0]!r} to run", 127)
    syslog = None
    if args.log:
        try:
            syslog = _syslog(args)
        except UsageError as exc:
            return fail(str(exc), 2)
        except OSError as exc:
            return fail(
                f"cannot open the system log {exc.filename or ''}: {exc.strerror or exc}; give "
                "another socket with --log-socket (or $AA_LOG_SOCKET)"
            )
    spec = (
        PatternSpec(kernel="xpath", source=args.pattern)
        if args.xpath
        else PatternSpec(source=args.pattern)
    )
    try:
        with open_client(args, "aa on") as client:
            sub = client.subscribe(spec)
            for seen, event in enumerate(sub, 1):
                if syslog is not None:
                    syslog.info("%s", _log_line(event))
                else:
                    _execute(args, event)
                if args.count is not None and seen >= args.count:
                    break
            if sub.failure is not None:
                return fail(f"the router stopped the pattern: {sub.failure}")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise  # quiet: see aa.tools.cli
    except (OSError, AaError) as exc:
        return fail(explain(exc))
    finally:
        if syslog is not None:
            for h in syslog.handlers:
                h.close()
    return 0


def _execute(args: argparse.Namespace, event: Event) -> None:
    try:
        argv = [args.command[0], *(render_argument(a, event.values) for a in args.command[1:])]
        env = event_environment(event)
        done = subprocess.run(
            argv, env=env, shell=False, stdin=subprocess.DEVNULL, timeout=args.timeout, check=False
        )
    except ValueError as exc:  # "embedded null byte": no program can be given that
        print(f"aa on: event {event.id} skipped: {exc}", file=sys.stderr)
        return
    except subprocess.TimeoutExpired:
        print(
            f"aa on: {args.command[0]} outlived --timeout {args.timeout:g} s for event {event.id}",
            file=sys.stderr,
        )
        return
    except OSError as exc:
        print(f"aa on: cannot run {args.command[0]}: {exc}", file=sys.stderr)
        return
    if done.returncode != 0:
        print(
            f"aa on: {args.command[0]} exited with {done.returncode} for event {event.id}",
            file=sys.stderr,
        )


def _log_line(event: Event) -> str:
    values = json.dumps(to_json(event.values), ensure_ascii=False, separators=(",", ":"))
    return f"{event.type or '-'} {event.id} {values}"


def _syslog(args: argparse.Namespace) -> logging.Logger:
    path = args.log_socket or os.environ.get(ENV_LOG_SOCKET)
    if not path:
        path = next((p for p in _LOG_SOCKETS if os.path.exists(p)), None)
        if path is None:
            raise UsageError(
                f"no system log on this machine (no {' or '.join(_LOG_SOCKETS)}): give its socket "
                "with --log-socket (or $AA_LOG_SOCKET), or use --exec instead"
            )
    _reach(path)  # SysLogHandler defers a failed connection to each record: say it now, once
    handler = logging.handlers.SysLogHandler(
        address=path, facility=logging.handlers.SysLogHandler.LOG_USER
    )
    handler.ident = f"{args.log_tag}[{os.getpid()}]: "
    logger = logging.Logger("aa.on.syslog")
    logger.addHandler(handler)
    logger.propagate = False
    return logger


def _reach(path: str) -> None:
    """Raise `OSError` if nothing listens on the system log socket *path*."""
    import socket

    last: OSError | None = None
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_UNIX, kind) as s:
            try:
                s.connect(path)
                return
            except OSError as exc:
                last = exc
    assert last is not None
    raise OSError(last.errno, last.strerror, path)
