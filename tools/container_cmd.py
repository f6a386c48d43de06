"""`aa container DIR ...`: host the add-ins found in folders (and installed entry points) on the
console until Ctrl-C or SIGTERM (Å §4.7); and the options that let `aa router` host them in
its own process (`aa router --container DIR`, `aa router --bundled`)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import add_router_option, fail, router_endpoints
from .defaults import DEFAULT_POLL_INTERVAL

if TYPE_CHECKING:
    from aa.addins import Container, ContainerConfig
    from aa.router import Router

__all__ = ["add_parser", "add_hosting_options", "hosted_container", "BUNDLED"]  # noqa: F822 (BUNDLED: a lazy module __getattr__)


def bundled_folder() -> Path:
    """The folder of the bundled add-ins (`aa.addins.bundled`)."""
    import aa.addins.bundled

    return Path(aa.addins.bundled.__file__).parent


def __getattr__(name: str) -> Any:
    if name == "BUNDLED":  # imported only when asked: `aa router --help` stays quick
        return bundled_folder()
    raise AttributeError(name)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "container",
        help="host add-ins (publishers, adapters) from folders",
        description="Host the add-ins found in DIR (a module NAME.py or a package NAME/ each, see "
        "aa.addins.api) and those installed packages declare under the 'aa.addins' entry point, "
        "each with its own client. A failing add-in is restarted with a growing back-off and never "
        "disturbs the others; one copied into DIR, or changed there, is loaded without a restart.",
        epilog="example: aa container ~/addins --bundled",
    )
    add_router_option(p)
    p.add_argument("folders", nargs="*", type=Path, metavar="DIR", help="folders of add-ins")
    p.add_argument("--bundled", action="store_true", help="also host the bundled office add-ins")
    p.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="parent of the add-ins' data folders (default: $XDG_DATA_HOME/aa/addins, "
        "~/.local/share/aa/addins)",
    )
    p.add_argument(
        "--poll",
        type=float,
        default=DEFAULT_POLL_INTERVAL,
        metavar="S",
        help="seconds between two looks for new or changed add-ins (default: "
        f"{DEFAULT_POLL_INTERVAL:g})",
    )
    p.add_argument(
        "--no-entry-points", action="store_true", help="ignore add-ins of installed packages"
    )
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    p.set_defaults(func=run)


def add_hosting_options(parser: argparse.ArgumentParser) -> None:
    """`aa router`'s options for hosting add-ins in the router's process."""
    g = parser.add_argument_group(
        "add-ins", "Host add-ins in this process, their clients connected to this router."
    )
    g.add_argument(
        "--container",
        metavar="DIR",
        type=Path,
        action="append",
        default=[],
        help="a folder of add-ins to host (as 'aa container DIR'); repeatable",
    )
    g.add_argument(
        "--bundled",
        action="store_true",
        help="host the bundled office add-ins (what 'make run' does)",
    )


def _folders(args: argparse.Namespace, attr: str) -> tuple[Path, ...]:
    folders = list(getattr(args, attr, None) or [])
    if getattr(args, "bundled", False):
        folders.append(bundled_folder())
    return tuple(folders)


@contextlib.asynccontextmanager
async def hosted_container(
    args: argparse.Namespace | None, router: Router
) -> AsyncIterator[Container | None]:
    """A container in the router's process, if --container or --bundled asked for one."""
    from aa.addins import Container, ContainerConfig

    folders = _folders(args, "container") if args is not None else ()
    if not folders:
        yield None
        return
    data_dir = router.config.data_dir / "addins" if router.config.data_dir is not None else None
    config = ContainerConfig(
        folders=folders, routers=(router.endpoint,), data_dir=data_dir, entry_points=False
    )
    async with Container(config) as container:
        print(f"aa router: hosting add-ins from {', '.join(str(f) for f in folders)}", flush=True)
        yield container


def run(args: argparse.Namespace) -> int:
    import asyncio

    from aa.addins import ContainerConfig

    level = logging.WARNING - 10 * min(args.verbose + 1, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    folders = _folders(args, "folders")
    if not folders and args.no_entry_points:
        return fail("nothing to host: give a DIR, --bundled, or allow entry points", 2)
    config = ContainerConfig(
        folders=folders,
        routers=tuple(router_endpoints(args)),
        data_dir=args.data_dir,
        poll_interval=args.poll,
        entry_points=not args.no_entry_points,
    )
    try:
        asyncio.run(_serve(config))
    except KeyboardInterrupt:
        pass
    return 0


async def _serve(config: ContainerConfig) -> None:
    import asyncio

    from aa.addins import Container

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Container(config) as container:
        status = container.status()
        names = (
            ", ".join(sorted(n for n, st in status.items() if st["state"] != "broken"))
            or "none yet"
        )
        broken = sorted(n for n, st in status.items() if st["state"] == "broken")
        not_loaded = f" (not loaded, see the log: {', '.join(broken)})" if broken else ""
        print(
            f"aa container: hosting {names}{not_loaded}; routers {', '.join(config.routers)}",
            flush=True,
        )
        await stop.wait()
        print("aa container: stopping add-ins", file=sys.stderr, flush=True)
