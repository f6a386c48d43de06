"""Storage from the command line, and the durability promise against a real `aa router`
process killed with SIGKILL in the middle of a burst of persisted publishes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import wait_for

from aa.client import AsyncClient, ClientConfig
from aa.mesh import UsageError
from aa.router import EventLogConfig, Router, RouterConfig
from aa.router.caches import cache_key
from aa.tools.cli import build_parser, main
from aa.tools.router_cmd import config_from_args

AA = str(Path(sys.executable).with_name("aa"))


async def run_aa(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        AA, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})}
    )
    async with asyncio.timeout(timeout):
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.fixture
async def drouter(tmp_path: Path) -> AsyncIterator[Router]:
    async with Router(RouterConfig(port=0, data_dir=tmp_path / "data")) as r:
        yield r


HELP = [
    (["send"], "--persist"),
    (["subscribe"], "--since"),
    (["router"], "--store-url"),
    (["cache"], "register"),
    (["cache", "register"], "--max-count"),
    (["cache", "get"], "--client-id"),
    (["cache", "mesh"], "--since"),
]


def test_storage_options_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command, expected in HELP:
        with pytest.raises(SystemExit) as done:
            main([*command, "--help"])
        assert done.value.code == 0 and expected in capsys.readouterr().out, command


async def test_send_persist_then_subscribe_history(drouter: Router) -> None:
    ep = drouter.endpoint
    for depth in (3, 4, 5):
        code, _, err = await run_aa(
            "send",
            "--router",
            ep,
            "--persist",
            "--max-age",
            "3h",
            "--max-count",
            "2",
            "--type",
            "snow",
            f"Depth={depth}",
        )
        assert code == 0, err
    code, out, err = await run_aa(
        "subscribe",
        "--router",
        ep,
        "--history",
        "--since",
        "1h",
        "--count",
        "2",
        "--json",
        "Depth > 0",
    )
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["values"]["Depth"] for e in events] == [4, 5]  # the newest two of type snow
    assert all(e["meta"]["historical"] is True for e in events)


async def test_subscribe_history_from_a_router_without_a_store_says_so() -> None:
    async with Router(RouterConfig(port=0, name="bare")) as router:
        proc = await asyncio.create_subprocess_exec(
            AA,
            "subscribe",
            "--router",
            router.endpoint,
            "--history",
            "--count",
            "1",
            "x == 1",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        await wait_for(lambda: any(s.subscriptions for s in router.sessions), timeout=30)
        router.publish({"x": 1})
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
    assert proc.returncode == 0, err
    (line,) = err.decode().splitlines()  # one line, and the live event still comes
    assert line.startswith("aa subscribe: warning: router bare keeps no store") and (
        "--data-dir" in line
    )
    assert out.decode() == "x=1\n"


BAD = [
    (["--persist", "--max-age=-3h"], "negative"),
    (["--persist", "--max-age", "3 fortnights"], "unknown unit"),
    (["--persist", "--max-count", "0", "--type", "t"], "at least 1"),
    (["--persist", "--max-count", "5"], "needs an event type"),
    (["--max-age", "3h"], "add --persist"),
]


def test_send_refuses_bad_policies_before_sending(capsys: pytest.CaptureFixture[str]) -> None:
    for args, message in BAD:
        code = main(["send", "--router", "127.0.0.1:9", *args, "X=1"])  # nothing listens there
        assert code == 2 and message in capsys.readouterr().err, args


async def test_cache_commands(drouter: Router, tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "AA_CLIENT_ID": ""}
    ep = ["--router", drouter.endpoint]
    code, out, err = await run_aa(
        "cache", "register", *ep, "--max-count", "10", "--timeout", "1h", "x > 1", env=env
    )
    assert code == 0, err
    assert json.loads(out)["max_count"] == 10
    kept = (tmp_path / "config" / "aa" / "client-id").read_text().strip()
    assert cache_key("anonymous", kept) in drouter.caches  # the stable id, made once
    for x in (1, 2, 3):
        drouter.publish({"x": x})
    code, out, err = await run_aa("cache", "get", *ep, "--json", env=env)
    assert code == 0, err
    assert [json.loads(line)["values"]["x"] for line in out.splitlines()] == [2, 3]
    code, out, err = await run_aa("cache", "get", *ep, env=env)
    assert (code, out) == (0, ""), err  # acknowledged by the first get
    code, _, err = await run_aa("cache", "policy", *ep, "--max-count", "0", env=env)
    assert code == 2 and "at least 1" in err
    code, out, err = await run_aa("cache", "mesh", *ep, "--since", "1h", "x > 2", env=env)
    assert code == 0 and out.startswith("(historical) x=3"), (out, err)
    code, out, err = await run_aa("cache", "remove", *ep, env=env)
    assert code == 0 and "removed" in out and cache_key("anonymous", kept) not in drouter.caches
    code, _, err = await run_aa("cache", "get", *ep, "--client-id", "someone-else", env=env)
    assert code == 1 and "aa cache register" in err


async def start_router(data_dir: Path, *extra: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        AA,
        "router",
        "--port",
        "0",
        "--data-dir",
        str(data_dir),
        "--no-http",
        "--no-discovery",
        *extra,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        line = (await proc.stdout.readline()).decode()
    m = re.search(r"listening on (\S+)", line)
    assert m, line
    return proc, m.group(1)


async def test_acknowledged_persisted_events_survive_kill_9_of_the_router(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, endpoint = await start_router(data)
    acked: list[str] = []
    config = ClientConfig(routers=(endpoint,), connect_timeout=1.0, retry_base=0.05, retry_max=0.2)
    pub = AsyncClient(config=config)
    await pub.connect()

    async def burst() -> None:
        i = 0
        while True:
            ids = [
                pub.publish_nowait({"i": i + k}, type="r", meta={"persist": True})
                for k in range(1500)
            ]
            i += len(ids)
            await pub.flush()
            acked.extend(ids)

    task = asyncio.create_task(burst())
    try:
        await wait_for(lambda: len(acked) >= 6000, timeout=30)
        before = list(acked)  # acknowledged before the kill; more may be in flight
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pub.aclose(timeout=0.1)
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    proc, endpoint = await start_router(data)  # the same data folder
    try:
        async with AsyncClient(endpoint) as reader:
            sub = await reader.subscribe("True", history={"since": None})
            got: set[str] = set()
            async with asyncio.timeout(30):
                while not set(before) <= got:
                    ev = await sub.get()
                    assert ev.meta["historical"] is True
                    got.add(ev.id)  # type: ignore[arg-type]
    finally:
        proc.terminate()
        await proc.wait()


def test_event_log_is_on_with_a_data_folder_unless_no_event_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def config(*argv: str) -> RouterConfig:
        return config_from_args(build_parser().parse_args(["router", *argv]), environ={})

    data = ("--data-dir", str(tmp_path))
    assert config(*data).event_log == EventLogConfig() == config(*data, "--event-log").event_log
    assert config(*data, "--no-event-log").event_log is None
    assert config().data_dir is None  # and so no log, whatever event_log says
    with pytest.raises(UsageError, match="needs --data-dir"):
        config("--event-log")
    with pytest.raises(SystemExit):
        main(["router", "--help"])
    assert "(default: on with --data-dir, off without)" in " ".join(capsys.readouterr().out.split())


async def test_aa_router_logs_the_events_it_dispatches_by_default(tmp_path: Path) -> None:
    import pyarrow.dataset as ds

    for flags, logged in (((), True), (("--no-event-log",), False)):
        data = tmp_path / str(logged)
        proc, endpoint = await start_router(data, *flags)
        try:
            async with AsyncClient(endpoint) as c:
                c.publish_nowait({"x": 1}, type="t")
                await c.flush()
        finally:
            proc.terminate()  # a clean stop: the log's last file is closed, its writer ends
            async with asyncio.timeout(30):
                await proc.wait()
        assert proc.returncode == 0
        if logged:
            table = ds.dataset(data / "eventlog", format="parquet", partitioning="hive").to_table()
            assert table.column("type").to_pylist() == ["t"]
        else:
            assert not (data / "eventlog").exists()
