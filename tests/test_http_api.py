"""The HTTP API in-process (httpx.ASGITransport): publishing, the mesh, history, streams,
the address wall, and bad input that must get a clear 4xx and leave the router alone."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from http_helpers import bearer, open_api, register
from support import next_event

from aa.http_api import HttpConfig, HttpEndpoint
from aa.mesh import UsageError, to_json


async def test_publish_keeps_value_types_end_to_end() -> None:
    when = datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)
    values = {
        "n": 3,
        "x": 2.0,
        "s": "hi",
        "b": b"\x00\xff",
        "t": when,
        "l": [1, 2.5, None],
        "m": {"$odd": True},
    }
    async with open_api() as (router, http):
        sub = router.subscribe("True")
        r = await http.post(
            "/events", json={"values": to_json(values), "type": "reading", "meta": {"k": 1}}
        )
        assert r.status_code == 201, r.text
        event = await next_event(sub)
        assert r.json() == {"id": event.id, "duplicate": False}
        assert event.values == values and event.type == "reading" and event.meta["k"] == 1
        assert type(event.values["n"]) is int and type(event.values["x"]) is float
        assert event.meta["client"] == "http" and event.meta["address"].startswith("127.0.0.1:")


async def test_a_retried_publish_with_the_same_id_is_not_sent_twice() -> None:
    async with open_api() as (router, http):
        first = await http.post("/events", json={"values": {"a": 1}, "id": "retry-1"})
        again = await http.post("/events", json={"values": {"a": 1}, "id": "retry-1"})
        assert first.status_code == 201 and again.status_code == 200
        # the same id both times: the one the event travels under (the proposed id, scoped)
        assert again.json() == {"id": first.json()["id"], "duplicate": True}
        assert first.json()["id"].endswith("-retry-1")


async def test_publisher_cannot_forge_router_meta() -> None:
    async with open_api() as (router, http):
        sub = router.subscribe("True")
        await http.post(
            "/events", json={"values": {}, "meta": {"client": "someone-else", "ttl": 999}}
        )
        event = await next_event(sub)
        assert event.meta["client"] == "http" and event.meta["ttl"] != 999


async def test_health_mesh_docs_and_monitor() -> None:
    async with open_api() as (router, http):
        health = (await http.get("/health")).json()
        assert health["status"] == "ok" and health["id"] == router.id
        mesh = (await http.get("/mesh")).json()
        assert mesh["routers"][0]["id"] == router.id and mesh["links"] == []
        docs = await http.get("/docs")
        assert docs.status_code == 200 and "/docs-static/swagger-ui-bundle.js" in docs.text
        assert "cdn" not in docs.text.lower()  # works on a machine that reaches no CDN
        ui = await http.get("/docs-static/swagger-ui-bundle.js")
        assert ui.status_code == 200 and len(ui.content) > 100_000
        schema = (await http.get("/openapi.json")).json()
        assert {"/events", "/clients", "/clients/{client_id}/feed", "/mesh", "/stream"} <= set(
            schema["paths"]
        )
        page = await http.get("/")
        assert page.status_code == 200 and "monitor.js" in page.text
        js = await http.get("/static/aa.js")
        assert js.status_code == 200 and "export class AaClient" in js.text
        assert "javascript" in js.headers["content-type"]


async def test_history_asks_the_router_with_pattern_since_and_limit() -> None:
    async with open_api() as (router, http):
        calls = []

        async def history(pattern, *, since=None, limit=None, include_cache=True, receives=None):  # type: ignore[no-untyped-def]
            calls.append((pattern, since, limit, include_cache))
            return [router.publish({"v": 1.5}, type="old")]

        router.history = history  # type: ignore[attr-defined]
        r = await http.get(
            "/events", params={"pattern": "v > 1", "since": "2026-01-01T00:00:00", "limit": 5}
        )
        assert r.status_code == 200, r.text
        (event,) = r.json()["events"]
        assert event["values"] == {"v": 1.5} and event["type"] == "old"
        pattern, since, limit, include_cache = calls[0]
        assert (
            pattern.source == "v > 1" and limit == 6 and include_cache is True
        )  # one more: is there more?
        assert since == datetime(2026, 1, 1, tzinfo=UTC)
        r = await http.get("/events", params={"since": "1h"})
        assert r.status_code == 200 and calls[1][1] < datetime.now(UTC)
        atom = await http.get("/events", headers={"Accept": "application/atom+xml"})
        assert (
            atom.headers["content-type"].startswith("application/atom+xml")
            and b"<entry>" in atom.content
        )
        assert (await http.get("/events", params={"since": "yesterday"})).status_code == 422
        assert (await http.get("/events", params={"limit": 0})).status_code == 422


async def test_a_cut_history_says_so_and_links_the_rest() -> None:
    """`more` tells a caller the answer stopped at `limit` (a newcomer could not tell), and
    `next` asks for the rest: followed, it gives every event once, in order."""
    async with open_api() as (router, http):
        for n in range(5):
            router.publish({"n": n}, type="page")  # each dispatched alone, with its own time
        query = {"pattern": "type == 'page'", "limit": 2}
        got = (await http.get("/events", params=query)).json()
        assert [e["values"]["n"] for e in got["events"]] == [0, 1] and got["more"] is True, got
        seen = [0, 1]
        while got["more"]:
            got = (await http.get(got["next"])).json()
            seen += [e["values"]["n"] for e in got["events"]]
        assert seen == [0, 1, 2, 3, 4]
        whole = (await http.get("/events", params={**query, "limit": 5})).json()
        assert whole["more"] is False and "next" not in whole and len(whole["events"]) == 5
        atom = await http.get("/events", params=query, headers={"Accept": "application/atom+xml"})
        assert b'rel="next"' in atom.content


async def test_stream_with_a_bad_pattern_is_refused() -> None:
    async with open_api() as (router, http):
        r = await http.get("/stream", params={"pattern": "import os"})
        assert r.status_code == 422 and r.json()["error"] == "pattern"
        r = await http.get("/stream", params={"pattern": "x", "kernel": "cobol"})
        assert r.status_code == 422


# -- the wall -----------------------------------------------------------------------------


async def test_callers_outside_the_allowed_ranges_get_403() -> None:
    async with open_api(peer=("10.1.2.3", 5000)) as (router, http):
        for method, path in [
            ("GET", "/health"),
            ("POST", "/events"),
            ("GET", "/"),
            ("POST", "/clients"),
        ]:
            r = await http.request(method, path, json={"values": {}})
            assert r.status_code == 403 and r.json()["error"] == "forbidden"
        assert router.stats()["counters"].get("published", 0) == 0


async def test_allowed_ranges_admit_their_callers_and_forwarded_headers_do_not_count() -> None:
    async with open_api(allow=("10.0.0.0/8",), peer=("10.1.2.3", 5000)) as (router, http):
        assert (await http.get("/health")).status_code == 200
    async with open_api(allow=("10.0.0.0/8",), peer=("192.168.1.1", 5000)) as (router, http):
        assert (
            await http.get("/health", headers={"X-Forwarded-For": "10.1.2.3"})
        ).status_code == 403


def test_default_allow_is_loopback_only_and_bad_ranges_are_refused() -> None:
    assert HttpEndpoint(port=0).config.allow == ("127.0.0.0/8", "::1/128")
    with pytest.raises(UsageError, match="not an address range"):
        HttpConfig(allow=("10.0.0.0/33",))
    with pytest.raises(UsageError):
        HttpConfig(port=70000)


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"values": {"a": 1}, "colour": "red"}', 422, "colour"),
        (b'{"values": [1, 2]}', 422, "values"),
        (b'{"values": {"a": 1}, "type": 5}', 422, "type"),
        (b'{"type": "x"}', 422, "values"),
        (b'{"values": {"b": {"$bytes": "%%%"}}}', 422, "base64"),
        (b'{"values": {"t": {"$sometag": 1}}}', 422, "unknown tag"),
        (b'{"values": {}, "id": ""}', 422, "id"),
        (b"[]", 422, "body"),
        (b'{"values": {}, "meta": {"persist": true, "max_age": -5}}', None, None),
    ],
)
async def test_malformed_publishes_get_a_clear_4xx(
    body: bytes, status: int | None, words: str | None
) -> None:
    async with open_api() as (router, http):
        r = await http.post("/events", content=body, headers={"Content-Type": "application/json"})
        if status is None:
            assert r.status_code < 500  # whatever the store thinks of it, never a 5xx
        else:
            assert r.status_code == status, r.text
            assert r.json()["error"] and words in r.json()["message"]
        ok = await http.post("/events", json={"values": {"a": 1}})  # the router goes on
        assert ok.status_code == 201


async def test_oversized_bodies_get_413_before_they_are_read() -> None:
    async with open_api(max_body=1000) as (router, http):
        big = json.dumps({"values": {"s": "x" * 2000}})
        r = await http.post("/events", content=big, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"] == "too-large"

        async def chunks():  # no Content-Length: counted as it comes
            for _ in range(10):
                yield b"x" * 200

        r = await http.post(
            "/events", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 413
        assert (await http.post("/events", json={"values": {"a": 1}})).status_code == 201


async def test_deeply_nested_json_is_refused_not_crashed_on() -> None:
    async with open_api() as (router, http):
        deep = '{"values": {"a": ' + "[" * 5000 + "]" * 5000 + "}}"
        r = await http.post("/events", content=deep, headers={"Content-Type": "application/json"})
        assert 400 <= r.status_code < 500
        assert (await http.post("/events", json={"values": {"a": 1}})).status_code == 201


async def test_unknown_routes_and_methods_answer_in_the_error_shape() -> None:
    async with open_api() as (router, http):
        r = await http.get("/nowhere")
        assert r.status_code == 404 and r.json()["error"] == "not-found"
        r = await http.put("/events", json={})
        assert r.status_code == 405 and r.json()["error"] == "method-not-allowed"


async def test_edges_schemathesis_found_are_accepted_or_refused_by_the_schema() -> None:
    async with open_api() as (router, http):
        assert (
            await http.get("/events", params={"since": ""})
        ).status_code == 200  # empty: no limit
        r = await http.post(
            "/clients", json={"keepalive": "1h30m", "policy": {"max_age": "2w"}}
        )  # beyond the
        assert (
            r.status_code == 201 and r.json()["keepalive"] == 5400.0
        )  # schema's simple pattern, still read
        r = await http.post(
            "/clients", json={"keepalive": 1, "policy": {"max_count": 5.0}}
        )  # 5.0 is a count
        assert (
            r.status_code == 201
            and r.json()["keepalive"] == 1.0
            and r.json()["policy"]["max_count"] == 5
        )
        r = await http.post("/events", json={"values": {"big": 2**64}})
        assert r.status_code == 422 and "64-bit" in r.json()["message"]
        schema = (await http.get("/openapi.json")).json()
        big = schema["components"]["schemas"]["TypedValue"]["anyOf"][3]
        assert big == {
            "type": "integer",
            "minimum": -(2**63),
            "maximum": 2**64 - 1,
        }  # …and the schema says so
        keepalive = schema["components"]["schemas"]["ClientIn"]["properties"]["keepalive"]["anyOf"][
            0
        ]
        assert keepalive["minimum"] >= 1
        assert "200" in schema["paths"]["/events"]["post"]["responses"]  # the duplicate answer
        for method, path, allow in [
            ("OPTIONS", "/events", "GET, HEAD, POST"),
            ("PUT", "/events", "GET, HEAD, POST"),
            ("POST", "/mesh", "GET, HEAD"),
            ("PATCH", "/clients/x", "DELETE, GET, HEAD"),
            ("PUT", "/clients/x/feed", "DELETE, GET, HEAD"),
        ]:
            r = await http.request(method, path)
            assert r.status_code == 405 and r.headers["allow"] == allow, (
                method,
                path,
                r.headers.get("allow"),
            )


async def test_client_registration_refuses_bad_patterns_and_policies() -> None:
    async with open_api() as (router, http):
        cases = [
            ({"patterns": [{"source": "import os"}]}, "pattern"),
            ({"patterns": [{"source": "x", "kernel": "cobol"}]}, "invalid-request"),
            (
                {"patterns": [{"source": "x", "kernel": "xpath", "format": "script"}]},
                "invalid-value",
            ),
            ({"policy": {"max_age": "3 fortnights"}}, "invalid-policy"),
            ({"policy": {"max_count": 0}}, "invalid-request"),
            ({"policy": {"max_count": "5"}}, "invalid-request"),
            ({"keepalive": 10**9}, "invalid-request"),
            ({"keepalive": 0}, "invalid-request"),
            ({"keepalive": 1e-276}, "invalid-request"),  # the client would expire at once
            ({"keepalive": "0s"}, "usage"),
            ({"keepalive": "1 fortnight"}, "invalid-policy"),
            ({"policy": {"max_count": 2**70}}, "invalid-request"),
            ({"patterns": [{"source": "True"}] * 17}, "invalid-request"),
            ({"nickname": "x"}, "invalid-request"),
        ]
        for body, code in cases:
            r = await http.post("/clients", json=body)
            assert r.status_code == 422, (body, r.text)
            assert r.json()["error"] == code, (body, r.json())
        assert len(router.caches) == 0  # nothing left behind
        ok = await register(http, "True")
        assert (
            await http.get(f"/clients/{ok['id']}", headers=bearer(ok["token"]))
        ).status_code == 200


def test_content_negotiation_and_etag_matching() -> None:
    from aa.http_api.web import etag_matches, negotiate

    offers = ("application/atom+xml", "application/json")
    assert negotiate(None, offers) == "application/atom+xml"
    assert negotiate("application/json", offers) == "application/json"
    assert (
        negotiate("application/json;q=0.5, application/atom+xml", offers) == "application/atom+xml"
    )
    assert negotiate("application/*;q=0.2, application/json", offers) == "application/json"
    assert negotiate("text/html", offers) == "application/atom+xml"
    assert negotiate("application/json;q=0", offers) == "application/atom+xml"
    assert (
        etag_matches('"x", W/"y"', 'W/"y"')
        and etag_matches("*", '"z"')
        and not etag_matches('"x"', '"y"')
    )


def test_guard_reads_ipv6_and_mapped_addresses() -> None:
    from aa.http_api.guard import Guard

    guard = Guard(lambda *a: None, allow=("127.0.0.0/8", "::1/128"))  # type: ignore[arg-type, return-value]
    assert guard.allowed("127.0.0.1") and guard.allowed("::1") and guard.allowed("::ffff:127.0.0.1")
    assert (
        not guard.allowed("10.0.0.1")
        and not guard.allowed("fe80::1%lo")
        and not guard.allowed(None)
    )
    assert not guard.allowed("not-an-address")


async def test_an_http_publish_is_stamped_with_the_user_whose_token_it_carries() -> None:
    """The user an HTTP client's token stands for is the user who registered it (here, on an
    open router, anonymous), stamped as `meta["user"]` like a certificate's; a token that
    is no client's is refused, not taken as anonymous."""
    async with open_api() as (router, http):
        got: list = []
        router.subscribe("True", got.append)
        token = (await register(http))["token"]
        assert (await http.post("/events", json={"values": {"x": 1}})).status_code == 201
        assert (
            await http.post("/events", json={"values": {"x": 2}}, headers=bearer(token))
        ).status_code == 201
        r = await http.post("/events", json={"values": {"x": 3}}, headers=bearer("x" * 43))
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert {e.values["x"]: e.meta["user"] for e in got} == {1: "anonymous", 2: "anonymous"}


async def test_a_count_limit_written_as_a_whole_float_is_taken_as_an_int() -> None:
    """JSON has one number type: `"max_count": 5.0` is 5 (schemathesis found the 422)."""
    async with open_api() as (router, http):
        r = await http.post(
            "/events",
            json={"values": {"x": 1}, "type": "t", "meta": {"persist": True, "max_count": 5.0}},
        )
        assert r.status_code == 201, r.text


async def test_a_bad_since_is_named_as_such() -> None:
    # it was answered as a bad expiry policy ("InvalidPolicy"), which a reader looks for in vain
    async with open_api() as (router, http):
        for since in ("3x", "1 fortnight"):
            r = await http.get("/events", params={"since": since})
            assert r.status_code == 422, r.text
            assert (
                r.json()["error"] in ("usage", "invalid-request") and "since" in r.json()["message"]
            ), r.json()


async def test_history_from_a_router_without_a_store_says_so() -> None:
    async with open_api() as (router, http):
        router.publish({"v": 1}, type="t", meta={"persist": True})  # delivered, not kept
        r = await http.get("/events", params={"pattern": "v == 1"})
        assert r.status_code == 200 and r.headers["aa-store"] == "none"
        body = r.json()
        assert [e["values"] for e in body["events"]] == [{"v": 1}]  # the mesh cache's copy
        (warning,) = body["warnings"]
        assert "keeps no store" in warning and "--data-dir" in warning
        atom = await http.get("/events", headers={"Accept": "application/atom+xml"})
        assert atom.status_code == 200 and atom.headers["aa-store"] == "none"
        r = await http.get("/events", params={"include_cache": "false"})
        assert r.status_code == 409 and r.json()["error"] == "no-store"
        assert "keeps no store" in r.json()["message"]


async def test_patterns_added_over_http_get_the_subscribers_advice() -> None:
    async with open_api() as (router, http):
        router.publish({"Temperature": 20, "Sensor": "lab-1"})  # names the router has seen
        reg = await register(http, "Temprature > 100", 'Door == "open"')
        assert reg["warnings"] == [
            "`Temprature > 100`: no event has had `Temprature`; did you mean `Temperature`?"
        ]  # `Door`: not published yet, the normal order in publish/subscribe
        auth = bearer(reg["token"])
        r = await http.post(
            f"/clients/{reg['id']}/patterns", json={"source": "sensor == 'x'"}, headers=auth
        )
        assert r.status_code == 201
        assert r.json()["warnings"] == ["no event has had `sensor`; did you mean `Sensor`?"]
        r = await http.post(
            f"/clients/{reg['id']}/patterns", json={"source": "Sensor == lab-1"}, headers=auth
        )
        assert r.json()["warnings"] == [
            "`lab-1` is read as an expression, not as text; did you mean Sensor == 'lab-1'?"
        ]
        r = await http.post(
            f"/clients/{reg['id']}/patterns", json={"source": "Temperature > 1"}, headers=auth
        )
        assert r.json()["warnings"] == []
        r = await http.get("/events", params={"pattern": "Temprature > 1"})
        assert r.json()["warnings"][0] == (
            "no event has had `Temprature`; did you mean `Temperature`?"
        )
