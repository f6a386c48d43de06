"""The mesh's picture over the TCP port is asked of the gate like any other door: under
`--no-anonymous`, a TLS caller without a certificate that asks before its hello learns nothing
of the mesh (real TLS, a real router), while a user with a certificate still gets it."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.pki import make_pki
from support.waits import patience

from aa.client import AsyncClient, ClientConfig
from aa.mesh import Connection, PermissionDenied
from aa.mesh.protocol import Error, GetMesh, Message
from aa.router import Router, RouterConfig
from aa.router.security import SecurityConfig


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("mesh"), ("r1",), ("carol", "dave"))


@pytest.fixture
async def router(pki: Path, tmp_path: Path) -> AsyncIterator[Router]:
    perms = tmp_path / "perms.toml"
    perms.write_text('[users.carol]\nsubscribe = ["*"]\n')
    security = SecurityConfig(
        cert=pki / "r1.pem",
        key=pki / "r1.key",
        ca=pki / "ca.pem",
        permissions=perms,
        anonymous=False,
    )
    async with Router(RouterConfig(port=0, name="r1", security=security)) as r:
        yield r


async def ask_before_hello(router: Router, pki: Path) -> list[Message]:
    """What the router answers a certificate-less TLS caller that asks for the mesh first."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(pki / "ca.pem")
    host, port = router.address
    reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
    codec, got = Connection(), []
    try:
        writer.write(codec.send(GetMesh()))
        async with asyncio.timeout(patience()):
            while not got:
                data = await reader.read(1 << 16)
                if not data:
                    break
                codec.receive_data(data)
                got += codec.next_messages()
    finally:
        writer.close()
    return got


async def test_anonymous_caller_gets_no_mesh_picture_before_its_hello(
    router: Router, pki: Path
) -> None:
    got = await ask_before_hello(router, pki)
    assert [type(m) for m in got] == [Error], got
    assert isinstance(got[0], Error) and "refuses anonymous clients" in got[0].message
    config = ClientConfig(
        routers=(router.endpoint,),
        ca=pki / "ca.pem",
        cert=pki / "carol.pem",
        key=pki / "carol.key",
    )
    async with AsyncClient(config=config) as carol:
        info = await carol.mesh_info()
    assert info["routers"][0]["name"] == "r1"


def client_of(router: Router, pki: Path, user: str) -> ClientConfig:
    return ClientConfig(
        routers=(router.endpoint,),
        ca=pki / "ca.pem",
        cert=pki / f"{user}.pem",
        key=pki / f"{user}.key",
    )


async def test_a_user_no_section_covers_is_refused_the_picture_as_over_http(
    router: Router, pki: Path
) -> None:
    """``GET /mesh`` answers 403 to dave (a certificate, no section): so does the TCP port,
    after his hello; his client is told why, and the connection goes on."""
    async with AsyncClient(config=client_of(router, pki, "dave")) as dave:
        for _ in range(2):  # the second answer: a refusal is not a disconnection
            with pytest.raises(PermissionDenied, match="user 'dave'"):
                await dave.mesh_info()
    aa = str(Path(sys.executable).with_name("aa"))
    done = await asyncio.to_thread(
        subprocess.run,
        [aa, "mesh", "--router", router.endpoint, "--timeout", "10"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "AA_CA": str(pki / "ca.pem"),
            "AA_CERT": str(pki / "dave.pem"),
            "AA_KEY": str(pki / "dave.key"),
            "PATH": "/usr/bin:/bin",
        },
    )
    assert done.returncode == 1, done
    assert done.stderr.count("\n") == 1 and "dave" in done.stderr, done.stderr
    assert not done.stdout
