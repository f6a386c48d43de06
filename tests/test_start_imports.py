"""A router loads what its configuration uses, and no more: `aa router --no-http` without a
data folder imports no HTTP API (FastAPI, pydantic, starlette, uvicorn), no SQLAlchemy (no
store), no pyarrow (no event log) and no elementpath (XPath runs in the pattern workers). Each
comes where it is needed: HTTP on brings FastAPI, a data folder SQLAlchemy (the event log's
pyarrow stays in its writer process), an XPath pattern elementpath in the workers. Start-up
CPU is what every `aa router`, every small box and the test suite pay."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from support.waits import patience

from aa.client import AsyncClient
from aa.mesh import PatternSpec

#: The packages whose import is most of a router's start-up CPU.
HEAVY = ("elementpath", "fastapi", "pyarrow", "pydantic", "sqlalchemy", "starlette", "uvicorn")

#: `aa router` as its console script runs it, writing at exit which heavy packages the
#: process had imported.
_AA_ROUTER = f"""\
import atexit, json, os, sys
def _said():
    heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
    with open(os.environ["AA_TEST_MODULES"], "w") as f:
        json.dump(heavy, f)
atexit.register(_said)
from aa.tools.cli import main
sys.argv[0] = "aa"
sys.exit(main())
"""


class Started:
    """A running router: its endpoint, and once stopped, the heavy packages it imported."""

    def __init__(self, endpoint: str, said: Path) -> None:
        self.endpoint = endpoint
        self._said = said

    @property
    def heavy(self) -> set[str]:
        return set(json.loads(self._said.read_text()))


@asynccontextmanager
async def aa_router(tmp_path: Path, *args: str) -> AsyncIterator[Started]:
    said = tmp_path / "heavy.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _AA_ROUTER,
        "router",
        "--port",
        "0",
        "--no-discovery",
        "--name",
        "light",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "AA_TEST_MODULES": str(said)},
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(patience(60)):
            line = (await proc.stdout.readline()).decode()
        m = re.search(r"listening on (127\.0\.0\.1:\d+)", line)
        assert m, line
        started = Started(m.group(1), said)
        yield started
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(patience(30)):
            await proc.wait()
    assert proc.returncode == 0


async def test_a_router_without_http_store_or_log_imports_none_of_them(tmp_path: Path) -> None:
    async with aa_router(tmp_path, "--no-http") as router, AsyncClient(router.endpoint) as c:
        sub = await c.subscribe("x == 1")
        await c.publish({"x": 1})
        async with asyncio.timeout(patience(10)):
            assert (await sub.get()).values == {"x": 1}
    assert router.heavy == set()


async def test_http_on_brings_the_http_api(tmp_path: Path) -> None:
    async with aa_router(tmp_path, "--http-port", "0") as router:
        pass
    assert {"fastapi", "pydantic", "starlette", "uvicorn"} <= router.heavy
    assert not router.heavy & {"sqlalchemy", "pyarrow", "elementpath"}


async def test_a_data_folder_brings_sqlalchemy_and_leaves_pyarrow_to_the_log_writer(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    args = ("--no-http", "--data-dir", str(data))
    async with aa_router(tmp_path, *args) as router, AsyncClient(router.endpoint) as c:
        await c.publish({"x": 1})
    assert "sqlalchemy" in router.heavy
    assert "pyarrow" not in router.heavy  # the event log's writer process has it


async def test_an_xpath_pattern_works_and_its_elementpath_stays_in_the_workers(
    tmp_path: Path,
) -> None:
    """XPath patterns run in the worker processes, which load elementpath before their
    lock-down; the router itself never needs it."""
    async with aa_router(tmp_path, "--no-http") as router, AsyncClient(router.endpoint) as c:
        sub = await c.subscribe(
            PatternSpec(kernel="xpath", format="expr", source="/event/values/t > 100")
        )
        await c.publish({"t": 50})
        await c.publish({"t": 150})
        async with asyncio.timeout(patience(10)):
            assert (await sub.get()).values == {"t": 150}
    assert router.heavy == set()
