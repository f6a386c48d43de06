"""`aa router`: run a router on the console until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import ctypes
import errno
import gc
import logging
import os
import platform
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import add_event_loop_option, loop_runner
from .container_cmd import add_hosting_options, hosted_container
from .defaults import (
    BROADCAST_INTERVAL,
    DEFAULT_HTTP_PORT,
    DEFAULT_PORT,
    DISCOVERY_PORT,
    ENV_INTERFACES,
    FORGET_AFTER,
    MAX_ROUTERS,
    MAX_SESSION_BACKLOG,
    MAX_SUBSCRIPTIONS_PER_CLIENT,
    PEER_KEEPALIVE,
    RETRY_BASE,
    RETRY_MAX,
    ROUTER_INFO_INTERVAL,
)
from .logsetup import LOG_FORMATS, LOG_LEVELS
from .router_config import Key, keys_of, record_given
from .security_opts import add_security_options, security_config
from .storage_opts import add_storage_options, storage_config

if TYPE_CHECKING:
    from aa.http_api import HttpEndpoint
    from aa.router import Router, RouterConfig

__all__ = [
    "add_parser",
    "router_parser",
    "router_keys",
    "run",
    "config_from_args",
    "http_port",
    "check_listen",
]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "router",
        help="run a router",
        description="Run a router on the console until Ctrl-C or SIGTERM. It listens for "
        "clients and peer routers on one TCP port, bound to loopback unless --host says otherwise.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"TCP port, 0 for any free one (default: {DEFAULT_PORT}); "
        "the HTTP endpoint takes the next one unless --http-port says otherwise",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        help="folder for the store, the event log (on with a data folder "
        "unless --no-event-log) and the topology (default: keep nothing)",
    )
    p.add_argument("--name", help="name shown in the mesh (default: host name and port)")
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="read the settings from this TOML file (docs/aa-router.example.toml has every key); "
        "flags given too override it; SIGHUP reads it again",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration (the file and the flags) as TOML and exit",
    )
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="debug log output (--log-level debug)"
    )
    add_event_loop_option(p)
    logs = p.add_argument_group("log", "What the router logs on stderr, and how.")
    logs.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="least severe level logged (default: info)",
    )
    logs.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text for people, or json: one object per line with time, level, logger, message "
        "and the client, user, peer or event concerned (default: text)",
    )
    mesh = p.add_argument_group(
        "mesh",
        "How the router finds and joins other routers. By default it broadcasts beacons and "
        "listens for them on every interface (or those in $AA_DISCOVERY_INTERFACES), dials the "
        "routers it finds and the ones they tell about, and keeps the known routers in "
        "DATA_DIR/topology.json so that it rejoins at once after a restart.",
    )
    mesh.add_argument(
        "--peer",
        metavar="H:P",
        action="append",
        default=[],
        help="a well-known router to dial whatever discovery finds; repeatable",
    )
    mesh.add_argument(
        "--no-discovery",
        action="store_true",
        help="no beacons, no zeroconf, and dial only --peer routers (and those in the "
        "topology file): the mesh keeps the shape given by hand",
    )
    mesh.add_argument(
        "--discovery-port",
        type=int,
        metavar="N",
        help=f"UDP port of the beacons, the same across the mesh (default: "
        f"$AA_DISCOVERY_PORT or {DISCOVERY_PORT})",
    )
    mesh.add_argument(
        "--discovery-interfaces",
        metavar="LIST",
        help="comma-separated interface names, addresses of this machine or subnets to "
        "broadcast on, e.g. 'lo' or 'eth0,10.1.2.0/24'; 'lo' keeps discovery on this machine "
        f"(default: ${ENV_INTERFACES}, else every interface)",
    )
    mesh.add_argument(
        "--zeroconf",
        action="store_true",
        help="also announce and browse with zeroconf (mDNS) on the selected interfaces",
    )
    mesh.add_argument(
        "--no-broadcast", action="store_true", help="no UDP broadcast beacons (zeroconf only)"
    )
    mesh.add_argument(
        "--routing",
        choices=("flood", "interest"),
        default="interest",
        help="'interest' (default): send each event only toward routers that may want it; "
        "'flood': to every router",
    )
    mesh.add_argument(
        "--max-routers",
        type=int,
        default=MAX_ROUTERS,
        metavar="N",
        help=f"routers the interest view holds at most; past it this router floods "
        f"(default {MAX_ROUTERS:,}; memory grows with it)",
    )
    timing = p.add_argument_group(
        "mesh timing", "Seconds; the defaults suit a LAN, tests shorten them."
    )
    timing.add_argument(
        "--beacon-interval",
        type=float,
        metavar="S",
        default=BROADCAST_INTERVAL,
        help=f"between two beacons (default: {BROADCAST_INTERVAL:g})",
    )
    timing.add_argument(
        "--retry-base",
        type=float,
        metavar="S",
        default=RETRY_BASE,
        help=f"first retry after a peer failed; doubles per failure (default: {RETRY_BASE:g})",
    )
    timing.add_argument(
        "--retry-max",
        type=float,
        metavar="S",
        default=RETRY_MAX,
        help=f"longest retry interval (default: {RETRY_MAX:g})",
    )
    timing.add_argument(
        "--forget-after",
        type=float,
        metavar="S",
        default=FORGET_AFTER,
        help="forget a router (not a --peer) of no use this long: no link, not heard of first "
        f"hand; it is then no longer dialled nor kept in the topology file (default: "
        f"{FORGET_AFTER:g}, a week; 'aa mesh forget' forgets one at once)",
    )
    timing.add_argument(
        "--keepalive",
        type=float,
        metavar="S",
        default=PEER_KEEPALIVE,
        help="pings on idle peer links; three silent ones break the link (default: "
        f"{PEER_KEEPALIVE:g})",
    )
    timing.add_argument(
        "--info-interval",
        type=float,
        metavar="S",
        default=ROUTER_INFO_INTERVAL,
        help="between two router summaries flooded for 'aa mesh' (default: "
        f"{ROUTER_INFO_INTERVAL:g})",
    )
    patterns = p.add_argument_group(
        "patterns",
        "Pattern code (scripts, XPath, expressions outside the closed grammar) runs in worker "
        "processes; new patterns run on probation workers first (docs/patterns.md and "
        "docs/security.md).",
    )
    patterns.add_argument(
        "--pattern-workers",
        type=int,
        metavar="N",
        default=2,
        help="worker processes for patterns that have left probation (default: 2)",
    )
    patterns.add_argument(
        "--probation-workers",
        type=int,
        metavar="N",
        help="worker processes for new patterns; 0: none, new patterns join the others "
        "at once (default: as many as --pattern-workers)",
    )
    http = p.add_argument_group(
        "http",
        "The RESTful endpoint (Atom feeds for HTTP clients, the web monitor at /, API docs at "
        "/docs).",
    )
    http.add_argument(
        "--http-port",
        type=int,
        metavar="N",
        help="TCP port of the HTTP endpoint, 0 for any free one (default: --port + 1, which is "
        f"{DEFAULT_HTTP_PORT} for the default port and lets routers share a machine; any free one "
        "when --port is 0)",
    )
    http.add_argument(
        "--http-host", metavar="ADDR", help="address of the HTTP endpoint (default: --host)"
    )
    http.add_argument(
        "--http-allow",
        metavar="CIDR",
        action="append",
        default=[],
        help="address range allowed to call the HTTP endpoint, e.g. 192.168.0.0/16; "
        "repeatable (default: loopback only)",
    )
    http.add_argument(
        "--http-name",
        metavar="NAME",
        action="append",
        default=[],
        help="a host name (or address) requests to the HTTP endpoint may name in their Host "
        "header, e.g. router.lan; repeatable (always: localhost, loopback addresses and "
        "--http-host; others get 421, against DNS rebinding)",
    )
    http.add_argument("--no-http", action="store_true", help="no HTTP endpoint")
    limits = p.add_argument_group(
        "limits", "What one client may take of the router; SIGHUP applies a change at once."
    )
    limits.add_argument(
        "--max-subscriptions",
        type=int,
        metavar="N",
        default=MAX_SUBSCRIPTIONS_PER_CLIENT,
        help=f"subscriptions one client may hold at once (default: {MAX_SUBSCRIPTIONS_PER_CLIENT})",
    )
    limits.add_argument(
        "--max-backlog",
        type=int,
        metavar="BYTES",
        default=MAX_SESSION_BACKLOG,
        help="bytes queued for a client that does not read before its deliveries are dropped "
        f"(default: {MAX_SESSION_BACKLOG})",
    )
    add_storage_options(p)
    add_security_options(p)
    add_hosting_options(p)
    p.set_defaults(func=run)
    record_given(p)


def router_parser() -> argparse.ArgumentParser:
    """The `aa router` parser on its own (for its keys, and for tests)."""
    top = argparse.ArgumentParser(prog="aa")
    sub = top.add_subparsers()
    add_parser(sub)
    return sub.choices["router"]


def router_keys() -> dict[str, Key]:
    """The keys of `aa router --config FILE`, one per flag."""
    return keys_of(router_parser())


def config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> RouterConfig:
    """The `RouterConfig` the flags (and `AA_…` variables) ask for. Raises `UsageError`."""
    from aa.mesh import DiscoveryConfig, UsageError
    from aa.router import MeshConfig, RouterConfig, WorkerConfig

    env = os.environ if environ is None else environ
    port = args.discovery_port
    if port is None:
        text = env.get("AA_DISCOVERY_PORT", "")
        try:
            port = int(text) if text else DISCOVERY_PORT
        except ValueError:
            raise UsageError(f"AA_DISCOVERY_PORT={text!r} is not a port number") from None
    interfaces = None
    if args.discovery_interfaces:
        interfaces = (
            tuple(i.strip() for i in args.discovery_interfaces.split(",") if i.strip()) or None
        )
    discovery = DiscoveryConfig(
        enabled=not args.no_discovery,
        port=port,
        interfaces=interfaces,
        broadcast=not args.no_broadcast,
        broadcast_interval=args.beacon_interval,
        zeroconf=args.zeroconf,
    )
    mesh = MeshConfig(
        retry_base=args.retry_base,
        retry_max=max(args.retry_max, args.retry_base),
        forget_after=args.forget_after,
        keepalive=args.keepalive,
        info_interval=args.info_interval,
        routing=args.routing,
        max_routers=args.max_routers,
    )
    if not 1 <= args.pattern_workers <= 64:
        raise UsageError(f"--pattern-workers must be 1..64, not {args.pattern_workers}")
    if args.probation_workers is not None and not 0 <= args.probation_workers <= 64:
        raise UsageError(f"--probation-workers must be 0..64, not {args.probation_workers}")
    for flag, value in (
        ("--max-subscriptions", args.max_subscriptions),
        ("--max-backlog", args.max_backlog),
    ):
        if value <= 0:
            raise UsageError(f"{flag} must be positive, not {value}")
    return RouterConfig(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        name=args.name,
        discovery=discovery,
        peers=tuple(args.peer),
        mesh=mesh,
        max_subscriptions_per_client=args.max_subscriptions,
        max_session_backlog=args.max_backlog,
        security=security_config(args, env),
        workers=WorkerConfig(
            workers=args.pattern_workers, probation_workers=args.probation_workers
        ),
        **storage_config(args, env),
    )


def http_port(args: argparse.Namespace) -> int:
    """--http-port, else the port after --port (0 stays 0: any free one)."""
    if args.http_port is not None:
        return int(args.http_port)
    return 0 if args.port == 0 else int(args.port) + 1


def check_listen(host: str, port: int, what: str, flag: str) -> None:
    """Raise `UsageError` with what to do if *port* cannot be listened on at *host* (taken,
    privileged, an address not of this machine). Checked before the router binds anything,
    so a mistake leaves nothing behind (no beacon announcing a router about to die)."""
    from aa.mesh import UsageError

    if not 0 <= port < 65536:
        raise UsageError(f"{what} {port} is not a TCP port (1–65535); pick another with {flag}")
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise UsageError(
            f"cannot listen on {host!r} ({exc.strerror}); give an address of this machine with "
            "--host"
        ) from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
            try:
                s.bind(address)
            except OSError as exc:
                raise UsageError(_bind_message(exc, host, port, what, flag)) from None


def _bind_message(exc: OSError, host: str, port: int, what: str, flag: str) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{what} {port} is in use (another router, or another program); pick another with "
            f"{flag}"
        )
    if exc.errno == errno.EACCES:
        return f"{what} {port} needs privileges this user lacks; pick one above 1023 with {flag}"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host} (not an address of this machine); give another with --host"
    return f"cannot listen on {host}:{port} ({exc.strerror}); pick another with {flag}"


def run(args: argparse.Namespace) -> int:
    from aa.mesh import StoreError, UsageError

    from .logsetup import setup_logging
    from .router_config import blame, resolve, to_toml

    keys = router_keys()
    cmdline, args = args, resolve(args, keys)
    if args.print_config:
        print(to_toml(args, keys), end="")
        return 0
    setup_logging(_log_level(args), args.log_format)
    try:
        config, endpoints = _compose(args)
        check_listen(args.host, args.port, "port", "--port")
        for endpoint in endpoints:
            check_listen(
                endpoint.config.host,
                endpoint.config.port,
                "HTTP port",
                "--http-port (or --no-http)",
            )
    except UsageError as exc:
        raise blame(exc, args, keys) from None
    reloader = _Reloader(cmdline, args, keys)
    run = loop_runner(args.event_loop)
    _tune_gc()
    try:
        run(_serve(config, endpoints, args, reloader))
    except KeyboardInterrupt:
        pass
    except StoreError as exc:  # a wrong --store-url, an unreachable database
        print(f"aa router: {exc}{_permission_hint(exc)}", file=sys.stderr)
        return 1
    except UsageError as exc:  # e.g. a data folder this user may not write to
        hint = _permission_hint(exc)
        if hint:
            raise UsageError(f"{exc}{hint}") from None
        raise
    except OSError as exc:  # taken between the check and the bind
        if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise UsageError(
                f"cannot listen: {exc.strerror}; pick another port with --port or --http-port"
            ) from None
        raise
    return 0


def _log_level(args: argparse.Namespace) -> str:
    return "debug" if args.verbose else str(args.log_level)


def _compose(args: argparse.Namespace) -> tuple[RouterConfig, list[HttpEndpoint]]:
    """The router's configuration and its HTTP endpoint. Raises `UsageError`.

    The HTTP API (FastAPI, pydantic, uvicorn) is imported only when HTTP is on: a router
    started with ``--no-http`` never loads it."""
    config = config_from_args(args)
    if args.no_http:
        return config, []
    from aa.http_api import DEFAULT_ALLOW, HttpEndpoint

    endpoint = HttpEndpoint(
        host=args.http_host or args.host,
        port=http_port(args),
        allow=tuple(args.http_allow) or DEFAULT_ALLOW,
        names=tuple(args.http_name),
        cert=args.http_cert or config.security.cert,
        key=args.http_key or config.security.key,
    )
    return config, [endpoint]


class _Reloader:
    """What SIGHUP does: read the configuration file again (the flags still win), apply
    what can change while the router runs (`LIVE`), read the permissions and the revocation
    list again, and say in one log line what was reloaded and what was not. A file that
    does not load, or holds a bad value, changes nothing of the configuration."""

    def __init__(
        self, cmdline: argparse.Namespace, current: argparse.Namespace, keys: dict[str, Key]
    ) -> None:
        self.cmdline, self.current, self.keys = cmdline, current, keys

    def __call__(self, router: Router) -> None:
        from aa.mesh import UsageError

        from .router_config import blame, changes, resolve

        done: list[str] = []
        failed: list[str] = []
        bad = False
        if self.cmdline.config is not None:
            new = None
            try:
                new = resolve(self.cmdline, self.keys)
                _compose(new)  # every value checked before any is applied
            except UsageError as exc:
                reason = blame(exc, new, self.keys) if new is not None else exc
                failed.append(f"the configuration (the old one stays): {reason}")
                bad = True
            else:
                done += self._apply(router, new, changes(self.current, new, self.keys), failed)
        for line in router.reload_security():
            if " not reloaded" in line:
                failed.append(line.partition(" not reloaded")[0] + " (see above)")
            else:
                done.append("revocation list" if line.startswith("revocation") else "permissions")
        text = "; ".join(
            part
            for part in (
                f"reloaded {', '.join(done)}" if done else "",
                f"not reloaded {'; '.join(failed)}" if failed else "",
            )
            if part
        )
        log = logging.getLogger("aa.router.config")
        log.log(
            logging.ERROR if bad else logging.WARNING if failed else logging.INFO,
            "SIGHUP: %s",
            text or "nothing to reload (no --config, --permissions or --crl)",
            extra={"reloaded": done, "not_reloaded": failed},
        )

    def _apply(
        self, router: Router, new: argparse.Namespace, changed: list[Any], failed: list[str]
    ) -> list[str]:
        import dataclasses

        from .logsetup import setup_logging
        from .router_config import LIVE

        done = []
        for key, old, value in changed:
            if key.name in LIVE:
                done.append(f"{key.name} ({_shown(old)} → {_shown(value)})")
            else:
                failed.append(f"{key.name} ({_shown(old)} → {_shown(value)}: needs a restart)")
                setattr(new, key.dest, old)  # still the running value
        setup_logging(_log_level(new), new.log_format)
        router.config = dataclasses.replace(
            router.config,
            max_subscriptions_per_client=new.max_subscriptions,
            max_session_backlog=new.max_backlog,
        )
        self.current = new
        return done


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return "unset" if value is None else str(value)


def _permission_hint(exc: BaseException) -> str:
    if isinstance(exc.__cause__, PermissionError) or isinstance(exc.__context__, PermissionError):
        return "; give a folder this user may write to with --data-dir (or fix its permissions)"
    return ""


#: Allocations between two young-generation collections of a router process (Python's default
#: is 700). A router makes a few short-lived containers per event and keeps large long-lived
#: ones (seen ids, caches) that every older-generation pass walks; with the default, the
#: collector takes a large share of a relaying router's CPU (Decisions, in the manual).
GC_THRESHOLD = (50_000, 20, 100)


#: Bytes from which glibc's malloc serves a block by mmap, given back to the system when freed.
#: glibc raises this threshold by itself (up to 32 MiB) after the first big block is freed;
#: from then on the buffers of multi-MB frames come from the heap, where a few small live
#: objects between them keep the freed memory from ever being given back, so many connections
#: sending multi-MB bad frames would leave the router larger for good
#: (tests/test_faults_memory.py). Set by hand, the threshold stays put.
MMAP_THRESHOLD = 256 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def _tune_gc() -> None:
    gc.collect()
    gc.freeze()  # what was imported and built at start is never garbage: stop walking it
    gc.set_threshold(*GC_THRESHOLD)
    if platform.libc_ver()[0] == "glibc":  # elsewhere: nothing to pin
        try:
            ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        except (OSError, AttributeError):
            pass


async def _serve(
    config: RouterConfig,
    endpoints: list[HttpEndpoint],
    args: argparse.Namespace | None = None,
    reloader: Callable[[Router], None] | None = None,
) -> None:
    import asyncio

    from aa.mesh import event_path
    from aa.router import Router

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    router = Router(config, endpoints=endpoints)
    try:
        await router.start()
    except BaseException:
        await router.aclose()  # what was bound before the failure (the mesh, its beacons)
        raise

    def reload() -> None:
        if reloader is not None:
            reloader(router)
        else:  # permissions and revocations; live sessions held to them
            router.reload_security()

    loop.add_signal_handler(signal.SIGHUP, reload)
    try:
        print(f"aa router {router.name!r} ({router.id}) listening on {router.endpoint}", flush=True)
        for endpoint in endpoints:
            print(f"aa router: HTTP endpoint and monitor on {endpoint.url}", flush=True)
        logging.getLogger("aa.router").info(
            "event loop: %s", "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
        )
        # Said once: a pure path nobody asked for (no compiler at install) is a warning.
        chosen = event_path() != "pure Python" or os.environ.get("AA_PURE_PYTHON")
        logging.getLogger("aa.router").log(
            logging.INFO if chosen else logging.WARNING, "event path: %s", event_path(why=True)
        )
        async with hosted_container(args, router):  # --container / --bundled: add-ins in-process
            await stop.wait()
            print("aa router: shutting down", file=sys.stderr, flush=True)
    finally:
        await router.aclose()
