"""`aa service install router|container`: run Aa as a system service (Å §4.1, §4.7) — writes a
systemd unit, and says what to run next. It never calls systemctl and writes nowhere but the
unit folder (``--dry-run`` writes nothing).

==========  ========================================  ==============================================
            system (default)                          ``--user``
==========  ========================================  ==============================================
unit folder ``/etc/systemd/system``                   ``~/.config/systemd/user``
router      ``aa router --host 127.0.0.1 --data-dir   the same
            $STATE_DIRECTORY`` (``/var/lib/aa``)
container   ``aa container /etc/aa/addins``           ``aa container %h/.config/aa/addins``
==========  ========================================  ==============================================

``--args`` replaces those defaults: ``aa service install container --args '/srv/addins --bundled'``.

Where the router listens: loopback, with discovery kept on loopback too (a beacon naming
127.0.0.1 means nothing to another machine), unless ``--host`` says otherwise; with
``--certs`` every address (``0.0.0.0``: TLS, no anonymous clients). A plaintext listener off
loopback is written if asked for, with a one-line warning.

Where the program lives: a system unit confines the service (``ProtectSystem=strict``,
``ProtectHome=yes``, ``PrivateTmp=yes``). A virtual environment under /home or /root (or an
editable install's source there) gets ``ProtectHome=read-only`` instead, one under /tmp no
``PrivateTmp``, each with a comment in the unit saying why; a program in a folder the
service's user may not enter (``DynamicUser`` runs as nobody's user) is refused with the
folder and what to do.

The router's settings go into a configuration file (``aa router --config FILE``), written
beside the unit with ``--unit-dir``, else ``/etc/aa/NAME.toml`` (``~/.config/aa/NAME.toml``
with ``--user``), and never overwritten: the operator edits it, and ``systemctl reload``
applies what can change while the router runs. Its paths name systemd's
``${STATE_DIRECTORY}`` and ``${CREDENTIALS_DIRECTORY}``, which the router expands. For the
router, ``--args`` are added to ``aa router --config FILE`` (flags override the file).

With ``--certs DIR`` the router serves TLS with DIR's certificates (handed over by systemd's
``LoadCredential``), refuses clients without a certificate (``--no-anonymous``), reads the
revocation list ``DIR/crl.pem`` in place (``--crl``: a credential would be a copy frozen at
start, and revocations must reach the running router) and a permissions file, written as a
commented template that denies everything (``--permissions``, never overwritten): the secure
unit is the one written, and the operator opens what is needed. ``systemctl reload`` re-reads
both (SIGHUP).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import shlex
import shutil
import stat
import sys
from pathlib import Path

from aa.mesh import UsageError

from .common import fail

__all__ = [
    "add_parser",
    "unit_text",
    "systemd_quote",
    "unit_path",
    "PERMISSIONS_TEMPLATE",
    "permissions_path",
    "config_path",
    "router_config_text",
    "confinement",
    "listener_warning",
]

#: The permissions file `aa service install router --certs` writes when there is none: it
#: parses, and denies everything (`aa.router.security.permissions`).
PERMISSIONS_TEMPLATE = """\
# Who may do what on this router (aa router --permissions). Re-read on 'systemctl reload'
# (SIGHUP); live sessions are held to the new rules. Everything not given is denied: as
# written, this file lets every user with a certificate connect and do nothing.
# Types are glob patterns ("sensor.*"); "*" is any type, "" the untyped events.

# [users.alice]             # the user named in a certificate ('aa certs client DIR alice')
# publish = ["reading"]     # types of events this user may publish
# subscribe = ["reading"]   # types of events this user's patterns may receive
# patterns = "predicates"   # "scripts" (any pattern), "predicates" (no scripts), "none"
# persist = false           # may ask the store to keep events
# client_caches = false     # may own client caches
# quench = false            # may register quench prototypes

# [users."*"]               # any other user with a certificate
# subscribe = ["weather"]
# patterns = "predicates"
"""

_DESCRIPTIONS = {
    "router": "Aa router: publish/subscribe mesh node",
    "container": "Aa container: hosts add-ins (publishers, adapters)",
}
_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+\Z")
#: Folders `ProtectHome=yes` hides from the service, and `PrivateTmp=yes` replaces.
_HOMES = ("/home", "/root", "/run/user")
_TMPS = ("/tmp", "/var/tmp")
#: Where a router unit listens without --host: loopback, or every address with --certs.
LOOPBACK_HOST = "127.0.0.1"
ANY_HOST = "0.0.0.0"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "service",
        help="install the router or the container as a system service (systemd)",
        description="Write a systemd unit that runs 'aa router' or 'aa container'. Nothing is "
        "started: the command prints the systemctl lines to run.",
        epilog="example: aa service install container --user --args '%h/addins --bundled' "
        "(systemd's %-specifiers apply)",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    inst = actions.add_parser(
        "install",
        help="write a systemd unit",
        description="Write a systemd unit for the router or the container.",
    )
    inst.add_argument("what", choices=("router", "container"), help="which service")
    inst.add_argument(
        "--user", action="store_true", help="a user unit (~/.config/systemd/user), not a system one"
    )
    inst.add_argument("--unit-dir", type=Path, metavar="DIR", help="write the unit here instead")
    inst.add_argument(
        "--dry-run", action="store_true", help="print the unit and where it would go; write nothing"
    )
    inst.add_argument(
        "--name",
        metavar="NAME",
        help="unit name without .service (default: aa-router / aa-container)",
    )
    inst.add_argument("--run-as", metavar="USER", help="system units: the user the service runs as")
    inst.add_argument(
        "--host",
        metavar="H",
        help=f"router: the address it listens on (default: {LOOPBACK_HOST}, with discovery on "
        f"loopback too; {ANY_HOST} with --certs); a plaintext one off loopback is warned of",
    )
    inst.add_argument(
        "--env",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="an environment variable for the service, e.g. AA_DISCOVERY_INTERFACES=eth0; "
        "repeatable",
    )
    inst.add_argument("--program", metavar="PATH", help="the aa program to run (default: this one)")
    inst.add_argument(
        "--certs",
        type=Path,
        metavar="DIR",
        help="router: serve TLS with DIR/ca.pem and DIR/NAME.pem, DIR/NAME.key from 'aa certs' "
        "(handed to the service by systemd's LoadCredential)",
    )
    inst.add_argument(
        "--cert-name", metavar="NAME", default="router", help="NAME for --certs (default: router)"
    )
    inst.add_argument(
        "--permissions",
        type=Path,
        metavar="FILE",
        help="router with --certs: the permissions file, written as a template that denies "
        "everything unless it exists (default: /etc/aa/permissions.toml, or "
        "~/.config/aa/permissions.toml with --user)",
    )
    inst.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="router: its configuration file, written unless it exists (default: beside the unit "
        "with --unit-dir, else /etc/aa/NAME.toml, or ~/.config/aa/NAME.toml with --user)",
    )
    # One string, split like a shell would: never a REMAINDER positional, which would swallow
    # --dry-run or --unit-dir given after it (and argparse mishandles "--" in sub-commands).
    inst.add_argument(
        "--args",
        dest="service_args",
        metavar="'ARGS'",
        default="",
        help="arguments for 'aa router' / 'aa container' instead of the defaults, as one "
        "string: --args '/srv/addins --bundled'",
    )
    inst.set_defaults(func=install)

    def usage(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=usage)


def systemd_quote(arg: str) -> str:
    """One word of an ExecStart line, quoted for systemd when it needs it.

    >>> systemd_quote("--port"), systemd_quote("my dir/a\\"b")
    ('--port', '"my dir/a\\\\"b"')
    """
    if _SAFE.match(arg):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("\n", "\\n")
    return f'"{escaped}"'


def _program(explicit: str | None) -> str:
    if explicit:
        return str(Path(explicit).absolute())
    beside = Path(sys.executable).with_name("aa")
    if beside.exists():
        return str(beside)
    found = shutil.which("aa")
    if found is None:
        raise UsageError("cannot find the aa program: give --program")
    return str(Path(found).absolute())


def unit_text(
    what: str,
    *,
    user: bool,
    program: str,
    args: list[str] | None = None,
    run_as: str | None = None,
    env: dict[str, str] | None = None,
    certs: Path | None = None,
    cert_name: str = "router",
    permissions: Path | None = None,
    crl: bool = True,
    config: Path | None = None,
    host: str | None = None,
    reads: list[str] | None = None,
) -> str:
    """The unit file for *what* ("router" or "container"). A system unit runs as *run_as*,
    or as a user systemd makes for it (DynamicUser: unprivileged, owning only its state
    folder); *certs* hands the router its certificates (LoadCredential: readable by the
    service only, whatever the files' owner), refuses anonymous clients, reads *certs*'s
    revocation list and the *permissions* file (see the module docstring). With *config*,
    the router is started as ``aa router --config CONFIG`` followed by *args*, and what it
    needs is in that file (`router_config_text`). *reads*: the paths the service reads
    besides *program* (the package's source, the files given), for `confinement`."""
    creds = _credentials(certs, cert_name)
    if config is not None and what == "router":
        args = ["--config", str(config.absolute()), *(args or [])]
    elif not args:
        if what == "router":
            args = _router_words(host=_host(host, certs))
        else:
            args = ["%h/.config/aa/addins" if user else "/etc/aa/addins"]
    if creds and what == "router" and config is None:
        assert certs is not None
        args = [*args, *_secure_words(certs, cert_name, crl=crl, permissions=permissions)]
    words = [program, what, *args]
    # ${STATE_DIRECTORY} and ${CREDENTIALS_DIRECTORY} are expanded by systemd: keep them unquoted.
    exec_start = " ".join(
        w
        if w.startswith(("${STATE_DIRECTORY}", "${CREDENTIALS_DIRECTORY}/"))
        and _SAFE.match(w.split("}", 1)[1] or "x")
        else systemd_quote(w)
        for w in words
    )
    lines = [
        "# Written by 'aa service install'. Edit freely; 'aa service install' again overwrites it.",
        "[Unit]",
        f"Description={_DESCRIPTIONS[what]}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={exec_start}",
        "Restart=on-failure",
        "RestartSec=2",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=20",
        # systemd's default soft limit (1,024 open files) is a router's client cap: one file each.
        "LimitNOFILE=65536",
        "StateDirectory=aa",
        "Environment=PYTHONUNBUFFERED=1",
    ]
    if what == "router":  # permissions and revocations re-read (the container has no reload)
        lines.insert(lines.index("KillSignal=SIGTERM"), "ExecReload=/bin/kill -HUP $MAINPID")
    for name, value in sorted((env or {}).items()):
        lines.append(f"Environment={systemd_quote(f'{name}={value}')}")
    if run_as and not user:
        lines.append(f"User={run_as}")
    elif not user:
        lines.append("DynamicUser=yes")  # never root: an unprivileged user of its own
    if not user:
        lines += ["NoNewPrivileges=yes", "ProtectSystem=strict"]
        lines += confinement([program, *(reads or [])])
    for f in creds if what == "router" else ():
        assert certs is not None
        lines.append(f"LoadCredential={f}:{systemd_quote(str(certs.absolute() / f))}")
    lines += ["", "[Install]", f"WantedBy={'default.target' if user else 'multi-user.target'}", ""]
    return "\n".join(lines)


def _credentials(certs: Path | None, cert_name: str) -> dict[str, str]:
    """Credential file → the router flag naming it."""
    if certs is None:
        return {}
    return {"ca.pem": "ca", f"{cert_name}.pem": "cert", f"{cert_name}.key": "key"}


def confinement(paths: list[str]) -> list[str]:
    """The unit lines that hide /home and /tmp from the service, unless it reads *paths*
    there: then ``ProtectHome=read-only`` (it may read, not write) or no ``PrivateTmp``, each
    after a comment saying which path needs it."""
    homes = [p for p in paths if _under(p, _HOMES)]
    tmps = [p for p in paths if _under(p, _TMPS)]
    lines = []
    if homes:
        lines += [
            f"# ProtectHome=read-only, not yes: the service reads {homes[0]} (a home folder)",
            "ProtectHome=read-only",
        ]
    else:
        lines.append("ProtectHome=yes")
    if tmps:
        lines.append(
            f"# No PrivateTmp: the service reads {tmps[0]}, which a private /tmp would hide"
        )
    else:
        lines.append("PrivateTmp=yes")
    return lines


def _under(path: str, roots: tuple[str, ...]) -> bool:
    p = os.path.normpath(path)
    return any(p == r or p.startswith(r + "/") for r in roots)


def _closed_folder(path: str) -> str | None:
    """The first existing folder on the way to *path* that other users may not enter (a
    service run as a user of its own cannot reach *path* then), or None."""
    here = Path(path).parent
    for folder in [*reversed(here.parents), here]:
        try:
            mode = folder.stat().st_mode
        except OSError:
            return None  # not on this machine (yet): nothing to check
        if not mode & stat.S_IXOTH:
            return str(folder)
    return None


def _host(host: str | None, certs: Path | None) -> str:
    if host is not None:
        return host
    return ANY_HOST if certs is not None else LOOPBACK_HOST


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listener_warning(host: str, *, tls: bool) -> str | None:
    """The one-line warning for a router unit listening on *host*, or None."""
    if tls or _is_loopback(host):
        return None
    return (
        f"warning: the router will listen on {host} in plaintext: anyone who reaches its port "
        "may publish, subscribe and read the mesh (give --certs DIR for TLS and users, or leave "
        "out --host for loopback)"
    )


def _router_words(*, host: str, local_discovery: bool = True) -> list[str]:
    words = ["--host", host, "--data-dir", "${STATE_DIRECTORY}"]
    if _is_loopback(host) and local_discovery:
        # Beacons naming a loopback address mean nothing to other machines.
        words += ["--discovery-interfaces", "lo"]
    return words


def _secure_words(certs: Path, cert_name: str, *, crl: bool, permissions: Path | None) -> list[str]:
    """The flags of a router with *certs*: TLS from systemd's credentials, no anonymous
    clients, the revocation list read in place, the permissions file."""
    words = [
        w
        for f, flag in _credentials(certs, cert_name).items()
        for w in (f"--{flag}", f"${{CREDENTIALS_DIRECTORY}}/{f}")
    ]
    words.append("--no-anonymous")
    if crl:
        words += ["--crl", str(certs.absolute() / "crl.pem")]
    if permissions is not None:
        words += ["--permissions", str(permissions.absolute())]
    return words


def router_config_text(
    *,
    user: bool,
    unit: str,
    certs: Path | None = None,
    cert_name: str = "router",
    permissions: Path | None = None,
    crl: bool = True,
    host: str | None = None,
    local_discovery: bool = True,
) -> str:
    """The configuration file of a router unit: the settings `unit_text` would otherwise
    pass as flags, as ``aa router --config`` reads them. *local_discovery*: a loopback
    router's beacons stay on loopback (False: the unit's environment chooses)."""
    from .router_cmd import router_keys, router_parser
    from .router_config import GIVEN, to_toml

    words = _router_words(host=_host(host, certs), local_discovery=local_discovery)
    if certs is not None:
        words += _secure_words(certs, cert_name, crl=crl, permissions=permissions)
    args = router_parser().parse_args(words)
    ctl = "systemctl --user" if user else "systemctl"
    header = (
        f"Settings of the router the unit {unit}.service runs (aa router --config THIS-FILE).\n"
        f"Written by 'aa service install router', never overwritten: edit it, then\n"
        f"'{ctl} reload {unit}' applies the log level, the limits, the permissions and the\n"
        f"revocation list, and logs what needs '{ctl} restart {unit}'. Every key, with its\n"
        "default: 'aa router --print-config'; docs/aa-router.example.toml explains each.\n"
        "${STATE_DIRECTORY} and ${CREDENTIALS_DIRECTORY} are the folders systemd gives."
    )
    return to_toml(args, router_keys(), only=set(getattr(args, GIVEN)), header=header)


def config_path(name: str, *, user: bool, unit_dir: Path | None) -> Path:
    """Where `install` writes the router's configuration file."""
    if unit_dir is not None:
        return unit_dir / f"{name}.toml"
    if user:
        base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(base) / "aa" / f"{name}.toml"
    return Path("/etc/aa") / f"{name}.toml"


def unit_path(name: str, *, user: bool, unit_dir: Path | None) -> Path:
    if unit_dir is not None:
        return unit_dir / f"{name}.service"
    if user:
        base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(base) / "systemd" / "user" / f"{name}.service"
    return Path("/etc/systemd/system") / f"{name}.service"


def permissions_path(explicit: Path | None, *, user: bool) -> Path:
    if explicit is not None:
        return explicit
    if user:
        base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(base) / "aa" / "permissions.toml"
    return Path("/etc/aa/permissions.toml")


def install(args: argparse.Namespace) -> int:
    try:
        extra = shlex.split(args.service_args)
    except ValueError as exc:
        return fail(f"--args: {exc}", 2)
    env: dict[str, str] = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            return fail(f"--env {item!r} is not NAME=VALUE", 2)
        env[name] = value
    if args.run_as and args.user:
        return fail("--run-as is for system units: a user unit runs as its user", 2)
    name = args.name or f"aa-{args.what}"
    if not re.fullmatch(r"[A-Za-z0-9_.@-]+", name):
        return fail(f"{name!r} is not a unit name", 2)
    if args.host is not None and args.what != "router":
        return fail("--host is for a router", 2)
    secured = args.what == "router" and args.certs is not None and "--permissions" not in extra
    perms = permissions_path(args.permissions, user=args.user) if secured else None
    crl = args.certs is not None and (args.certs / "crl.pem").exists()
    config = None
    if args.what == "router":
        config = args.config or config_path(name, user=args.user, unit_dir=args.unit_dir)
        config_text = router_config_text(
            user=args.user,
            unit=name,
            certs=args.certs,
            cert_name=args.cert_name,
            permissions=perms,
            crl=crl,
            host=args.host,
            local_discovery="AA_DISCOVERY_INTERFACES" not in env,
        )
    program = _program(args.program)
    # What the service reads at run time: its program, the package (an editable install's
    # source), and the files the router is given.
    reads = [str(Path(__file__).resolve().parent)]
    reads += [str(p.absolute()) for p in (config, perms) if p is not None]
    if crl and args.certs is not None:
        reads.append(str((args.certs / "crl.pem").absolute()))
    if not args.user and not args.run_as:
        for needed in (program, *reads[:1]):
            closed = _closed_folder(needed)
            if closed is not None:
                return fail(
                    f"the service would run {needed}, but {closed} is closed to other users and "
                    "a system unit runs as a user of its own (DynamicUser): give --run-as "
                    f"{_owner(closed)}, or install aa where every user may read it (e.g. a "
                    "virtual environment in /opt/aa)"
                )
    text = unit_text(
        args.what,
        user=args.user,
        program=program,
        args=extra,
        run_as=args.run_as,
        env=env,
        certs=args.certs,
        cert_name=args.cert_name,
        permissions=perms,
        crl=crl,
        config=config,
        host=args.host,
        reads=reads,
    )
    if args.what == "router":
        hosts = [w for i, w in enumerate(extra) if i and extra[i - 1] == "--host"]
        host = hosts[-1] if hosts else _host(args.host, args.certs)
        warning = listener_warning(host, tls=args.certs is not None)
        if warning is not None:
            fail(warning)
    path = unit_path(name, user=args.user, unit_dir=args.unit_dir)
    if args.dry_run:
        print(f"# would write {path}")
        print(text, end="")
        if config is not None:
            kept = " (it exists: kept as it is)" if config.exists() else ""
            print(f"\n# would write {config}{kept}")
            print(config_text, end="")
        return 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if config is not None:
            if config.exists():
                print(f"kept {config} as it is (delete it to have it written again)")
            else:
                config.parent.mkdir(parents=True, exist_ok=True)
                config.write_text(config_text)
                print(f"wrote {config}")
        if perms is not None and not perms.exists():
            perms.parent.mkdir(parents=True, exist_ok=True)
            perms.write_text(PERMISSIONS_TEMPLATE)
            print(f"wrote {perms}: it denies everything; fill it in, then {ctl_of(args)} reload")
    except OSError as exc:
        hint = (
            " (system units need root: try sudo, or --user)"
            if isinstance(exc, PermissionError)
            else ""
        )
        return fail(f"cannot write {path}: {exc}{hint}")
    ctl = ctl_of(args)
    print(f"wrote {path}")
    if args.what == "router" and args.certs is not None and not (args.certs / "crl.pem").exists():
        print(
            f"note: {args.certs / 'crl.pem'} does not exist (a CA made before revocation): the "
            f"unit has no --crl; 'aa certs revoke {args.certs} NAME' writes one, then install again"
        )
    print(f"now run: {ctl} daemon-reload && {ctl} enable --now {name}")
    return 0


def _owner(folder: str) -> str:
    try:
        import pwd

        return pwd.getpwuid(Path(folder).stat().st_uid).pw_name
    except (ImportError, KeyError, OSError):
        return "USER"


def ctl_of(args: argparse.Namespace) -> str:
    return "systemctl --user" if args.user else "systemctl"
