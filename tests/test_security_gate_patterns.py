"""What a pattern sees, and whose caches are whose, on a two-router TLS mesh with real
certificates and a permissions file: alice (publish/subscribe ``reading``, predicates only),
bob (``alarm``, scripts), carol (everything). Each test is an attack that used to work."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import next_event, wait_for
from support.pki import make_pki

import aa.router.patterns.advice as advice_module
import aa.router.patterns.engine as engine_module
from aa.client import AsyncClient, ClientConfig
from aa.mesh import Event, PatternError, RemoteError
from aa.router import MeshConfig, Router, RouterConfig
from aa.router.security import SecurityConfig

RULES = """\
[users.alice]
publish = ["reading"]
subscribe = ["reading"]
patterns = "predicates"
client_caches = true

[users.bob]
publish = ["alarm"]
subscribe = ["alarm"]
patterns = "scripts"
client_caches = true

[users.carol]
publish = ["*"]
subscribe = ["*"]
patterns = "scripts"
persist = true
client_caches = true
quench = true
"""

FAST = MeshConfig(
    retry_base=0.05, retry_max=0.2, retry_jitter=0.0, keepalive=1.0, info_interval=1.0
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("mesh"), ("r1", "r2"), ("alice", "bob", "carol"))


def _security(pki: Path, name: str, perms: Path) -> SecurityConfig:
    return SecurityConfig(
        cert=pki / f"{name}.pem",
        key=pki / f"{name}.key",
        ca=pki / "ca.pem",
        anonymous=False,
        permissions=perms,
    )


@pytest.fixture
async def routers(pki: Path, tmp_path: Path) -> AsyncIterator[tuple[Router, Router]]:
    perms = tmp_path / "perms.toml"
    perms.write_text(RULES)
    one = RouterConfig(
        port=0, name="r1", security=_security(pki, "r1", perms), mesh=FAST, data_dir=tmp_path / "1"
    )
    async with Router(one) as r1:
        two = RouterConfig(
            port=0,
            name="r2",
            security=_security(pki, "r2", perms),
            mesh=FAST,
            peers=(r1.endpoint,),
            data_dir=tmp_path / "2",
        )
        async with Router(two) as r2:
            await wait_for(lambda: r1.peer_count() == 1 and r2.peer_count() == 1)
            yield r1, r2


async def as_user(router: Router, pki: Path, name: str, **kw: Any) -> AsyncClient:
    c = AsyncClient(
        config=ClientConfig(
            routers=(router.endpoint,),
            ca=pki / "ca.pem",
            cert=pki / f"{name}.pem",
            key=pki / f"{name}.key",
            **kw,
        )
    )
    await c.connect()
    return c


def _reload_without(router: Router, section: str) -> None:
    path = router.config.security.permissions
    assert path is not None
    text = RULES.split("\n\n")
    path.write_text("\n\n".join(t for t in text if not t.startswith(f"[users.{section}]")))
    assert "reloaded" in router.security.reload()


async def test_the_mesh_cache_answers_only_what_the_user_may_receive_and_run(
    routers: tuple[Router, Router], pki: Path
) -> None:
    r1, r2 = routers
    carol, alice = await as_user(r1, pki, "carol"), await as_user(r2, pki, "alice")
    watcher = await as_user(r2, pki, "carol")
    try:
        await carol.publish({"n": 1}, type="alarm", meta={"persist": True})
        await carol.publish({"n": 2}, type="reading")
        await carol.flush()
        await wait_for(lambda: len(r2.caches.mesh_cache or []) >= 2)  # type: ignore[arg-type]
        assert {e.values["n"] for e in await watcher.cached("True")} == {1, 2}
        seen = await alice.cached("True")
        assert [(e.type, e.values["n"]) for e in seen] == [("reading", 2)]
        assert await alice.cached('type == "alarm"') == []
        for code, fmt, kernel in (
            ("forward()", "script", "python"),
            ("sum(x for x in range(10**5)) > 0", "expr", "python"),
            ("(lambda: True)()", "expr", "python"),
            ("/event", "expr", "xpath"),
        ):
            with pytest.raises(RemoteError, match='rule patterns = "predicates"'):
                await alice.cached(code, format=fmt, kernel=kernel)
        _reload_without(r2, "alice")
        with pytest.raises(RemoteError, match="no rule in the permissions file covers this user"):
            await alice.cached("True")
    finally:
        for c in (carol, alice, watcher):
            await c.aclose()


async def test_a_script_sees_only_events_its_owner_may_receive(
    routers: tuple[Router, Router], pki: Path
) -> None:
    r1, _ = routers
    bob, alice = await as_user(r1, pki, "bob"), await as_user(r1, pki, "alice")
    carol = await as_user(r1, pki, "carol")
    try:
        relabel = 'forward(event.copy(type="alarm"))'
        got = await bob.subscribe(relabel, format="script")
        since = datetime.now(UTC) - timedelta(minutes=1)
        await alice.publish({"secret": 42}, type="reading")
        await alice.flush()
        await carol.publish({"n": 1}, type="alarm", meta={"persist": True})
        await carol.flush()
        ev = await next_event(got)
        assert ev.values == {"n": 1}  # alice's reading never reached bob's script
        # Replayed history runs through the same filter.
        await carol.publish({"secret": 7}, type="reading", meta={"persist": True})
        await carol.flush()
        again = await bob.subscribe(relabel, format="script", history={"since": since})
        replayed = await next_event(again)
        assert replayed.values == {"n": 1}
        await carol.publish({"n": 2}, type="alarm")
        assert (await next_event(again)).values == {"n": 2}  # nothing derived from readings
    finally:
        for c in (bob, alice, carol):
            await c.aclose()


def _each_wants(routers: tuple[Router, Router], type: str) -> bool:
    """Each router's view holds the other's new interest (its copy of a cache): until then an
    event published on one may be routed on the old view, as for a new subscription."""
    probe = Event(values={"n": 0}, type=type)
    a, b = routers
    return all(
        here.mesh.interests.table.view.interest(there.id).may_match(probe)
        for here, there in ((a, b), (b, a))
    )


async def test_a_client_cache_script_sees_only_events_its_owner_may_receive(
    routers: tuple[Router, Router], pki: Path
) -> None:
    """The same attack through a client cache: bob's caching script relabels what it sees as
    his own type. Each router's copy of his cache runs it over alarms only, so alice's
    readings never enter it, on the router he asked or on the other one."""
    r1, r2 = routers
    bob = await as_user(r1, pki, "bob", client_id="bob-phone")
    alice, carol = await as_user(r1, pki, "alice"), await as_user(r2, pki, "carol")
    try:
        await bob.cache_register('forward(event.copy(type="alarm"))', format="script")
        await wait_for(lambda: all(len(r.caches) == 1 for r in routers))
        await wait_for(lambda: _each_wants(routers, "alarm"))
        await alice.publish({"secret": 42}, type="reading")
        await alice.flush()
        await carol.publish({"n": 1}, type="alarm")
        await carol.flush()
        for router in routers:
            await wait_for(lambda r=router: len(r.caches.fetch("bob/bob-phone").events) >= 1)
        await carol.publish({"n": 2}, type="alarm")
        await carol.flush()
        for router in routers:  # what each copy holds, in order: nothing of alice's
            await wait_for(lambda r=router: len(r.caches.fetch("bob/bob-phone").events) >= 2)
            held = [e.values for e in router.caches.fetch("bob/bob-phone").events]
            assert held == [{"n": 1}, {"n": 2}], (router.name, held)
        assert [e.values for e in await bob.cache_fetch()] == [{"n": 1}, {"n": 2}]
    finally:
        for c in (bob, alice, carol):
            await c.aclose()


async def test_a_reload_that_narrows_an_owner_s_scope_restarts_her_caching_script(
    routers: tuple[Router, Router], pki: Path
) -> None:
    """Carol may receive every type, so her caching script sees readings; the operator then
    narrows her to alarms. Her script restarts under the new scope on each router (its state
    was built from readings), so a reading published after the reload cannot come back to her
    relabelled as an alarm."""
    r1, r2 = routers
    carol = await as_user(r1, pki, "carol", client_id="carol-tablet")
    alice = await as_user(r1, pki, "alice")
    try:
        await carol.cache_register('forward(event.copy(type="alarm"))', format="script")
        await wait_for(lambda: all(len(r.caches) == 1 for r in routers))
        path = r1.config.security.permissions
        assert path is not None
        path.write_text(RULES.replace('subscribe = ["*"]', 'subscribe = ["alarm"]'))
        for router in routers:
            assert any("reloaded" in line for line in router.reload_security())
        await alice.publish({"secret": 42}, type="reading")
        await alice.flush()
        await carol.publish({"n": 1}, type="alarm")
        await carol.flush()
        for router in routers:
            await wait_for(lambda r=router: len(r.caches.fetch("carol/carol-tablet").events) >= 1)
            held = [e.values for e in router.caches.fetch("carol/carol-tablet").events]
            assert held == [{"n": 1}], (router.name, held)
    finally:
        for c in (carol, alice):
            await c.aclose()


async def test_predicates_users_run_no_pattern_code(
    routers: tuple[Router, Router], pki: Path
) -> None:
    r1, _ = routers
    alice = await as_user(r1, pki, "alice")
    try:
        for code, fmt, kernel in (
            ("sum(x for x in range(10**5)) > 0", "expr", "python"),
            ("[x for x in [1, 2]] == [1, 2]", "expr", "python"),
            ("(lambda: True)()", "expr", "python"),
            ("/event", "expr", "xpath"),
        ):
            with pytest.raises(RemoteError, match='only predicates .*rule patterns = "predicates"'):
                await alice.subscribe(code, format=fmt, kernel=kernel)
        with pytest.raises(RemoteError, match='rule patterns = "predicates"'):
            await alice.cache_register("sum(x for x in range(3)) > 0", max_count=5)
        ok = await alice.subscribe('n > 1 and type == "reading"')
        await alice.publish({"n": 2}, type="reading")
        assert (await next_event(ok)).values == {"n": 2}
    finally:
        await alice.aclose()


async def test_a_predicates_user_subscribing_in_a_loop_costs_no_syntax_tree_walk(
    routers: tuple[Router, Router], pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tier the rule checks is read as subscribing reads the pattern: the common
    # conjunction without `ast`, once per subscribe, not again for the rule and the scope;
    # and the advice on a conjunction of names events have had needs no tree either.
    walks: Counter[str] = Counter()

    def counted(module: Any, name: str) -> None:
        inner = getattr(module, name)

        def counting(*args: Any, **kw: Any) -> Any:
            walks[name] += 1
            return inner(*args, **kw)

        monkeypatch.setattr(module, name, counting)

    counted(engine_module, "parse_predicate")
    counted(advice_module, "_bound_names")  # the advice's walk of a parsed pattern
    r1, _ = routers
    alice = await as_user(r1, pki, "alice")
    try:
        first = await alice.subscribe("Seq > 0")
        await alice.publish({"Seq": 10, "n": 12}, type="reading")
        await next_event(first)  # Seq and n are names events have had now
        walks.clear()
        subs = [await alice.subscribe(f"Seq > {i} and n < {i + 5}") for i in range(50)]
        assert walks == {}
        await alice.publish({"Seq": 10, "n": 12}, type="reading")
        assert (await next_event(subs[9])).values == {"Seq": 10, "n": 12}
        await alice.subscribe("Temperature > 3")  # a name no event had: advised as before
        assert walks["_bound_names"] == 1
        with pytest.raises(RemoteError, match='rule patterns = "predicates"'):
            await alice.subscribe("(lambda: True)()")
    finally:
        await alice.aclose()


async def test_a_reload_stops_deliveries_of_a_type_at_the_next_event(
    routers: tuple[Router, Router], pki: Path
) -> None:
    r1, r2 = routers
    alice, carol = await as_user(r2, pki, "alice"), await as_user(r1, pki, "carol")
    try:
        mine = await alice.subscribe("True")
        hers = await carol.subscribe("True")
        await carol.publish({"n": 1}, type="reading")
        assert (await next_event(mine)).values == {"n": 1}
        assert (await next_event(hers)).values == {"n": 1}
        path = r2.config.security.permissions
        assert path is not None
        path.write_text(RULES.replace('subscribe = ["reading"]', 'subscribe = ["ping"]'))
        assert "reloaded" in r2.security.reload()
        await carol.publish({"n": 2}, type="reading")
        await carol.publish({"n": 3}, type="ping")
        assert (await next_event(hers)).values == {"n": 2}
        assert (await next_event(mine)).values == {"n": 3}  # the reading was not delivered
    finally:
        await alice.aclose()
        await carol.aclose()


async def test_a_client_cache_belongs_to_its_user_mesh_wide(
    routers: tuple[Router, Router], pki: Path
) -> None:
    r1, r2 = routers
    carol = await as_user(r1, pki, "carol", client_id="carol-laptop")
    try:
        await carol.cache_register("True", max_count=10)
        await carol.publish({"n": 1}, type="alarm")
        await carol.flush()
        await wait_for(lambda: all(len(r.caches) == 1 for r in routers))
        for router in routers:  # alice claims carol's client id, on either router
            alice = await as_user(router, pki, "alice", client_id="carol-laptop")
            try:
                with pytest.raises(RemoteError, match="no event cache"):
                    await alice.cache_fetch()
                for attempt in (alice.cache_ack, alice.cache_clear, alice.cache_info):
                    with pytest.raises(RemoteError, match="no event cache"):
                        await attempt()
                with pytest.raises(RemoteError, match="no event cache"):
                    await alice.cache_policy(max_count=1)
                assert await alice.cache_remove() is False
            finally:
                await alice.aclose()
        assert all(len(r.caches) == 1 for r in routers)
        kept = await carol.cache_fetch()
        assert [e.values for e in kept] == [{"n": 1}]
        # Her events say which client sent them; that name opens nobody's cache.
        assert kept[0].meta["client"] == "carol-laptop" and kept[0].meta["user"] == "carol"
    finally:
        await carol.aclose()


async def test_every_client_cache_request_needs_the_client_caches_rule(
    routers: tuple[Router, Router], pki: Path
) -> None:
    r1, _ = routers
    bob = await as_user(r1, pki, "bob", client_id="bobs-phone")
    try:
        await bob.cache_register('type == "alarm"', max_count=10)
        path = r1.config.security.permissions
        assert path is not None
        path.write_text(
            RULES.replace(
                'patterns = "scripts"\nclient_caches = true\n\n[users.carol]',
                'patterns = "scripts"\n\n[users.carol]',
            )
        )
        assert "reloaded" in r1.security.reload()
        for attempt in (bob.cache_fetch, bob.cache_ack, bob.cache_clear, bob.cache_info):
            with pytest.raises(RemoteError, match="rule client_caches = false"):
                await attempt()
        with pytest.raises(RemoteError, match="rule client_caches = false"):
            await bob.cache_remove()
    finally:
        await bob.aclose()


async def test_a_reload_that_changes_what_a_script_may_see_ends_it(
    routers: tuple[Router, Router], pki: Path
) -> None:
    r1, _ = routers
    bob, carol = await as_user(r1, pki, "bob"), await as_user(r1, pki, "carol")
    try:
        got = await bob.subscribe('forward(event.copy(type="alarm"))', format="script")
        await carol.publish({"n": 1}, type="alarm")
        assert (await next_event(got)).values == {"n": 1}
        path = r1.config.security.permissions
        assert path is not None
        path.write_text(RULES.replace('subscribe = ["alarm"]', 'subscribe = ["alarm", "reading"]'))
        assert "reloaded" in r1.security.reload()
        await carol.publish({"n": 2}, type="alarm")
        with pytest.raises(PatternError, match="permissions changed .*subscribe again"):
            await next_event(got)
        again = await bob.subscribe('forward(event.copy(type="alarm"))', format="script")
        await carol.publish({"n": 3}, type="reading")  # now bob's to see
        assert (await next_event(again)).values == {"n": 3}
    finally:
        await bob.aclose()
        await carol.aclose()
