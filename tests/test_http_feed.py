"""HTTP clients and their feeds, in-process: registration, patterns, the Atom/JSON feed,
paging, acknowledgement, conditional requests, tokens and keep-alive."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
from http_helpers import Clock, bearer, open_api, register
from lxml import etree

from aa.http_api import event_from_content
from aa.mesh import to_json

ATOM = "{http://www.w3.org/2005/Atom}"
AA = "{urn:aa:atom:1}"
XHTML = "{http://www.w3.org/1999/xhtml}"
JSON = {"Accept": "application/json"}


async def feed_json(http: httpx.AsyncClient, c: dict[str, Any], **params: Any) -> dict[str, Any]:
    r = await http.get(
        f"/clients/{c['id']}/feed", params=params, headers={**bearer(c["token"]), **JSON}
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def values_of(page: dict[str, Any]) -> list[Any]:
    return [e["event"]["values"]["i"] for e in page["entries"]]


async def test_feed_holds_the_matching_events_as_atom_with_exact_values() -> None:
    when = datetime(2026, 3, 1, 8, 0, 0, 5, tzinfo=UTC)
    async with open_api() as (router, http):
        c = await register(http, "Temperature > 100", name="phone")
        router.publish({"Temperature": 99})
        router.publish({"Temperature": 101, "x": 1.0, "b": b"\x00\x01", "t": when}, type="reading")
        r = await http.get(f"/clients/{c['id']}/feed", headers=bearer(c["token"]))
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/atom+xml")
        feed = etree.fromstring(r.content)
        assert feed.findtext(f"{ATOM}title") == "Aa events for phone"
        (entry,) = feed.findall(f"{ATOM}entry")
        event = event_from_content(entry.findtext(f"{AA}event"))
        assert event.values == {"Temperature": 101, "x": 1.0, "b": b"\x00\x01", "t": when}
        assert type(event.values["x"]) is float and event.type == "reading"
        assert entry.findtext(f"{ATOM}id") == f"urn:aa:event:{event.id}"
        cats = {(k.get("scheme"), k.get("term")) for k in entry.findall(f"{ATOM}category")}
        assert cats == {("urn:aa:type", "reading"), ("urn:aa:pattern", "p1")}
        assert entry.findtext(f"{ATOM}updated").endswith("Z")
        assert "Temperature = 101 (int)" in entry.findtext(f"{ATOM}summary")
        # For people: the values, the type, the time and the publisher, as XHTML.
        content = entry.find(f"{ATOM}content")
        assert content.get("type") == "xhtml"
        text = "".join(content.itertext())
        for words in (
            "Temperature: 101 (int)",
            "x: 1.0 (float)",
            "b: <2 bytes> (bytes)",
            "t: 2026-03-01T08:00:00",
            "Type reading",
            f"published by local:{router.id}",
        ):
            assert words in text, (words, text)
        assert entry.findtext(f"{ATOM}author/{ATOM}name") == f"local:{router.id}"
        # For programs: the entry's link is the event as typed JSON.
        link = entry.find(f"{ATOM}link[@rel='alternate']").get("href")
        one = await http.get(link, headers=bearer(c["token"]))
        assert (
            one.status_code == 200
            and one.json()["event"]["id"] == event.id
            and one.json()["patterns"] == ["p1"]
        )
        assert (await http.get(link)).status_code == 401
        await http.post(
            f"/clients/{c['id']}/ack", json={"event": event.id}, headers=bearer(c["token"])
        )
        gone = await http.get(link, headers=bearer(c["token"]))
        assert gone.status_code == 404 and gone.json()["error"] == "unknown-event"


async def test_http_publishers_are_named_by_address_and_strange_values_stay_exact() -> None:
    async with open_api() as (router, http):
        c = await register(http, "True")
        odd = "<b>&amp;</b> \x01 \ud800 é"
        body = json.dumps({"values": {"s": odd}, "type": "<script>"})  # ASCII: \ud800 escaped
        r = await http.post("/events", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 201
        feed = etree.fromstring(
            (await http.get(f"/clients/{c['id']}/feed", headers=bearer(c["token"]))).content
        )
        (entry,) = feed.findall(f"{ATOM}entry")
        assert entry.findtext(f"{ATOM}author/{ATOM}name") == "HTTP client at 127.0.0.1:40000"
        assert event_from_content(entry.findtext(f"{AA}event")).values == {
            "s": odd
        }  # exact, surrogate and all
        div = entry.find(f"{ATOM}content/{XHTML}div")
        assert div.find(f".//{XHTML}script") is None and "<script>" in "".join(
            div.itertext()
        )  # text, not markup


async def test_several_patterns_make_one_feed_in_arrival_order_tagged_by_pattern() -> None:
    async with open_api() as (router, http):
        c = await register(http, "i % 2 == 0", "i % 3 == 0")
        for i in range(1, 13):
            router.publish({"i": i})
        page = await feed_json(http, c)
        assert values_of(page) == [2, 3, 4, 6, 8, 9, 10, 12]
        tags = {e["event"]["values"]["i"]: e["patterns"] for e in page["entries"]}
        assert (
            tags[6] == ["p1", "p2"]
            and tags[12] == ["p1", "p2"]
            and tags[3] == ["p2"]
            and tags[4] == ["p1"]
        )


async def test_pages_chain_by_next_links_and_lose_or_repeat_nothing() -> None:
    async with open_api() as (router, http):
        c = await register(http, "i % 2 == 0", "i % 3 == 0", "i > 20")
        for i in range(1, 31):
            router.publish({"i": i})
        expected = [i for i in range(1, 31) if i % 2 == 0 or i % 3 == 0 or i > 20]
        seen: list[int] = []
        url: str | None = f"/clients/{c['id']}/feed?limit=3"
        pages = 0
        while url:
            r = await http.get(url, headers=bearer(c["token"]))
            feed = etree.fromstring(r.content)
            for entry in feed.findall(f"{ATOM}entry"):
                seen.append(event_from_content(entry.findtext(f"{AA}event")).values["i"])
            links = {ln.get("rel"): ln.get("href") for ln in feed.findall(f"{ATOM}link")}
            assert links["first"].endswith("/feed?limit=3")
            url = links.get("next")
            pages += 1
            assert pages < 30
        assert seen == expected and pages > 2


async def test_ack_drops_what_was_handled_and_after_polls_only_what_is_new() -> None:
    async with open_api() as (router, http):
        c = await register(http, "True")
        for i in range(5):
            router.publish({"i": i})
        page = await feed_json(http, c)
        assert values_of(page) == [0, 1, 2, 3, 4] and not page["more"]
        router.publish({"i": 5})
        newer = await feed_json(http, c, after=page["cursor"])  # a phone polling on
        assert values_of(newer) == [5]
        assert values_of(await feed_json(http, c)) == [0, 1, 2, 3, 4, 5]  # nothing acknowledged yet
        r = await http.post(
            f"/clients/{c['id']}/ack", json={"cursor": page["cursor"]}, headers=bearer(c["token"])
        )
        assert r.status_code == 200 and r.json()["cursor"] == page["cursor"]
        assert values_of(await feed_json(http, c)) == [5]
        last_id = newer["entries"][0]["event"]["id"]
        r = await http.post(
            f"/clients/{c['id']}/ack", json={"event": last_id}, headers=bearer(c["token"])
        )
        assert r.status_code == 200
        assert values_of(await feed_json(http, c)) == []
        bad = await http.post(f"/clients/{c['id']}/ack", json={}, headers=bearer(c["token"]))
        assert bad.status_code == 422


async def test_ack_by_event_id_covers_every_pattern_up_to_that_event() -> None:
    """Two patterns, the acknowledged event taken by one of them only: the other's earlier
    entries are acknowledged too, and the answer is that event's cursor."""
    async with open_api() as (router, http):
        c = await register(http, 'type == "k3" and N > 100', 'type == "k3"')
        for n in (101, 2, 3):
            router.publish({"N": n}, type="k3")
        page = await feed_json(http, c)
        assert [e["event"]["values"]["N"] for e in page["entries"]] == [101, 2, 3]
        two = page["entries"][1]["event"]["id"]
        r = await http.post(
            f"/clients/{c['id']}/ack", json={"event": two}, headers=bearer(c["token"])
        )
        assert r.status_code == 200
        left = await feed_json(http, c)
        assert [e["event"]["values"]["N"] for e in left["entries"]] == [3]
        assert r.json()["cursor"] > 0
        after = await feed_json(http, c, after=r.json()["cursor"])
        assert [e["event"]["values"]["N"] for e in after["entries"]] == [3]
        unknown = await http.post(
            f"/clients/{c['id']}/ack", json={"event": "no-such-id"}, headers=bearer(c["token"])
        )
        assert unknown.status_code == 200
        assert [e["event"]["values"]["N"] for e in (await feed_json(http, c))["entries"]] == [3]


async def test_etag_and_last_modified_answer_304_until_the_feed_changes() -> None:
    clock = Clock()
    async with open_api(clock=clock) as (router, http):
        c = await register(http, "True")
        url, auth = f"/clients/{c['id']}/feed", bearer(c["token"])
        router.publish({"i": 1})
        first = await http.get(url, headers=auth)
        etag, modified = first.headers["etag"], first.headers["last-modified"]
        assert first.headers["vary"] == "Accept, Authorization"
        for method in ("GET", "HEAD"):
            again = await http.request(method, url, headers={**auth, "If-None-Match": etag})
            assert (
                again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
            )
        assert (
            await http.get(url, headers={**auth, "If-Modified-Since": modified})
        ).status_code == 304
        assert (
            await http.get(url, headers={**auth, "If-None-Match": '"other"'})
        ).status_code == 200
        router.publish({"i": 2})  # changed within the same second: the date must still move
        changed = await http.get(url, headers={**auth, "If-None-Match": etag})
        assert changed.status_code == 200 and changed.headers["etag"] != etag
        assert (
            await http.get(url, headers={**auth, "If-Modified-Since": modified})
        ).status_code == 200
        assert changed.headers["last-modified"] != modified
        as_json = await http.get(
            url, headers={**auth, **JSON, "If-None-Match": changed.headers["etag"]}
        )
        assert as_json.status_code == 200  # another representation, another tag


async def test_tokens_guard_everything_about_a_client() -> None:
    async with open_api() as (router, http):
        a = await register(http, "True")
        b = await register(http, "True")
        feed = f"/clients/{a['id']}/feed"
        r = await http.get(feed)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert (await http.get(feed, headers=bearer("x" * 43))).status_code == 401
        assert (await http.get(feed, headers=bearer(b["token"]))).status_code == 401
        assert (await http.get(feed, headers={"Authorization": "Token abc"})).status_code == 401
        for method, path in [
            ("GET", ""),
            ("DELETE", ""),
            ("POST", "/patterns"),
            ("DELETE", "/patterns/p1"),
            ("POST", "/ack"),
            ("PUT", "/policy"),
            ("GET", "/patterns"),
        ]:
            r = await http.request(
                method, f"/clients/{a['id']}{path}", json={"source": "True", "cursor": 1}
            )
            assert r.status_code == 401, (method, path)
        basic = httpx.BasicAuth(a["id"], a["token"])
        assert (await http.get(feed, auth=basic)).status_code == 200
        assert (await http.get(feed, auth=httpx.BasicAuth(b["id"], b["token"]))).status_code == 401
        assert (
            await http.get("/clients/nobody/feed", headers=bearer(a["token"]))
        ).status_code == 404


async def test_polling_is_the_keepalive_and_a_silent_client_goes() -> None:
    clock = Clock()
    async with open_api(clock=clock) as (router, http):
        c = await register(http, "True", keepalive=100)
        for _ in range(5):  # 5 x 60 s > 100 s, but each poll pushes the end back
            clock.advance(60)
            assert (
                await http.get(f"/clients/{c['id']}/feed", headers=bearer(c["token"]))
            ).status_code == 200
        clock.advance(101)
        r = await http.get(f"/clients/{c['id']}/feed", headers=bearer(c["token"]))
        # the token names its caller on every route: a dead client's is a bad credential
        assert r.status_code == 401 and "expired" in r.json()["message"]
        assert f"http:{c['id']}:p1" not in router.caches  # its cache went too


async def test_a_phone_offline_for_a_day_gets_what_its_policy_kept() -> None:
    clock = Clock()
    async with open_api(clock=clock) as (router, http):
        c = await register(http, "True", policy={"max_count": 3}, keepalive="2d")
        page = await feed_json(http, c)
        for i in range(10):
            router.publish({"i": i})
        clock.advance(24 * 3600)
        back = await feed_json(http, c, after=page["cursor"])
        assert values_of(back) == [7, 8, 9]


async def test_patterns_come_and_go() -> None:
    async with open_api() as (router, http):
        c = await register(http)
        auth = bearer(c["token"])
        router.publish({"i": 0})
        r = await http.post(f"/clients/{c['id']}/patterns", json={"source": "i > 0"}, headers=auth)
        assert (
            r.status_code == 201
            and r.json()["id"] == "p1"
            and r.headers["location"].endswith("/patterns/p1")
        )
        router.publish({"i": 1})
        assert values_of(await feed_json(http, c)) == [1]
        listed = (await http.get(f"/clients/{c['id']}/patterns", headers=auth)).json()
        assert listed == [{"id": "p1", "source": "i > 0", "kernel": "python", "format": "expr"}]
        assert (
            await http.delete(f"/clients/{c['id']}/patterns/p1", headers=auth)
        ).status_code == 204
        assert (
            await http.delete(f"/clients/{c['id']}/patterns/p1", headers=auth)
        ).status_code == 404
        router.publish({"i": 2})
        assert values_of(await feed_json(http, c)) == []
        bad = await http.post(f"/clients/{c['id']}/patterns", json={"source": "i >"}, headers=auth)
        assert bad.status_code == 422 and bad.json()["error"] == "pattern"


async def test_client_resource_policy_clear_and_delete() -> None:
    async with open_api() as (router, http):
        c = await register(http, "True", name="phone", policy={"max_age": 60, "max_count": 5})
        auth = bearer(c["token"])
        assert c["policy"] == {"max_age": 60.0, "max_count": 5} and c["token"]
        router.publish({"i": 1})
        info = (await http.get(f"/clients/{c['id']}", headers=auth)).json()
        assert info["name"] == "phone" and info["queued"] == {"p1": 1} and "token" not in info
        r = await http.put(f"/clients/{c['id']}/policy", json={"max_count": 10}, headers=auth)
        assert r.status_code == 200 and r.json()["policy"] == {"max_age": None, "max_count": 10}
        assert (await http.delete(f"/clients/{c['id']}/feed", headers=auth)).status_code == 204
        assert values_of(await feed_json(http, c)) == []
        assert (await http.delete(f"/clients/{c['id']}", headers=auth)).status_code == 204
        assert (await http.get(f"/clients/{c['id']}", headers=auth)).status_code == 401
        assert f"http:{c['id']}:p1" not in router.caches


async def test_json_feed_carries_typed_values_and_the_cursor() -> None:
    async with open_api() as (router, http):
        c = await register(http, "True")
        router.publish({"i": 1, "b": b"\xff", "f": 2.0})
        page = await feed_json(http, c)
        assert (
            page["client"] == c["id"]
            and page["more"] is False
            and page["links"]["first"].endswith("/feed")
        )
        (entry,) = page["entries"]
        assert entry["event"]["values"] == to_json({"i": 1, "b": b"\xff", "f": 2.0})
        r = await http.get(f"/clients/{c['id']}/feed", headers=bearer(c["token"]))
        assert r.headers["aa-cursor"] == str(page["cursor"])
        by_url = await http.get(
            f"/clients/{c['id']}/feed", params={"format": "json"}, headers=bearer(c["token"])
        )
        assert (
            by_url.headers["content-type"] == "application/json"
            and by_url.json()["entries"] == page["entries"]
        )
        assert by_url.json()["links"]["self"].endswith("?format=json")


def test_last_modified_never_repeats_a_date_for_changed_content() -> None:
    from aa.http_api.clients import HttpClient, HttpClients

    client = HttpClient(
        id="c",
        name=None,
        policy=None,
        keepalive=60.0,
        token_hash=b"",
        created=datetime.now(UTC),
        last_seen=0.0,
    )
    when = 1_000.5
    first = HttpClients.conditional(client, ("atom", 0), '"a"', when)
    assert HttpClients.conditional(client, ("atom", 0), '"a"', when + 5) == first  # unchanged
    second = HttpClients.conditional(client, ("atom", 0), '"b"', when)  # changed, same second
    assert second > first
    for k in range(1, 10):  # enough new variants to forget the first ones
        HttpClients.conditional(client, ("atom", k), f'"{k}"', when)
    again = HttpClients.conditional(client, ("atom", 0), '"c"', when)
    assert again > second  # a forgotten variant is dated after every date given out


async def test_an_event_rendered_once_serves_every_feed_with_its_own_links_and_patterns() -> None:
    async with open_api() as (router, http):
        a = await register(http, "True")
        b = await register(http, "i > 0", "True")
        router.publish({"i": 1})
        entries = []
        for c in (a, b):
            feed = etree.fromstring(
                (await http.get(f"/clients/{c['id']}/feed", headers=bearer(c["token"]))).content
            )
            (entry,) = feed.findall(f"{ATOM}entry")
            entries.append(entry)
        body = [etree.tostring(e.find(f"{ATOM}content")) for e in entries]
        assert body[0] == body[1]  # the shared part
        links = [e.find(f"{ATOM}link").get("href") for e in entries]
        assert (
            f"/clients/{a['id']}/" in links[0] and f"/clients/{b['id']}/" in links[1]
        )  # each client's own
        terms = [
            [k.get("term") for k in e.findall(f"{ATOM}category[@scheme='urn:aa:pattern']")]
            for e in entries
        ]
        assert terms == [["p1"], ["p1", "p2"]]


def test_entry_cache_keeps_a_bounded_number_and_never_answers_for_another_event() -> None:
    from aa.http_api.atom import EntryCache
    from aa.mesh import Event

    now = datetime(2026, 1, 1, tzinfo=UTC)
    cache = EntryCache(size=3)
    events = [Event(values={"i": i}, id=f"e-{i}", meta={"time": now}) for i in range(5)]
    for e in events:
        cache.parts(e, now)
    assert len(cache) == 3
    impostor = Event(values={"i": "other"}, id="e-4", meta={"time": now})  # same id, another object
    head, link, body = cache.parts(impostor, now)
    assert b"other" in body and b"other" not in cache.parts(events[3], now)[2]
    big = Event(values={"s": "x" * 100_000}, id="big", meta={"time": now})  # rendered, not kept
    assert b"x" * 1000 in cache.parts(big, now)[2] and len(cache) == 3
    assert (
        cache.chars
        == sum(len(h) + len(k) + len(b) for _, h, k, b in cache._parts.values())
        < 20_000
    )


async def test_bad_feed_queries_get_the_routes_422() -> None:
    async with open_api() as (router, http):
        c = await register(http, "True")
        url, auth = f"/clients/{c['id']}/feed", bearer(c["token"])
        for query in (
            {"after": "-1"},
            {"after": "x"},
            {"after": "9" * 30},
            {"limit": "0"},
            {"limit": "1001"},
            {"format": "xml"},
            {"limit": ""},
        ):
            r = await http.get(url, params=query, headers=auth)
            assert r.status_code == 422 and r.json()["error"] == "invalid-request", (query, r.text)
            assert next(iter(query)) in r.json()["message"]
        ok = await http.get(
            url,
            params={"after": "0", "limit": "1000", "format": "atom", "other": "x"},
            headers=auth,
        )
        assert ok.status_code == 200
        assert (await http.head(url, headers=auth)).status_code == 200
        r = await http.get(
            f"/clients/{c['id']}/feed/x", headers=auth
        )  # not the feed: FastAPI's 404
        assert r.status_code == 404 and r.json()["error"] == "not-found"


def test_a_hostile_host_in_the_links_cannot_break_the_feed_markup() -> None:
    from aa.http_api.atom import render_atom
    from aa.mesh import Event

    now = datetime(2026, 1, 1, tzinfo=UTC)
    event = Event(values={"i": 1}, id="r-1", meta={"time": now})
    base = "http://h\"'<x>&y/clients/c/events/"  # the Host header is the caller's text
    body = render_atom(
        feed_id="f",
        title="t",
        updated=now,
        author="a",
        links=[("self", base)],
        entries=[(event, ("p1",))],
        event_url=base,
    )
    feed = etree.fromstring(body)  # well-formed
    assert feed.find(f"{ATOM}entry/{ATOM}link").get("href") == base + "r-1"
    assert feed.find(f"{ATOM}entry/x") is None


async def test_each_host_gets_its_own_links_and_made_up_hosts_are_not_hoarded() -> None:
    from aa.http_api import routes_clients

    async with open_api(names=None) as (router, http):  # any Host: the links follow it
        c = await register(http, "True")
        url, auth = f"/clients/{c['id']}/feed", bearer(c["token"])
        router.publish({"i": 1}, id="ev/1")
        for host in (
            "a.example",
            "b.example:8080",
            "a.example",
        ):  # the base URL is remembered per host
            feed = etree.fromstring((await http.get(url, headers={**auth, "Host": host})).content)
            assert (
                feed.find(f"{ATOM}link[@rel='self']").get("href")
                == f"http://{host}/clients/{c['id']}/feed"
            )
            link = feed.find(f"{ATOM}entry/{ATOM}link").get("href")
            assert (
                link == f"http://{host}/clients/{c['id']}/events/ev%2F1"
            )  # the id, percent-encoded
        for k in range(3 * routes_clients._MAX_BASES):  # a stranger's made-up hosts
            assert (
                await http.get(url, headers={**auth, "Host": f"h{k}.example"})
            ).status_code == 200
        assert len(routes_clients._BASES) <= routes_clients._MAX_BASES
        same = await http.get(url, headers={**auth, "Host": "a.example"})
        assert f"http://a.example/clients/{c['id']}/feed" in same.text
