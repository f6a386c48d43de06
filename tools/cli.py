"""The `aa` command line: one program, a subcommand per task."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from aa.mesh import UsageError

from . import cache_cmd, certs_cmd, container_cmd, mesh_cmd, mine_cmd, on_cmd, pubsub_cmd, quench_cmd, router_cmd, service_cmd

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aa",
        description="Aa: a publish/subscribe mesh for clients that come and go.",
        epilog="Run 'aa COMMAND --help' for a command's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    router_cmd.add_parser(sub)
    pubsub_cmd.add_parsers(sub)
    mesh_cmd.add_parser(sub)
    cache_cmd.add_parser(sub)
    mine_cmd.add_parser(sub)
    on_cmd.add_parser(sub)
    quench_cmd.add_parser(sub)
    container_cmd.add_parser(sub)
    service_cmd.add_parser(sub)
    certs_cmd.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"aa {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
