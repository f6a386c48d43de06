"""`aa on`, `aa quench`, `aa container`, `aa service` and `aa router --container`, run as a
user would: real processes against a real router. Nothing sleeps to wait."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import next_event, wait_for

from aa.client import AsyncClient
from aa.router import Router
from aa.tools.cli import main
from aa.tools.on_cmd import event_environment, render_argument
from aa.tools.service_cmd import systemd_quote

AA = str(Path(sys.executable).with_name("aa"))

#: Everything a shell would act on: quotes, separators, substitutions, globs, newlines.
HOSTILE = (
    'it\'s "quoted"; $(touch PWNED) `touch PWNED2` && rm -rf ~ | cat > x\n'
    "second line\t* ? ~ $HOME  end "
)

#: The exec'd program: writes its argv and the AA_ environment to the file named first.
RECORDER = textwrap.dedent("""
    import json, os, sys
    env = {k: v for k, v in os.environ.items() if k.startswith("AA_")}
    with open(sys.argv[1], "w") as f:
        json.dump({"argv": sys.argv[2:], "env": env, "cwd": os.getcwd()}, f)
""")


async def start_aa(*args: str, cwd: Path | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        AA, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd
    )


async def finish(proc: asyncio.subprocess.Process, timeout: float = 30) -> tuple[int, str, str]:
    async with asyncio.timeout(timeout):
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.parametrize(
    "command", [["on"], ["quench"], ["container"], ["service"], ["service", "install"]]
)
def test_new_commands_have_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0 and "usage: aa" in capsys.readouterr().out


def aa_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run `aa` in this process (for commands that touch no router)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


async def test_on_exec_passes_hostile_values_verbatim(router: Router, tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    proc = await start_aa(
        "on",
        "--router",
        router.endpoint,
        "--count",
        "1",
        'Kind == "hostile"',
        "--exec",
        sys.executable,
        "-c",
        RECORDER,
        str(record),
        "{Text}",
        "pre {Text} post",
        "{{Text}}",
        "{Missing}",
        "{N}",
        "{Ok}",
        "{List}",
        "{odd-name.x}",
        "{a: {b}}",
        cwd=tmp_path,
    )
    await wait_for(lambda: len(router.engine) == 1, timeout=20)
    event = router.publish(
        {
            "Kind": "hostile",
            "Text": HOSTILE,
            "N": 3,
            "Ok": True,
            "List": [1, "a b"],
            "odd-name.x": "$(id)",
        },
        type="evil;type",
    )
    assert event is not None
    code, _, err = await finish(proc)
    assert code == 0, err
    assert record.exists(), err
    got = json.loads(record.read_text())
    assert got["argv"] == [
        HOSTILE,
        f"pre {HOSTILE} post",
        "{Text}",
        "",
        "3",
        "true",
        '[1,"a b"]',
        "$(id)",
        "{a: }",
    ]
    env = got["env"]
    assert (
        env["AA_VALUE_TEXT"] == HOSTILE
        and env["AA_VALUE_N"] == "3"
        and env["AA_VALUE_ODD_NAME_X"] == "$(id)"
    )
    assert env["AA_EVENT_ID"] == event.id and env["AA_EVENT_TYPE"] == "evil;type"
    assert json.loads(env["AA_EVENT_JSON"])["values"]["Text"] == HOSTILE
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()


def test_argument_and_environment_rendering() -> None:
    assert render_argument("{A}{B}", {"A": "x y", "B": None}) == "x y"
    assert render_argument("{A.__class__}", {"A": 1}) == ""  # a dotted name, never attribute access
    from aa.mesh import Event

    env = event_environment(
        Event(values={"a b": 1.5}, id="e1"), base={"AA_VALUE_STALE": "x", "PATH": "/bin"}
    )
    assert env["AA_VALUE_A_B"] == "1.5" and "AA_VALUE_STALE" not in env and env["PATH"] == "/bin"
    assert env["AA_EVENT_TYPE"] == "" and env["AA_EVENT_ID"] == "e1"


async def test_on_exec_refuses_a_missing_program(router: Router) -> None:
    code, _, err = await finish(
        await start_aa("on", "--router", router.endpoint, "True", "--exec", "no-such-program-x")
    )
    assert code == 127 and "no-such-program-x" in err


async def test_on_log_writes_the_system_log(router: Router, tmp_path: Path) -> None:
    path = tmp_path / "log.sock"  # a fake /dev/log
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    try:
        proc = await start_aa(
            "on",
            "--router",
            router.endpoint,
            "--count",
            "2",
            "--log",
            "--log-socket",
            str(path),
            "Alarm > 0",
        )
        await wait_for(lambda: len(router.engine) == 1, timeout=20)
        first = router.publish({"Alarm": 1, "Where": "lab\nline two"}, type="alarm")
        router.publish({"Alarm": 2})
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(20):
            grams = [(await loop.sock_recv(sock, 65536)).decode() for _ in range(2)]
        code, _, err = await finish(proc)
        assert code == 0, err
    finally:
        sock.close()
    m = re.fullmatch(r"<14>aa-on\[(\d+)\]: alarm (\S+) (.*)\x00", grams[0])
    assert m, grams[0]  # <14>: facility user, priority info, as logger(1) writes
    assert int(m.group(1)) == proc.pid and m.group(2) == first.id  # type: ignore[union-attr]
    assert json.loads(m.group(3)) == {
        "Alarm": 1,
        "Where": "lab\nline two",
    }  # one line, newline escaped
    assert grams[1].startswith("<14>aa-on[") and " - " in grams[1]


async def test_quench_command_shows_interest_appearing_and_going(router: Router) -> None:
    proc = await start_aa(
        "quench",
        "--router",
        router.endpoint,
        "--json",
        "--count",
        "2",
        "--type",
        "snow",
        "SnowDepthSensor=true",
        "SnowDepth=50",
    )
    await wait_for(lambda: len(router.quench.table) == 1, timeout=20)
    sub = router.subscribe("SnowDepth == 80  # needs: SnowDepth")
    await wait_for(lambda: router.quench.counters["notices"] == 1)  # told "+", now take it away
    sub.close()
    code, out, err = await finish(proc)
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(x["interested"], x["any"], x["router"]) for x in lines] == [
        (True, True, router.id),
        (False, False, router.id),
    ]
    # --wait: exits 0 once someone is interested.
    waiting = await start_aa(
        "quench", "--router", router.endpoint, "--wait", "--timeout", "20", "X=1"
    )
    await wait_for(lambda: len(router.quench.table) == 1, timeout=20)
    keep = router.subscribe("X > 0")
    code, _, err = await finish(waiting)
    assert code == 0, err
    keep.close()


def test_service_install_writes_units(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = aa_here(
        capsys,
        "service",
        "install",
        "router",
        "--unit-dir",
        str(tmp_path),
        "--env",
        "AA_DISCOVERY_INTERFACES=eth0",
        "--run-as",
        "aa",
    )
    assert code == 0, err
    unit = (tmp_path / "aa-router.service").read_text()
    assert f"ExecStart={AA} router --config {tmp_path / 'aa-router.toml'}\n" in unit
    settings = (tmp_path / "aa-router.toml").read_text()
    # Loopback unless --host; discovery left to the unit's AA_DISCOVERY_INTERFACES.
    assert settings.endswith('host = "127.0.0.1"\ndata-dir = "${STATE_DIRECTORY}"\n')
    for line in (
        "[Service]",
        "Restart=on-failure",
        "StateDirectory=aa",
        "User=aa",
        "Environment=AA_DISCOVERY_INTERFACES=eth0",
        "WantedBy=multi-user.target",
    ):
        assert line in unit.splitlines()
    assert "systemctl daemon-reload" in out
    code, out, err = aa_here(
        capsys,
        "service",
        "install",
        "container",
        "--user",
        "--unit-dir",
        str(tmp_path),
        "--name",
        "office",
        "--args",
        "'/srv/my add-ins' --bundled",
    )
    assert code == 0, err
    unit = (tmp_path / "office.service").read_text()
    assert (
        f'ExecStart={AA} container "/srv/my add-ins" --bundled\n' in unit
        and "WantedBy=default.target" in unit
    )
    code, out, _ = aa_here(
        capsys,
        "service",
        "install",
        "container",
        "--dry-run",
        "--unit-dir",
        str(tmp_path / "none"),
        "--user",
    )
    assert (
        code == 0
        and "ExecStart=" in out
        and "%h/.config/aa/addins" in out
        and not (tmp_path / "none").exists()
    )
    assert systemd_quote('a"b $c') == '"a\\"b $$c"'


ADDIN = """
    from aa.addins import AddIn

    class Beacon(AddIn):
        async def start(self, ctx):
            ctx.every(0.05, lambda: ctx.client.publish({"FromAddIn": ctx.name}))
"""


async def test_container_command_hosts_a_folder(router: Router, tmp_path: Path) -> None:
    (tmp_path / "addins").mkdir()
    (tmp_path / "addins" / "beacon.py").write_text(textwrap.dedent(ADDIN))
    sub = router.subscribe("FromAddIn")
    proc = await start_aa(
        "container",
        "--router",
        router.endpoint,
        "--no-entry-points",
        "--poll",
        "0.1",
        "--data-dir",
        str(tmp_path / "data"),
        str(tmp_path / "addins"),
    )
    try:
        assert (await next_event(sub, timeout=20)).values == {"FromAddIn": "beacon"}
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = await finish(proc)
    assert code == 0, err
    assert "hosting beacon" in out


async def test_router_hosts_add_ins_in_its_own_process(tmp_path: Path) -> None:
    (tmp_path / "addins").mkdir()
    (tmp_path / "addins" / "beacon.py").write_text(textwrap.dedent(ADDIN))
    proc = await start_aa(
        "router",
        "--port",
        "0",
        "--no-http",
        "--no-discovery",
        "--data-dir",
        str(tmp_path / "d"),
        "--container",
        str(tmp_path / "addins"),
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(20):
            line = (await proc.stdout.readline()).decode()
        m = re.search(r"listening on (127\.0\.0\.1:\d+)", line)
        assert m, line
        async with AsyncClient(m.group(1)) as c:
            sub = await c.subscribe("FromAddIn")
            assert (await next_event(sub, timeout=20)).values == {"FromAddIn": "beacon"}
    finally:
        proc.send_signal(signal.SIGTERM)
        code, _, err = await finish(proc)
    assert code == 0, err
    assert (tmp_path / "d" / "addins" / "beacon").is_dir()
