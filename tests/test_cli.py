"""The `aa` command line, run as a user would: real processes against a real router."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import wait_for

from aa.client import AsyncClient
from aa.tools.common import parse_scalar

AA = str(Path(sys.executable).with_name("aa"))


async def run_aa(*args: str, timeout: float = 30) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        AA, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    async with asyncio.timeout(timeout):
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.parametrize("command", [[], ["router"], ["send"], ["subscribe"]])
async def test_every_command_has_help(command):
    code, out, err = await run_aa(*command, "--help")
    assert (code, err) == (0, "")
    assert out.startswith(f"usage: aa {' '.join(command)}".rstrip())
    assert {(): "COMMAND", ("router",): "--port"}.get(tuple(command), "--router") in out


def test_value_parsing_rules():
    """Numbers as JSON writes them; anything else stays the text typed (a room `007`)."""
    values = ["3", "2.5", "true", "false", "x", "-7", "1e3", "-0.5E-2", "0"]
    assert [parse_scalar(v) for v in values] == [3, 2.5, True, False, "x", -7, 1000.0, -0.005, 0]
    words = [
        "007",
        "1_000",
        "0x10",
        "2.",
        ".5",
        "+3",
        " 3",
        "nan",
        "inf",
        "1e999",
        "3 ",
        "-",
        "1e3.5",
        "9" * 5000,
    ]
    assert [parse_scalar(v) for v in words] == words
    assert [type(parse_scalar(v)) for v in ["3", "1e3", "007"]] == [int, float, str]


async def test_send_then_subscribe_json_with_types(router):
    proc = await asyncio.create_subprocess_exec(
        AA,
        "subscribe",
        "--router",
        router.endpoint,
        "--json",
        "--count",
        "1",
        "Temperature > 100",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    await wait_for(lambda: len(router.engine) == 1, timeout=20)
    code, out, err = await run_aa(
        "send",
        "--router",
        router.endpoint,
        "--type",
        "reading",
        "Temperature=101",
        "Ratio=2.5",
        "Ok=true",
        "Sensor=lab-1",
        "--json",
        '{"Where": {"floor": 2}}',
    )
    assert code == 0, err
    event_id = out.strip()
    async with asyncio.timeout(20):
        stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    lines = stdout.decode().splitlines()
    assert len(lines) == 1
    ev = json.loads(lines[0])
    assert ev["id"] == event_id and ev["type"] == "reading"
    assert ev["values"] == {
        "Temperature": 101,
        "Ratio": 2.5,
        "Ok": True,
        "Sensor": "lab-1",
        "Where": {"floor": 2},
    }
    assert type(ev["values"]["Temperature"]) is int
    assert set(ev["meta"]) >= {"time", "client", "router", "path"}


async def test_subscribe_with_a_script_file(router, tmp_path):
    script = tmp_path / "alarm.py"
    script.write_text(
        "if Temperature > 100:\n"
        "    if not state.get('high'):\n"
        "        state['high'] = True\n"
        "        forward()\n"
        "else:\n"
        "    state['high'] = False\n"
    )
    proc = await asyncio.create_subprocess_exec(
        AA,
        "subscribe",
        "--router",
        router.endpoint,
        "--script",
        str(script),
        "--count",
        "2",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    await wait_for(lambda: len(router.engine) == 1, timeout=20)
    for t in (101, 102, 99, 105):
        router.publish({"Temperature": t})
    async with asyncio.timeout(20):
        stdout, _ = await proc.communicate()
    assert stdout.decode().split() == ["Temperature=101", "Temperature=105"]


async def test_subscribe_ends_with_one_line_when_the_router_stops_its_pattern_later(
    router, tmp_path
):
    """`aa subscribe --script` of a script that loops: accepted at subscribe, stopped by the
    router on the first event. The command exits with one line saying so (it used to hang)."""
    script = tmp_path / "loop.py"
    script.write_text("while True:\n    pass\n")
    proc = await asyncio.create_subprocess_exec(
        AA,
        "subscribe",
        "--router",
        router.endpoint,
        "--script",
        str(script),
        "--count",
        "1",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        await wait_for(lambda: len(router.engine) == 1, timeout=20)
        router.publish({"x": 1})
        async with asyncio.timeout(20):
            stdout, stderr = await proc.communicate()
    finally:
        if proc.returncode is None:  # (the code before this fix hung: leave no process behind)
            proc.kill()
            await proc.wait()
    err = stderr.decode()
    assert proc.returncode == 1 and stdout == b""
    assert err.startswith("aa subscribe: ") and "time" in err and err.count("\n") == 1, err


async def test_bad_value_and_bad_pattern_give_clear_errors(router):
    code, _, err = await run_aa("send", "--router", router.endpoint, "novalue")
    assert (
        code == 2
        and err.startswith("aa send: value 'novalue' is not NAME=VALUE")
        and err.count("\n") == 1
    )
    code, _, err = await run_aa("subscribe", "--router", router.endpoint, "x >>> (")
    assert (
        code == 1
        and err.startswith("aa subscribe: pattern does not compile")
        and err.count("\n") == 1
    )


@pytest.mark.parametrize("loop", ["uvloop", "asyncio", None])
async def test_aa_router_runs_on_the_console_and_stops_on_sigterm(
    loop: str | None, tmp_path: Path
) -> None:
    # on uvloop by default where it is installed (issue 15: ~10 % more events/s), asyncio on request
    choice = ["--event-loop", loop] if loop else []
    proc = await asyncio.create_subprocess_exec(
        AA,
        "router",
        "--port",
        "0",
        "--name",
        "console",
        "--data-dir",
        str(tmp_path),
        "-v",
        *choice,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(20):
            line = (await proc.stdout.readline()).decode()
            m = re.search(r"listening on (127\.0\.0\.1:\d+)", line)
            assert m, line
            while b"event loop:" not in (said := await proc.stderr.readline()):
                assert said, "no 'event loop' line in the log"
        assert said.decode().rstrip().endswith(f"event loop: {loop or 'uvloop'}")
        async with AsyncClient(m.group(1)) as c:
            sub = await c.subscribe("x == 1")
            await c.publish({"x": 1})
            async with asyncio.timeout(5):
                assert (await sub.get()).values == {"x": 1}
            assert c.router[1] == "console"
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await proc.wait()
    assert proc.returncode == 0


async def test_a_wrong_event_loop_is_one_line() -> None:
    proc = await asyncio.create_subprocess_exec(
        AA,
        "router",
        "--port",
        "0",
        "--no-http",
        "--no-discovery",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "AA_EVENT_LOOP": "tokio"},
    )
    async with asyncio.timeout(20):
        out, err = await proc.communicate()
    assert proc.returncode != 0
    assert (
        err.decode().strip()
        == "aa router: AA_EVENT_LOOP must be one of uvloop, asyncio, not 'tokio'"
    )


async def test_subscribe_needs_lets_a_quenching_publisher_see_a_narrow_pattern(router):
    async with AsyncClient(router.endpoint) as pub:
        quench = await pub.quench({"SnowDepthSensor": True, "SnowDepth": 50}, lambda *change: None)
        proc = await asyncio.create_subprocess_exec(
            AA,
            "subscribe",
            "--router",
            router.endpoint,
            "--needs",
            "SnowDepth",
            "--count",
            "1",
            "SnowDepth == 80",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        await quench.wait_interested(
            timeout=20
        )  # without --needs, SnowDepth == 80 never matches 50
        await pub.publish({"SnowDepthSensor": True, "SnowDepth": 80})
        async with asyncio.timeout(20):
            out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert "SnowDepth=80" in out.decode()


async def test_subscribe_warns_of_a_name_no_event_has_had_and_says_the_tier(router) -> None:
    """Issue 14: `Temprature > 100` is accepted and would never match: the router says so."""
    import asyncio
    import sys
    from pathlib import Path

    router.publish({"Temperature": 20, "Sensor": "lab-1"})
    aa = str(Path(sys.executable).with_name("aa"))
    proc = await asyncio.create_subprocess_exec(
        aa,
        "subscribe",
        "--router",
        router.endpoint,
        "--tier",
        "--count",
        "1",
        "Temprature > 100",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    async with asyncio.timeout(30):
        warning = (await proc.stderr.readline()).decode()
        tier = (await proc.stderr.readline()).decode()
    proc.kill()
    await proc.wait()
    assert "no event has had `Temprature`; did you mean `Temperature`?" in warning
    assert "predicate tier" in tier
