"""The add-in container: add-ins dropped into a running container and changed there, a
crashing add-in beside healthy ones, settings and entry points, and the bundled add-ins
(the quote → ticker quench chain). Intervals are shortened; nothing sleeps."""

from __future__ import annotations

import shutil
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from support import next_event, virtual_time, wait_for

import aa.addins.bundled
from aa.addins import Backoff, Container, ContainerConfig
from aa.router import Router

BUNDLED = Path(aa.addins.bundled.__file__).parent


def write(path: Path, source: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))


def config(router: Router, folder: Path, **kw: Any) -> ContainerConfig:
    settings: dict[str, Any] = {
        "folders": (folder,),
        "routers": (router.endpoint,),
        "poll_interval": 0.05,
        "entry_points": False,
        "data_dir": folder.parent / "data",
        "backoff_base": 0.02,
        "backoff_max": 0.1,
    }
    return ContainerConfig(**{**settings, **kw})


PUBLISH_ONCE = """
    from aa.addins import AddIn

    SETTINGS = {{"greeting": "hello"}}

    class DropIn(AddIn):
        async def start(self, ctx):
            self.ctx = ctx
            (ctx.data_dir / "seen").write_text("{version}")
            await ctx.client.publish({{"Source": ctx.name, "Version": {version},
                                      "Greeting": ctx.settings["greeting"]}})

        async def stop(self):
            await self.ctx.client.publish({{"Source": self.ctx.name, "Stopped": {version}}})
            await self.ctx.client.flush(5)
"""


async def test_addin_dropped_into_a_running_container_then_changed(
    router: Router, tmp_path: Path
) -> None:
    folder = tmp_path / "addins"
    folder.mkdir()
    sub = router.subscribe('Source == "dropin"')
    async with Container(config(router, folder)) as container:
        assert container.status() == {}
        write(folder / "dropin.py", PUBLISH_ONCE.format(version=1))
        event = await next_event(sub)
        assert event.values == {"Source": "dropin", "Version": 1, "Greeting": "hello"}
        assert (tmp_path / "data" / "dropin" / "seen").read_text() == "1"
        # Changed (and given a settings file): the old instance stops, the new one starts.
        write(folder / "dropin.toml", 'greeting = "hej"\n')
        write(folder / "dropin.py", PUBLISH_ONCE.format(version=22))
        seen = [(await next_event(sub)).values]
        while seen[-1].get("Version") != 22:  # a poll may have seen the settings file alone first
            seen.append((await next_event(sub)).values)
        assert seen[0] == {"Source": "dropin", "Stopped": 1}
        assert seen[-1] == {"Source": "dropin", "Version": 22, "Greeting": "hej"}
        assert container.status()["dropin"]["state"] == "running"
        # Removed: stopped.
        (folder / "dropin.py").unlink()
        while (await next_event(sub)).values != {"Source": "dropin", "Stopped": 22}:
            pass
        await wait_for(lambda: "dropin" not in container.status())


async def test_a_crashing_addin_never_takes_the_others_down(router: Router, tmp_path: Path) -> None:
    folder = tmp_path / "addins"
    write(
        folder / "crashy.py",
        """
        import asyncio
        from aa.addins import AddIn

        class Crashy(AddIn):
            async def start(self, ctx):
                ctx.spawn(self.die(ctx))

            async def die(self, ctx):
                await ctx.client.publish({"Crashy": 1})
                raise RuntimeError("boom")
    """,
    )
    write(
        folder / "failstart.py",
        """
        from aa.addins import AddIn

        class FailStart(AddIn):
            async def start(self, ctx):
                raise ValueError("no start for me")
    """,
    )
    write(folder / "broken.py", "def broken(:\n")
    write(
        folder / "healthy" / "__init__.py",
        """
        import asyncio
        from aa.addins import AddIn
        from .beat import Beat

        class Healthy(AddIn):
            async def start(self, ctx):
                ctx.every(ctx.settings["every"], Beat(ctx))
    """,
    )
    write(
        folder / "healthy" / "beat.py",
        """
        class Beat:
            def __init__(self, ctx):
                self.ctx, self.n = ctx, 0

            async def __call__(self):
                self.n += 1
                await self.ctx.client.publish({"Beat": self.n, "Every": self.ctx.settings["every"]})
    """,
    )
    write(folder / "healthy" / "settings.json", '{"every": 0.02}')
    beats = router.subscribe("Beat > 0")
    crashes = router.subscribe("Crashy == 1")
    async with Container(config(router, folder)) as container:
        for _ in range(4):
            await next_event(crashes)  # restarted again and again (with back-off)
        await wait_for(lambda: container.runners["failstart"].starts >= 3)
        status = container.status()
        assert (
            status["broken"]["state"] == "broken"
            and "SyntaxError" in status["broken"]["last_error"]
        )
        assert "boom" in status["crashy"]["last_error"] and status["crashy"]["failures"] >= 3
        assert "no start for me" in status["failstart"]["last_error"]
        assert status["healthy"]["state"] == "running" and status["healthy"]["starts"] == 1
        first = (await next_event(beats)).values["Beat"]
        later = (await next_event(beats)).values
        assert later["Beat"] > first and later["Every"] == 0.02
        # A broken add-in that gets fixed is loaded at the next poll.
        write(
            folder / "broken.py", "from aa.addins import AddIn\n\nclass Fixed(AddIn):\n    pass\n"
        )
        await wait_for(lambda: container.status()["broken"]["state"] == "running")


async def test_entry_point_addins_and_load_rules(
    router: Router, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "site"
    write(
        pkg / "ep_addin_mod.py",
        """
        from aa.addins import AddIn

        SETTINGS = {"word": "default"}

        class Installed(AddIn):
            async def start(self, ctx):
                await ctx.client.publish({"Installed": ctx.settings["word"], "Name": ctx.name})
    """,
    )
    monkeypatch.syspath_prepend(str(pkg))
    folder = tmp_path / "addins"
    write(folder / "installed.toml", 'word = "configured"\n')
    write(folder / "_helper.py", "raise SystemExit('helpers are not add-ins')\n")
    write(
        folder / "two.py",
        """
        from aa.addins import AddIn
        class A(AddIn): pass
        class B(AddIn): pass
    """,
    )
    ep = EntryPoint(name="installed", value="ep_addin_mod:Installed", group="aa.addins")
    sub = router.subscribe("Installed")
    container = Container(config(router, folder, entry_points=True), entry_points=lambda: [ep])
    async with container:
        assert (await next_event(sub)).values == {"Installed": "configured", "Name": "installed"}
        status = container.status()
        assert set(status) == {"installed", "two"}
        assert "exactly one AddIn" in status["two"]["last_error"]


def test_backoff_doubles_caps_and_forgives() -> None:
    b = Backoff(base=0.5, maximum=4.0, stable_after=10.0)
    assert [b.failed(now=float(t)) for t in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    b.started(now=100.0)
    assert b.failed(now=105.0) == 4.0  # ran 5 s: not long enough to be forgiven
    b.started(now=200.0)
    assert b.failed(now=211.0) == 0.5


async def test_bundled_quotes_and_ticker_follow_interest(router: Router, tmp_path: Path) -> None:
    weather = router.subscribe('type == "weather"')
    async with Container(config(router, BUNDLED)) as bundled:
        # The weather is there at once (the latest reading).
        got = await next_event(weather, timeout=10)
        assert {"City", "TemperatureC", "Humidity", "Condition"} == set(got.values)
        await wait_for(
            lambda: all(r.state == "running" for r in bundled.runners.values()), timeout=10
        )
        assert set(bundled.runners) == {"weather", "quotes", "ticker", "laptops", "phones"}
        quotes = bundled.runners["quotes"].instance
        ticker = bundled.runners["ticker"].instance
        assert not quotes.interest.interested and not ticker.interest.interested  # type: ignore[union-attr]
        # Someone wants tickers: the adapter wakes, subscribes to quotes, the quote feed wakes.
        tickers = router.subscribe('type == "ticker"')
        got = await next_event(tickers, timeout=10)
        assert set(got.values) == {"Symbol", "Last", "Ccy"} and got.meta["adapted_from"]
        assert quotes.interest.interested  # type: ignore[union-attr]
        tickers.close()
        await wait_for(lambda: not quotes.interest.interested, timeout=10)  # type: ignore[union-attr]


def test_bundled_copy_runs_from_any_folder(tmp_path: Path) -> None:
    # The bundled add-ins import only `aa...`: a copy of one works from any folder.
    shutil.copy(BUNDLED / "weather.py", tmp_path / "weather.py")
    from aa.addins.loader import load_source, scan_folder, unload

    factory, settings, modname = load_source(scan_folder(tmp_path)["weather"])
    assert settings["speed"] == 1.0 and factory().__class__.__name__ == "Weather"
    unload(modname)


async def test_bundled_laptops_and_phones_publish_their_own_nodes(router: Router) -> None:
    laptop_scans = router.subscribe(
        'type in ("wifi-scan", "bt-scan") and Node.startswith("laptop-")'
    )
    phone_positions = router.subscribe('type == "position"')
    strays = router.subscribe('type == "position" and not Node.startswith("phone-")')
    async with Container(config(router, BUNDLED)):
        scan = await next_event(laptop_scans, timeout=20)
        assert scan.values["Radios"] and {"Id", "Name", "Rssi"} <= set(scan.values["Radios"][0])
        position = await next_event(phone_positions, timeout=20)
        assert {"Node", "Building", "Floor", "X", "Y"} == set(position.values)
    assert strays._queue is not None and strays._queue.qsize() == 0  # laptops report no positions


async def test_a_start_failure_is_one_clear_message(router: Router, tmp_path: Path, caplog) -> None:
    """`start` raises before setting up what `stop` then trips over: the log says "failed to
    start", with the exception and where it happened, once per attempt; not "failed to stop
    cleanly", and no traceback above debug level."""
    folder = tmp_path / "addins"
    write(
        folder / "halfway.py",
        """
        from aa.addins import AddIn

        class Halfway(AddIn):
            async def start(self, ctx):
                raise ValueError("no database at db.example")
                self.conn = object()

            async def stop(self):
                self.conn.close()
    """,
    )
    caplog.set_level("INFO", logger="aa.addins")
    async with Container(config(router, folder)) as container:
        await wait_for(lambda: container.runners["halfway"].starts >= 2)
        status = container.status()["halfway"]
    assert (
        status["last_error"]
        == "failed to start: ValueError: no database at db.example (halfway.py:6)"
    )
    loud = [r for r in caplog.records if r.levelno >= 30 and "halfway" in r.getMessage()]
    assert loud and all(r.exc_info is None for r in loud)
    assert all(
        r.getMessage().startswith(
            "add-in halfway failed to start: ValueError: no database at db.example "
            "(halfway.py:6); restarting in "
        )
        for r in loud
    ), [r.getMessage() for r in loud]


async def test_the_context_names_match_the_docs(router: Router, tmp_path: Path) -> None:
    """README: `ctx` gives a connected client, settings, a logger (`ctx.log`, alias
    `ctx.logger`) and a data folder."""
    folder = tmp_path / "addins"
    write(
        folder / "names.py",
        """
        from aa.addins import AddIn

        class Names(AddIn):
            async def start(self, ctx):
                assert ctx.logger is ctx.log and ctx.log.name == "aa.addins.names"
                names = ("client", "settings", "log", "logger", "data_dir")
                present = sorted(k for k in names if hasattr(ctx, k))
                await ctx.client.publish({"Names": present, "Dir": ctx.data_dir.is_dir()})
    """,
    )
    sub = router.subscribe("Names")
    async with Container(config(router, folder)):
        got = await next_event(sub)
    assert got.values == {"Names": ["client", "data_dir", "log", "logger", "settings"], "Dir": True}


def test_every_runs_work_at_once_then_on_its_period_never_overlapping(tmp_path: Path) -> None:
    """`ctx.every(seconds, work)`: the first run at once, then one per period; a run that
    overruns the period is followed at once, not run twice at the same time; a run that
    raises is the add-in's failure (it is restarted). On a loop of virtual time: the instants
    are exact, whatever the machine's load."""
    import asyncio

    from aa.addins import Context

    period = 0.02
    failures: list[BaseException] = []
    starts: list[float] = []

    async def scenario() -> None:
        failed = asyncio.Event()

        def on_failure(exc: BaseException) -> None:
            failures.append(exc)
            failed.set()

        ctx = Context(name="t", client=None, settings={}, data_dir=tmp_path, on_failure=on_failure)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        running = 0
        slow = asyncio.Event()

        async def work() -> None:
            nonlocal running
            running += 1
            assert running == 1, "two runs at once"
            starts.append(loop.time())
            if len(starts) == 3:
                await slow.wait()  # overruns: the next run must wait for it
            if len(starts) == 5:
                raise RuntimeError("boom")
            running -= 1

        began = loop.time()
        ctx.every(period, work)
        # The third run starts at 2 periods and overruns its period: it ends at 5.
        loop.call_at(began + 5 * period, slow.set)
        await failed.wait()  # the fifth run raised, and the failure was told
        await ctx.cancel_tasks()
        starts[:] = [s - began for s in starts]

    virtual_time(scenario())
    assert starts == pytest.approx([0, period, 2 * period, 5 * period, 6 * period]), starts
    assert [str(f) for f in failures] == ["boom"]
