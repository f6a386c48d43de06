"""Quench registrations belong to users, as client caches do: a client id is a name the client
picks, so another user who claims it must not take over a publisher's registration, on its
router or from another router of the mesh (real TLS, real routers)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import wait_for
from support.pki import make_pki
from support.waits import patience

from aa.client import AsyncClient, ClientConfig
from aa.router import Router, RouterConfig
from aa.router.security import SecurityConfig

RULES = """\
[users.bob]
publish = ["alarm"]
subscribe = ["alarm"]
patterns = "predicates"
quench = true

[users.carol]
publish = ["*"]
subscribe = ["*"]
patterns = "scripts"
quench = true
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("mesh"), ("r1", "r2"), ("bob", "carol"))


def secured(pki: Path, tmp_path: Path, name: str) -> RouterConfig:
    perms = tmp_path / "perms.toml"
    perms.write_text(RULES)
    security = SecurityConfig(
        cert=pki / f"{name}.pem",
        key=pki / f"{name}.key",
        ca=pki / "ca.pem",
        permissions=perms,
        anonymous=False,
    )
    return RouterConfig(port=0, name=name, security=security, data_dir=tmp_path / name)


@pytest.fixture
async def routers(pki: Path, tmp_path: Path) -> AsyncIterator[tuple[Router, Router]]:
    async with Router(secured(pki, tmp_path, "r1")) as r1:
        r2_config = dataclasses.replace(secured(pki, tmp_path, "r2"), peers=(r1.endpoint,))
        async with Router(r2_config) as r2:
            await wait_for(lambda: r1.peer_count() == 1 and r2.peer_count() == 1)
            yield r1, r2


def as_user(router: Router, pki: Path, name: str, client_id: str) -> AsyncClient:
    return AsyncClient(
        config=ClientConfig(
            routers=(router.endpoint,),
            client_id=client_id,
            ca=pki / "ca.pem",
            cert=pki / f"{name}.pem",
            key=pki / f"{name}.key",
        )
    )


@pytest.mark.parametrize("bobs_router", [0, 1], ids=["same-router", "other-router"])
async def test_a_claimed_client_id_does_not_take_over_another_users_quench(
    routers: tuple[Router, Router], pki: Path, bobs_router: int
) -> None:
    r1 = routers[0]
    async with (
        as_user(r1, pki, "carol", "carol-laptop") as carol,
        as_user(routers[bobs_router], pki, "bob", "carol-laptop") as bob,
        as_user(r1, pki, "carol", "carol-phone") as listener,
    ):
        mine = await carol.quench({"Level": 1}, type="alarm")
        theirs = await bob.quench({"Level": 1}, type="alarm")
        assert mine.id == theirs.id  # the same number under the same client id
        await listener.subscribe('type == "alarm"')
        # Carol still hears that someone listens to her alarms; bob hears of his own.
        await mine.wait_interested(patience())
        await theirs.wait_interested(patience())
        await bob.aclose()  # bob leaving does not take carol's registration with it
        await listener.subscribe('type == "alarm" and Level > 0')
        await wait_for(lambda: len(mine.interest) == 2)
        assert r1.quench.table.registrations, "carol's registration is gone"
