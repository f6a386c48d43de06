"""A throw-away PostgreSQL server for tests (fixtures `pg_server`, `pg_url`).

The fixtures are loaded for every test by the `support` plugin (tests/conftest.py's
``pytest_plugins``). The server is made once per session:
``initdb`` in a fresh temporary folder, then ``pg_ctl start`` listening only on 127.0.0.1
(a free port, found by binding port 0) and on a Unix socket inside that folder, with trust
authentication for the ``postgres`` user. It is stopped and deleted at the end.

PostgreSQL refuses to run as root, so when the tests run as root the server runs as the
``postgres`` system user (``runuser``), in a folder that user owns. The tests that need it
are skipped, saying why, when PostgreSQL's binaries (``/usr/lib/postgresql/*/bin``, or
``initdb`` on the PATH) or psycopg are missing: ``apt-get install postgresql`` provides them
(the project's ``tests/setup/system-deps.sh`` is the place to list it).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .ports import free_tcp_port

__all__ = ["PgServer", "find_pg_bindir", "pg_server", "pg_url"]

#: Seconds `pg_ctl` waits for the server to start or stop.
PG_CTL_TIMEOUT = 60
_SERVER_USER = "postgres"


def find_pg_bindir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``, newest PostgreSQL first; None if absent."""

    def version(path: str) -> tuple[int, ...]:
        parts = Path(path).parts[-3].split(".")  # /usr/lib/postgresql/<version>/bin/initdb
        return tuple(int(p) for p in parts if p.isdigit())

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version, reverse=True)
    if found:
        return Path(found[0]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


class PgServer:
    """One PostgreSQL cluster in a temporary folder, on 127.0.0.1:`port`."""

    def __init__(self, bindir: Path, root: Path, port: int, run_as: str | None) -> None:
        self.bindir, self.root, self.port, self.run_as = bindir, root, port, run_as
        self.data = root / "data"
        self.logfile = root / "server.log"
        self.running = False
        self._names = itertools.count(1)

    def _cmd(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.run_as is not None:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        proc = subprocess.run(cmd, cwd=self.root, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            log = self.logfile.read_text() if self.logfile.exists() else ""
            raise RuntimeError(
                f"{' '.join(args[:2])} failed: {proc.stderr}{proc.stdout}\n{log[-2000:]}"
            )

    def init(self) -> None:
        self._cmd(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            _SERVER_USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )

    def start(self) -> None:
        """Start (or restart) the server; returns once it accepts connections."""
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} "
            # A test cluster: nothing to gain from flushing to disk.
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._cmd(
            "pg_ctl",
            "start",
            "-D",
            str(self.data),
            "-l",
            str(self.logfile),
            "-w",
            "-t",
            str(PG_CTL_TIMEOUT),
            "-o",
            options,
        )
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast`` ends open connections; ``immediate`` is a crash)."""
        self._cmd(
            "pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w", "-t", str(PG_CTL_TIMEOUT)
        )
        self.running = False

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{_SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its name."""
        import psycopg

        name = f"aa_test_{next(self._names)}"
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=_SERVER_USER, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A running PostgreSQL server for the session (skips when PostgreSQL is missing)."""
    bindir = find_pg_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb, no initdb "
            "on PATH): apt-get install postgresql"
        )
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed: pip install 'aa-mesh[postgres]'")
    run_as = None
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam(_SERVER_USER)
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run PostgreSQL as")
        run_as = _SERVER_USER
    root = Path(tempfile.mkdtemp(prefix="aa-pg-"))  # under /tmp: short socket path
    if run_as is not None:
        os.chown(root, user.pw_uid, user.pw_gid)
    server = PgServer(bindir, root, free_tcp_port(), run_as)
    try:
        server.init()
        server.start()
        yield server
    finally:
        if server.running:
            try:
                server.stop("immediate")
            except RuntimeError:
                pass
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """The SQLAlchemy URL of a fresh, empty database on the session's server."""
    if not pg_server.running:  # a test that stopped it and failed before restarting it
        pg_server.start()
    return pg_server.url(pg_server.create_database())
