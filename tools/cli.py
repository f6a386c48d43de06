"""The `aa` command line: one program, a subcommand per task.

Start-up is kept short (`aa --help` in well under 0.3 s): this module imports no other part
of Aa, and a subcommand's module (which imports the client, the router, FastAPI, ...) is
imported only when that subcommand is chosen. `build_parser()` without arguments still
builds every subcommand (for tests and documentation).

Every mistake a user can make on the command line ends in one line on stderr saying what is
wrong and what to do, and a non-zero status: `aa COMMAND: message`. An unexpected error too,
without its traceback unless `aa -v COMMAND …` (or the command's own -v) asks for it. Ctrl-C
and a closed pipe (`aa mesh --json | head`) end the command quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import Any

__all__ = ["main", "build_parser", "COMMANDS"]

#: Subcommand → (module of aa.tools defining it, one-line help for `aa --help`). A module's
#: `add_parser(sub)` (`add_parsers` for pubsub_cmd) adds the full parser.
COMMANDS: dict[str, tuple[str, str]] = {
    "router": ("router_cmd", "run a router"),
    "send": ("pubsub_cmd", "publish one event"),
    "subscribe": ("pubsub_cmd", "print matching events"),
    "mesh": ("mesh_cmd", "show the routers of the mesh"),
    "cache": ("cache_cmd", "keep events in the mesh for this client while it is away"),
    "mine": ("mine_cmd", "mine routers' event logs (PySpark) for the adapters' knowledge"),
    "on": ("on_cmd", "run a program (or log) per matching event"),
    "quench": ("quench_cmd", "register a prototype and show interest appearing and going"),
    "container": ("container_cmd", "host add-ins"),
    "service": ("service_cmd", "write a systemd unit for a router or a container"),
    "certs": ("certs_cmd", "make a mesh CA and certificates for routers and users"),
    "top": ("top_cmd", "a live view of a router: rates, clients, slow subscribers, links"),
}

#: Exit status of a command whose output pipe was closed (as if killed by SIGPIPE).
EXIT_BROKEN_PIPE = 128 + 13
#: Exit status after Ctrl-C (as if killed by SIGINT).
EXIT_INTERRUPTED = 128 + 2


class _Version(argparse.Action):
    """`--version`, reading the installed distribution's version only when asked, and which
    event path runs (compiled or pure Python: `aa.mesh.event_path`)."""

    def __init__(
        self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any
    ) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="print the version and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("aa-mesh")
        except PackageNotFoundError:
            text = "unknown (not installed)"
        print(f"aa {text} ({_event_path()})")
        parser.exit()


def _event_path() -> str:
    """Which event path `aa.mesh` runs (`aa.mesh.event_path()`), found by running its switch
    module alone: importing `aa.mesh` would import half of Aa for one word."""
    from importlib.util import find_spec, module_from_spec, spec_from_file_location
    from pathlib import Path

    mesh = find_spec("aa.mesh")
    if mesh is None or not mesh.submodule_search_locations:
        return "unknown event path"
    switch = Path(next(iter(mesh.submodule_search_locations)), "_speedups.py")
    spec = spec_from_file_location("aa.mesh._speedups", switch)
    if spec is None or spec.loader is None:
        return "unknown event path"
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.event_path())


def _add(sub: argparse._SubParsersAction[argparse.ArgumentParser], module: str) -> None:
    mod = import_module(f"{__package__}.{module}")
    (getattr(mod, "add_parsers", None) or mod.add_parser)(sub)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `aa` parser: with *command*, that subcommand in full and the others as names with
    their help only (nothing else imported); without, every subcommand in full."""
    parser = argparse.ArgumentParser(
        prog="aa",
        description="Aa: a publish/subscribe mesh for clients that come and go.",
        epilog="Run 'aa COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action=_Version)
    parser.add_argument(
        "-v",
        "--verbose",
        dest="traceback",
        action="store_true",
        help="show the traceback of an unexpected error",
    )
    sub = parser.add_subparsers(dest="aa_command", metavar="COMMAND", required=True)
    wanted = COMMANDS[command][0] if command in COMMANDS else None
    loaded: set[str] = set()
    for name, (module, help) in COMMANDS.items():
        if module in loaded:
            continue  # added with its module's other subcommand
        if command is None or module == wanted:
            _add(sub, module)
            loaded.add(module)
        else:
            sub.add_parser(name, help=help, add_help=False)
    return parser


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand *argv* names (the first word that is not an option), if it is one."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _chosen(argv)
    parser = build_parser(command) if command else _names_only()
    from . import common

    args: argparse.Namespace | None = None
    try:
        args = parser.parse_args(argv)
        common.set_program(f"aa {args.aa_command}")
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        from aa.mesh import AaError

        # `aa -v COMMAND` shows every traceback; a command's own -v (more log output, as
        # `make run` passes it) only that of an unexpected error, not a usage mistake's.
        if (
            getattr(args, "traceback", False)
            or getattr(args, "verbose", 0)
            and not isinstance(exc, (AaError, OSError))
        ):
            raise
        return common.report(exc)


def _names_only() -> argparse.ArgumentParser:
    """For `aa`, `aa --help`, `aa --version`: every subcommand by name, none imported."""
    parser = build_parser("")
    return parser


def _quiet_stdout() -> None:
    """The reader of our output went away: point stdout at /dev/null, so that the
    interpreter's last flush at exit does not complain a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
