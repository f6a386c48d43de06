"""The adapter add-ins: loading mined artefacts and reloading them when they change,
republishing under another schema, radio scans to locations, scans to presence, the loop
guard, and an adapter running on a real router."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from support import next_event

from aa.addins.adapters import (
    ADAPTED_BY,
    ADAPTED_FROM,
    AdapterRunner,
    ArtefactWatch,
    LocationAdapter,
    PresenceAdapter,
    SchemaAdapter,
)
from aa.mesh import Event
from aa.tools.mining import write_artefact

T0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
QUOTE_TICKER = {
    "from": "quote",
    "to": "ticker",
    "confidence": 0.95,
    "attributes": {"StockSymbol": "Symbol", "Price": "Last", "Currency": "Ccy"},
}
TICKER_QUOTE = {
    "from": "ticker",
    "to": "quote",
    "confidence": 0.95,
    "attributes": {"Symbol": "StockSymbol", "Last": "Price", "Ccy": "Currency"},
}


def put(folder: Path, task: str, data: dict) -> None:
    write_artefact(folder, task, data, inputs=["test"], events={})


def quote(**extra: object) -> Event:
    return Event(
        values={"StockSymbol": "ABB", "Price": 45.5, "Currency": "CHF"},
        type="quote",
        id="q1",
        **extra,
    )  # type: ignore[arg-type]


def test_watch_reports_each_new_version_once(tmp_path: Path) -> None:
    watch = ArtefactWatch(tmp_path / "schema")
    assert watch.poll() is None  # nothing mined yet
    put(tmp_path, "schema", {"mappings": []})
    assert watch.poll().version == 1  # type: ignore[union-attr]
    assert watch.poll() is None
    put(tmp_path, "schema", {"mappings": []})
    assert watch.poll().version == 2  # type: ignore[union-attr]
    (tmp_path / "schema" / "current").write_text("v1.json")  # rolled back by hand
    assert watch.poll().version == 1  # type: ignore[union-attr]


def test_schema_adapter_republishes_and_reloads(tmp_path: Path) -> None:
    adapter = SchemaAdapter(tmp_path)
    assert adapter.handle(quote()) == []  # no artefact yet: nothing
    put(tmp_path, "schema", {"mappings": [QUOTE_TICKER]})
    assert adapter.reload() and adapter.version == 1
    assert adapter.pattern() == "type in ('quote',)"
    assert adapter.handle(quote()) == [("ticker", {"Ccy": "CHF", "Last": 45.5, "Symbol": "ABB"})]
    assert adapter.handle(Event(values={"StockSymbol": "ABB"}, type="quote")) == []  # incomplete
    put(
        tmp_path,
        "schema",
        {"mappings": [QUOTE_TICKER, TICKER_QUOTE, {**TICKER_QUOTE, "to": "x", "confidence": 0.1}]},
    )
    assert adapter.reload() and adapter.input_types() == {"quote", "ticker"}
    ticker = Event(values={"Symbol": "NHY", "Last": 60.0, "Ccy": "NOK"}, type="ticker")
    assert adapter.handle(ticker) == [
        ("quote", {"Currency": "NOK", "Price": 60.0, "StockSymbol": "NHY"})
    ]


def test_adapted_events_are_not_adapted_again(tmp_path: Path) -> None:
    put(tmp_path, "schema", {"mappings": [QUOTE_TICKER, TICKER_QUOTE]})
    adapter = SchemaAdapter(tmp_path)
    adapter.reload()
    assert adapter.handle(quote(meta={ADAPTED_BY: "schema"})) == []


def test_a_broken_artefact_keeps_the_loaded_one(tmp_path: Path) -> None:
    put(tmp_path, "schema", {"mappings": [QUOTE_TICKER]})
    adapter = SchemaAdapter(tmp_path)
    adapter.reload()
    put(tmp_path, "schema", {"mappings": [{"from": "quote"}]})  # no "to"
    assert not adapter.reload() and adapter.version == 1
    assert adapter.handle(quote())


LOCATIONS = {
    "scan_types": ["wifi-scan", "bt-scan"],
    "attributes": {"node": "Node", "radios": "Radios"},
    "radios": {
        "ap-1": {"building": "B1", "floor": 2, "x": 10.0, "y": 5.0, "confidence": 0.99},
        "ap-2": {"building": "B1", "floor": 2, "x": 30.0, "y": 5.0, "confidence": 0.99},
        "ap-3": {"building": "B1", "floor": 1, "x": 10.0, "y": 5.0, "confidence": 0.99},
        "ap-weak": {"building": "B2", "floor": 0, "x": 0.0, "y": 0.0, "confidence": 0.2},
    },
}


def scan(node: str, *heard: tuple[str, int], kind: str = "wifi-scan", at: datetime = T0) -> Event:
    radios = [{"Id": rid, "Name": "office", "Rssi": rssi} for rid, rssi in heard]
    return Event(values={"Node": node, "Radios": radios}, type=kind, meta={"time": at})


def test_location_adapter_follows_the_loudest_floor(tmp_path: Path) -> None:
    put(tmp_path, "location", LOCATIONS)
    adapter = LocationAdapter(tmp_path)
    adapter.reload()
    ((kind, loc),) = adapter.handle(
        scan("phone-a", ("ap-1", -45), ("ap-2", -65), ("ap-3", -70), ("ap-weak", -30))
    )
    assert kind == "location" and loc["Node"] == "phone-a"
    assert (loc["Building"], loc["Floor"], loc["Radios"]) == (
        "B1",
        2,
        2,
    )  # ap-weak: too unsure to use
    assert 10.0 <= loc["X"] < 11.0 and loc["Y"] == 5.0 and loc["Confidence"] > 0.9
    assert adapter.handle(scan("phone-a", ("unknown", -40))) == []
    assert adapter.handle(Event(values={"Node": "x", "Radios": "garbage"}, type="wifi-scan")) == []


PRESENCE = {
    "window_seconds": 60,
    "threshold_db": 6.0,
    "floor_dbm": -95.0,
    "min_common": 2,
    "scan_types": ["wifi-scan"],
    "attributes": {"node": "Node", "radios": "Radios"},
}


def test_presence_adapter_publishes_company_changes(tmp_path: Path) -> None:
    put(tmp_path, "presence", PRESENCE)
    adapter = PresenceAdapter(tmp_path)
    adapter.reload()
    room = (("ap-1", -50), ("ap-2", -70), ("ap-3", -80))
    elsewhere = (("ap-1", -85), ("ap-2", -50), ("ap-4", -60))
    assert adapter.handle(scan("a", *room))[0][1]["With"] == []
    ((kind, p),) = adapter.handle(scan("b", ("ap-1", -52), ("ap-2", -68), ("ap-3", -83)))
    assert kind == "presence" and p == {"Node": "b", "With": ["a"], "Window": T0}
    assert adapter.handle(scan("c", *elsewhere))[0][1]["With"] == []
    assert (
        adapter.handle(scan("b", ("ap-1", -50), ("ap-2", -70), ("ap-3", -80))) == []
    )  # same company: quiet
    later = T0 + timedelta(minutes=1)  # a new window: b alone again until a scans in it
    assert adapter.handle(scan("b", *room, at=later))[0][1]["With"] == []
    # Without a time stamp the time passed in is used.
    bare = Event(
        values={"Node": "a", "Radios": [{"Id": k, "Rssi": v} for k, v in room]}, type="wifi-scan"
    )
    assert adapter.handle(bare, now=later.timestamp())[0][1] == {
        "Node": "a",
        "With": ["b"],
        "Window": later,
    }


def test_presence_adapter_uses_the_mined_homes_and_rooms(tmp_path: Path) -> None:
    """The live rule is the mining's: both at their desks, together when the mining put the
    desks in one room, whatever the radios say; one at home and one away never together."""
    desk_a = {"ap-1": -45, "ap-2": -70, "ap-3": -80}
    desk_b = {"ap-1": -70, "ap-2": -50, "ap-3": -75}  # 18.7 dB from a: far by radio
    desk_c = {"ap-1": -48, "ap-2": -72, "ap-3": -84}  # 3.1 dB from a: near by radio
    put(
        tmp_path,
        "presence",
        {
            **PRESENCE,
            "home_threshold_db": 5.0,
            "homes": {"a": desk_a, "b": desk_b, "c": desk_c},
            "rooms": {"a": "B1/0/0", "b": "B1/0/0", "c": "B1/0/1"},
        },
    )
    adapter = PresenceAdapter(tmp_path)
    adapter.reload()
    assert adapter.handle(scan("a", *desk_a.items()))[0][1]["With"] == []
    # Desk-mates, though their radios differ more than the threshold.
    assert adapter.handle(scan("b", *desk_b.items()))[0][1]["With"] == ["a"]
    # The neighbour through the wall, at their own desk: near, but another room.
    assert adapter.handle(scan("c", *desk_c.items()))[0][1]["With"] == []
    # Nodes the mining did not know are away: a visitor standing at a's desk is not with a,
    # and two visitors are together by distance.
    assert adapter.handle(scan("d", *desk_a.items()))[0][1]["With"] == []
    assert adapter.handle(scan("e", ("ap-1", -46), ("ap-2", -71), ("ap-3", -79)))[0][1]["With"] == [
        "d"
    ]
    # c away from home (in a's meeting room, say) and near a visitor: together.
    away = (("ap-1", -60), ("ap-2", -60), ("ap-3", -60))
    later = T0 + timedelta(minutes=1)
    adapter.handle(scan("d", *away, at=later))
    assert adapter.handle(scan("c", *away, at=later))[0][1]["With"] == ["d"]


async def test_runner_republishes_on_a_router_and_reloads(
    tmp_path: Path, client, make_client
) -> None:  # type: ignore[no-untyped-def]
    put(tmp_path, "schema", {"mappings": [QUOTE_TICKER]})
    adapter_client = await make_client(name="schema-adapter")
    tickers = await client.subscribe("type == 'ticker'")
    quotes = await client.subscribe("type == 'quote'")
    async with AdapterRunner(
        SchemaAdapter(tmp_path), adapter_client, reload_interval=3600
    ) as runner:
        publisher = await make_client()
        qid = await publisher.publish(
            {"StockSymbol": "ABB", "Price": 45.5, "Currency": "CHF"}, type="quote"
        )
        ev = await next_event(tickers)
        assert ev.values == {"Symbol": "ABB", "Last": 45.5, "Ccy": "CHF"}
        assert ev.meta[ADAPTED_BY] == "schema" and ev.meta[ADAPTED_FROM] == qid
        await next_event(quotes)  # the original
        # A new artefact maps tickers back; the runner picks it up on its next check.
        put(tmp_path, "schema", {"mappings": [QUOTE_TICKER, TICKER_QUOTE]})
        assert await runner.check() and runner.adapter.version == 2
        await publisher.publish({"Symbol": "TEL", "Last": 130.0, "Ccy": "NOK"}, type="ticker")
        ev = await next_event(quotes)
        assert ev.values == {"StockSymbol": "TEL", "Price": 130.0, "Currency": "NOK"}
        # The adapted ticker was not turned back into a quote (nor that into a ticker...).
        assert runner.published == 2


async def test_schema_adapter_runs_in_the_container(tmp_path: Path, router, client) -> None:  # type: ignore[no-untyped-def]
    from support import wait_for

    from aa.addins import Container, ContainerConfig

    put(tmp_path / "adapters", "schema", {"mappings": [QUOTE_TICKER]})
    folder = tmp_path / "addins"
    folder.mkdir()
    (folder / "schema_adapter.py").write_text(
        "from aa.addins.adapters.addin import SchemaAdapterAddIn as ADDIN\n"
    )
    (folder / "schema_adapter.json").write_text(
        f'{{"adapters": "{tmp_path / "adapters"}", "reload_interval": 3600}}'
    )
    tickers = await client.subscribe("type == 'ticker'")
    config = ContainerConfig(
        folders=(folder,),
        routers=(router.endpoint,),
        entry_points=False,
        data_dir=tmp_path / "data",
    )
    async with Container(config) as container:
        await wait_for(
            lambda: container.status().get("schema_adapter", {}).get("state") == "running",
            timeout=10,
        )
        # Running means started: the adapter has subscribed before its start returned.
        await client.publish(
            {"StockSymbol": "EQNR", "Price": 280.0, "Currency": "NOK"}, type="quote"
        )
        ev = await next_event(tickers)
        assert (
            ev.values == {"Symbol": "EQNR", "Last": 280.0, "Ccy": "NOK"}
            and ev.meta[ADAPTED_BY] == "schema"
        )
