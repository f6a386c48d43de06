"""Permissions checked by the router that receives the request, over real TLS: a denied
request gets an error naming the rule, and nothing else is affected."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import next_event, wait_for
from support.pki import make_pki

from aa.client import AsyncClient, ClientConfig
from aa.mesh import PatternError, RemoteError
from aa.router import Router, RouterConfig
from aa.router.security import SecurityConfig

RULES = """\
[users.alice]
publish = ["reading"]
subscribe = ["reading"]
patterns = "predicates"

[users.carol]
publish = ["reading"]
subscribe = ["*"]
quench = true

[users.bob]
publish = ["*"]
subscribe = ["*"]
patterns = "scripts"
persist = true
client_caches = true
quench = true
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("mesh"), ("r1",), ("alice", "bob", "carol"))


@pytest.fixture
async def router(pki: Path, tmp_path: Path) -> AsyncIterator[Router]:
    perms = tmp_path / "perms.toml"
    perms.write_text(RULES)
    security = SecurityConfig(
        cert=pki / "r1.pem", key=pki / "r1.key", ca=pki / "ca.pem", permissions=perms
    )
    async with Router(RouterConfig(port=0, security=security, data_dir=tmp_path / "data")) as r:
        yield r


async def as_user(router: Router, pki: Path, name: str) -> AsyncClient:
    c = AsyncClient(
        config=ClientConfig(
            routers=(router.endpoint,),
            ca=pki / "ca.pem",
            cert=pki / f"{name}.pem",
            key=pki / f"{name}.key",
        )
    )
    await c.connect()
    return c


async def test_denied_publish_names_the_rule_and_affects_nothing_else(
    router: Router, pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alice, bob = await as_user(router, pki, "alice"), await as_user(router, pki, "bob")
    try:
        got = await bob.subscribe("True")
        with caplog.at_level(logging.WARNING, logger="aa.client"):
            await alice.publish({"n": 1}, type="alarm")  # refused
            await alice.publish({"n": 2}, type="reading")  # same frame or the next: published
            await alice.flush()  # acknowledged: the refusal does not break alice's outbox
            await bob.publish({"n": 3}, type="alarm")
            await bob.flush()
            first, second = await next_event(got), await next_event(got)
            await wait_for(lambda: "permission-denied" in caplog.text)
        assert [(e.values["n"], e.meta["user"]) for e in (first, second)] == [
            (2, "alice"),
            (3, "bob"),
        ]
        assert (
            "user 'alice' is not allowed to publish events of type 'alarm' "
            '(rule publish = ["reading"] in [users.alice]'
        ) in caplog.text
        assert router.counters["refused_permission"] == 1
        assert alice.connected and bob.connected
    finally:
        await alice.aclose()
        await bob.aclose()


async def test_a_publisher_quenches_only_types_it_may_publish(router: Router, pki: Path) -> None:
    carol, bob = await as_user(router, pki, "carol"), await as_user(router, pki, "bob")
    try:
        await bob.subscribe('type == "alarm"')
        with pytest.raises(RemoteError, match=r"quench events of type 'alarm' .rule publish = "):
            await carol.quench({"n": 1}, type="alarm")  # would tell carol who listens to alarms
        q = await carol.quench({"n": 1}, type="reading")
        assert not q.interested and carol.connected
    finally:
        await carol.aclose()
        await bob.aclose()


async def test_subscriptions_scripts_persist_caches_and_quench(
    router: Router, pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alice, bob = await as_user(router, pki, "alice"), await as_user(router, pki, "bob")
    try:
        with pytest.raises(
            PatternError, match=r'register scripts.*rule patterns = "predicates" in \[users.alice\]'
        ):
            await alice.subscribe("forward()", format="script")
        sub = await alice.subscribe("True")  # allowed, but receives only the types alice may see
        await bob.publish({"n": 1}, type="secret")
        await bob.publish({"n": 2}, type="reading")
        ev = await next_event(sub)
        assert (ev.type, ev.values["n"]) == ("reading", 2)
        with pytest.raises(RemoteError, match="own client caches .rule client_caches = false"):
            await alice.cache_register("True", max_count=10)
        with pytest.raises(RemoteError, match="quench prototypes .rule quench = false"):
            await alice.quench({"n": 1}, type="reading")
        with caplog.at_level(logging.WARNING, logger="aa.client"):
            await alice.publish({"n": 3}, type="reading", meta={"persist": True})
            await alice.flush()
            await wait_for(lambda: "rule persist = false" in caplog.text)
        await bob.publish({"n": 4}, type="reading", meta={"persist": True})  # bob may
        await bob.flush()
        since = datetime.now(UTC) - timedelta(minutes=1)
        kept = await router.history("True", since=since, include_cache=False)
        assert [e.values["n"] for e in kept] == [4]
        assert await bob.cache_register("True", max_count=10) is not None  # and bob may own caches
    finally:
        await alice.aclose()
        await bob.aclose()


async def test_reload_applies_new_rules_and_keeps_them_on_a_broken_file(
    router: Router, pki: Path
) -> None:
    path = router.config.security.permissions
    assert path is not None
    path.write_text(RULES.replace('publish = ["reading"]', 'publish = ["reading", "alarm"]'))
    assert "reloaded" in router.security.reload()
    path.write_text("[users.alice]\npublish = [1]\n")
    assert "old rules stay" in router.security.reload()
    alice, bob = await as_user(router, pki, "alice"), await as_user(router, pki, "bob")
    try:
        got = await bob.subscribe("True")
        await alice.publish({"n": 1}, type="alarm")
        ev: Any = await next_event(got)
        assert ev.type == "alarm" and ev.meta["user"] == "alice"
    finally:
        await alice.aclose()
        await bob.aclose()
