"""Tokens for phones, revocation and reloads that reach live sessions, safer certificate
defaults: real certificates made by `aa certs`, real TLS, real routers, and the real `aa`
program where a user would run it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import next_event, wait_for

from aa.client import AsyncClient, ClientConfig
from aa.mesh import NotAuthenticated, PatternError, RemoteError, UsageError
from aa.router import Router, RouterConfig
from aa.router.security import Gate, SecurityConfig, TokenVerifier, check_cert_file, make_crl
from aa.tools.certs_cmd import init_ca, issue, make_token, revoke

AA = str(Path(sys.executable).with_name("aa"))


def sec(folder: Path, name: str = "r1", **kw: Any) -> SecurityConfig:
    return SecurityConfig(
        cert=folder / f"{name}.pem",
        key=folder / f"{name}.key",
        ca=folder / "ca.pem",
        crl=folder / "crl.pem",
        **kw,
    )


def as_user(folder: Path, router: Router, name: str, **kw: Any) -> AsyncClient:
    return AsyncClient(
        config=ClientConfig(
            routers=(router.endpoint,),
            ca=folder / "ca.pem",
            cert=folder / f"{name}.pem",
            key=folder / f"{name}.key",
            **kw,
        )
    )


def run_aa(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AA, *args], capture_output=True, text=True, timeout=60, env=env or dict(os.environ)
    )


@pytest.fixture
def mesh(tmp_path: Path) -> Path:
    init_ca(tmp_path)
    issue(tmp_path, "r1", "router", days=30)
    for name in ("alice", "bob", "carol"):
        issue(tmp_path, name, "client", days=30)
    return tmp_path


# -- tokens -----------------------------------------------------------------------------------


def test_a_printed_token_verifies_with_the_ca_alone_and_a_tampered_one_does_not(
    mesh: Path,
) -> None:
    done = run_aa("certs", "token", str(mesh), "bob", "--days", "7")
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert len(done.stdout.splitlines()) == 1 and token.startswith("aa1.")
    verifier = TokenVerifier(check_cert_file(mesh / "ca.pem"))
    claims = verifier.verify(token, now=time.time())
    assert claims.user == "bob" and claims.expires - claims.issued == 7 * 86400
    head, payload, signature = token.split(".")
    forged = payload.replace(payload[5], "A" if payload[5] != "A" else "B", 1)
    for bad in (
        f"{head}.{forged}.{signature}",
        token[:-2] + ("AA" if token[-2:] != "AA" else "BB"),
    ):
        with pytest.raises(NotAuthenticated):
            verifier.verify(bad, now=time.time())
    gate = Gate(sec(mesh))  # a router's gate: the same answer, with ca.pem alone
    assert gate.authenticate(token, now=time.time()).user == "bob"
    # another mesh's CA does not accept it
    other = mesh / "other"
    init_ca(other)
    with pytest.raises(NotAuthenticated, match="not signed by this mesh"):
        TokenVerifier(check_cert_file(other / "ca.pem")).verify(token, now=time.time())


def test_token_mistakes_get_one_line(mesh: Path) -> None:
    for args in (("--days", "0"), ("--days", "100000")):
        done = run_aa("certs", "token", str(mesh), "bob", *args)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    done = run_aa("certs", "token", str(mesh / "nowhere"), "bob")
    assert done.returncode == 2 and "Traceback" not in done.stderr


# -- revocation -------------------------------------------------------------------------------


def test_a_revoked_users_tokens_are_refused_and_later_ones_are_not(mesh: Path) -> None:
    now = time.time()
    old = make_token(mesh, "bob", now=now - 60)
    carol = make_token(mesh, "carol", now=now - 60)
    gate = Gate(sec(mesh))
    assert gate.authenticate(old, now=now).user == "bob"
    revoke(mesh, "bob", now=datetime.fromtimestamp(now, UTC))
    assert gate.crl_changed()
    assert "loaded" in (gate.reload_crl() or "")
    with pytest.raises(NotAuthenticated, match="revoked"):
        gate.authenticate(old, now=now + 1)
    assert gate.authenticate(carol, now=now + 1).user == "carol"  # only bob
    fresh = make_token(mesh, "bob", now=now + 2)  # issued after the cut-off
    assert gate.authenticate(fresh, now=now + 3).user == "bob"
    # A router started afterwards reads the same list.
    with pytest.raises(NotAuthenticated, match="revoked"):
        Gate(sec(mesh)).authenticate(old, now=now + 1)


def test_a_bad_crl_is_refused_and_the_old_list_stays(mesh: Path) -> None:
    now = time.time()
    token = make_token(mesh, "bob", now=now - 60)
    gate = Gate(sec(mesh))
    revoke(mesh, "bob")
    gate.reload_crl()
    good = (mesh / "crl.pem").read_bytes()
    # garbage; another CA's list; an older list of this CA (which would un-revoke bob)
    other = mesh / "other"
    init_ca(other)
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca = x509.load_pem_x509_certificate((mesh / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((mesh / "ca.key").read_bytes(), None)
    older = make_crl(ca, key, {}, number=1, now=datetime.now(UTC))  # type: ignore[arg-type]
    for bad, why in (
        (b"-----BEGIN X509 CRL-----\nnonsense\n-----END X509 CRL-----\n", "not a PEM"),
        ((other / "crl.pem").read_bytes(), "by this mesh's CA"),
        (older, "older than number"),
    ):
        (mesh / "crl.pem").write_bytes(bad)
        assert gate.crl_changed()
        message = gate.reload_crl() or ""
        assert "the old one stays" in message and why in message, message
        assert not gate.crl_changed()  # the bad file is not read again every second
        with pytest.raises(NotAuthenticated, match="revoked"):
            gate.authenticate(token, now=now)
    (mesh / "crl.pem").write_bytes(good)
    # A router is not started with a bad list at all.
    (mesh / "crl.pem").write_bytes(b"junk")
    with pytest.raises(UsageError, match="not a PEM"):
        Gate(sec(mesh))


async def test_a_revoked_certificate_is_cut_live_and_refused_after(mesh: Path) -> None:
    """Without SIGHUP: `aa certs revoke` changes the file, the router notices within a
    second or so and cuts alice's subscription and connection, telling her why."""
    async with Router(RouterConfig(port=0, security=sec(mesh))) as router:
        alice = as_user(mesh, router, "alice")
        bob = as_user(mesh, router, "bob")
        await alice.connect()
        await bob.connect()
        try:
            sub = await alice.subscribe("True")
            bobs = await bob.subscribe("True")
            started = time.monotonic()
            certificates, _ = revoke(mesh, "alice")
            assert certificates == 1
            with pytest.raises(PatternError, match="revoked") as stopped:
                while True:
                    await next_event(sub, timeout=5.0)
            assert stopped.value.code == "revoked"
            assert time.monotonic() - started < 5.0
            await bob.publish({"x": 1})  # bob is untouched
            assert (await next_event(bobs)).values == {"x": 1}
        finally:
            await alice.aclose()
            await bob.aclose()
        again = as_user(mesh, router, "alice", connect_timeout=2.0)
        with pytest.raises(RemoteError, match="revoked"):
            await again.connect(timeout=10.0)
        await again.aclose()
        issue(mesh, "alice", "client", days=30, force=True)  # a new certificate is good
        for suffix in (".pem", ".key"):  # (the client library keeps a context per file name)
            (mesh / f"alice2{suffix}").write_bytes((mesh / f"alice{suffix}").read_bytes())
        renewed = as_user(mesh, router, "alice2")
        await renewed.connect()
        await renewed.aclose()


async def test_a_revoked_router_is_cut_from_the_mesh(mesh: Path) -> None:
    issue(mesh, "r2", "router", days=30)
    from aa.router import MeshConfig

    fast = MeshConfig(retry_base=0.05, retry_max=0.2, retry_jitter=0.0, keepalive=1.0)
    async with Router(RouterConfig(port=0, security=sec(mesh), mesh=fast)) as r1:
        r2_config = RouterConfig(port=0, security=sec(mesh, "r2"), peers=(r1.endpoint,), mesh=fast)
        async with Router(r2_config) as r2:
            await wait_for(lambda: r1.peer_count() == 1 and r2.peer_count() == 1)
            revoke(mesh, "r2")
            r1.reload_security()
            await wait_for(lambda: r1.peer_count() == 0)
            assert r2.peer_count() == 0


# -- reloads reach live sessions ----------------------------------------------------------------

SCRIPT = "forward(event)"


async def test_a_permissions_reload_stops_what_is_no_longer_allowed(mesh: Path) -> None:
    perms = mesh / "perms.toml"
    perms.write_text(
        '[users.alice]\nsubscribe = ["*"]\npatterns = "scripts"\n'
        '[users.bob]\nsubscribe = ["*"]\npatterns = "scripts"\npublish = ["*"]\n'
    )
    async with Router(RouterConfig(port=0, security=sec(mesh, permissions=perms))) as router:
        alice = as_user(mesh, router, "alice")
        bob = as_user(mesh, router, "bob")
        await alice.connect()
        await bob.connect()
        try:
            script = await alice.subscribe(SCRIPT, format="script")
            predicate = await alice.subscribe("x > 0")
            gone = await bob.subscribe("True")
            perms.write_text(
                '[users.alice]\nsubscribe = ["*"]\npatterns = "predicates"\n'
                '[users.carol]\npublish = ["*"]\n'
            )
            said = router.reload_security()
            assert any("reloaded" in line for line in said), said
            with pytest.raises(PatternError, match=r"rule patterns = \"predicates\"") as stopped:
                await next_event(script)
            assert stopped.value.code == "permission-denied"
            with pytest.raises(PatternError, match="no rule covers this user"):
                await next_event(gone)  # bob has no section any more
            router.publish({"x": 1})
            assert (await next_event(predicate)).values == {"x": 1}  # still allowed
        finally:
            await alice.aclose()
            await bob.aclose()


# -- subprocesses: the user's view ------------------------------------------------------------


async def _line(stream: asyncio.StreamReader, pattern: str, timeout: float = 20) -> str:
    async with asyncio.timeout(timeout):
        while True:
            line = (await stream.readline()).decode()
            assert line, "the process exited"
            if re.search(pattern, line):
                return line


async def test_revoked_alice_and_sighup_end_her_live_subscribe(mesh: Path) -> None:
    env = {
        **os.environ,
        "AA_CERT": str(mesh / "r1.pem"),
        "AA_KEY": str(mesh / "r1.key"),
        "AA_CA": str(mesh / "ca.pem"),
    }
    alice_env = {**env, "AA_CERT": str(mesh / "alice.pem"), "AA_KEY": str(mesh / "alice.key")}
    router = await asyncio.create_subprocess_exec(
        AA,
        "router",
        "--port",
        "0",
        "--no-discovery",
        "--no-http",
        "--no-anonymous",
        "--crl",
        str(mesh / "crl.pem"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert router.stdout is not None and router.stderr is not None
    sub: asyncio.subprocess.Process | None = None
    try:
        line = await _line(router.stdout, r"listening on 127\.0\.0\.1:\d+")
        endpoint = re.search(r"(127\.0\.0\.1:\d+)", line).group(1)  # type: ignore[union-attr]
        sub = await asyncio.create_subprocess_exec(
            AA,
            "subscribe",
            "--tier",  # says its tier once subscribed: the event below is sent after that
            "--router",
            endpoint,
            "True",
            env=alice_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert sub.stderr is not None
        await _line(sub.stderr, r"runs in the \w+ tier")
        send = run_aa("send", "--router", endpoint, "x=1", env=alice_env)
        assert send.returncode == 0, send.stderr
        assert sub.stdout is not None
        assert "x=1" in await _line(sub.stdout, r"x=1")  # her subscription is live
        # The file changes and the router is told at once (the poll would see it too).
        revoke(mesh, "alice")
        router.send_signal(signal.SIGHUP)
        started = time.monotonic()
        async with asyncio.timeout(5):
            _, err = await sub.communicate()
        assert time.monotonic() - started < 5.0
        assert sub.returncode != 0
        lines = err.decode().strip().splitlines()
        assert len(lines) == 1 and "revoked" in lines[0], lines
        send = run_aa("send", "--router", endpoint, "x=2", env=alice_env)
        assert send.returncode != 0 and "revoked" in send.stderr, send.stderr
        assert len(send.stderr.strip().splitlines()) == 1
    finally:
        if sub is not None and sub.returncode is None:
            sub.kill()
            await sub.wait()
        router.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await router.wait()


# -- safer certificates -----------------------------------------------------------------------


def test_certs_never_overwrite_without_force(mesh: Path) -> None:
    before = (mesh / "r1.pem").read_bytes(), (mesh / "r1.key").read_bytes()
    done = run_aa("certs", "client", str(mesh), "r1")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"aa certs: {mesh / 'r1.pem'} exists already (a router's or a user's): pick another "
        "name, or --force to replace it"
    ]
    assert ((mesh / "r1.pem").read_bytes(), (mesh / "r1.key").read_bytes()) == before
    done = run_aa("certs", "init", str(mesh))
    assert done.returncode == 2 and "exists already" in done.stderr
    done = run_aa("certs", "client", str(mesh), "alice", "--force")
    assert done.returncode == 0, done.stderr
    assert (mesh / "alice.key").stat().st_mode & 0o777 == 0o600


async def test_a_router_certificate_is_no_client(mesh: Path) -> None:
    issue(mesh, "r2", "router", days=30)
    async with Router(RouterConfig(port=0, security=sec(mesh))) as router:
        c = as_user(mesh, router, "r2")
        with pytest.raises(RemoteError, match="is a router's"):
            await c.connect(timeout=10.0)
        await c.aclose()


def _odd_user_certificate(folder: Path, name: str) -> None:
    """A user certificate (unit aa-user) that carries serverAuth too, as a careless CA
    tool might make: it must be neither a client nor a peer."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "aa-user"),
                ]
            )
        )
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=5))
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


async def test_a_user_certificate_with_server_auth_is_no_peer(mesh: Path) -> None:
    _odd_user_certificate(mesh, "mallory")
    from aa.router import MeshConfig

    fast = MeshConfig(retry_base=0.05, retry_max=0.2, retry_jitter=0.0, keepalive=1.0)
    async with Router(RouterConfig(port=0, security=sec(mesh), mesh=fast)) as r1:
        # As a router dialling r1 with it (its id begins with its name, as the rule wants).
        evil = RouterConfig(port=0, security=sec(mesh, "mallory"), peers=(r1.endpoint,), mesh=fast)
        async with Router(evil) as mallory:
            await wait_for(lambda: r1.mesh.counters["refused_peers"] >= 1)
            assert r1.peer_count() == 0 and mallory.peer_count() == 0
        c = as_user(mesh, r1, "mallory")  # nor a client
        with pytest.raises(RemoteError, match="is a router's"):
            await c.connect(timeout=10.0)
        await c.aclose()
