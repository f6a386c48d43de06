"""Issue 27 benchmark: a flood of anonymous or low-privilege callers against a secured router.

    python tests/bench/bench_flood.py                        # every case, 3 rounds, 10 s each
    python tests/bench/bench_flood.py --cases baseline,tokens --runs 1 --seconds 5
    python tests/bench/bench_flood.py --cases baseline,tokens,tcp --sources 50   # from 50 addresses

One `aa router` process runs with TLS, the mesh CA, `--no-anonymous`, a permissions file and
its HTTPS endpoint. The victim is a legitimate pair of certificate users in one process of
its own: `pub` publishes `--rate` events/s (type `reading`) over TLS TCP, `alice` subscribes
to them; every event's publish-to-delivery latency is measured (p50, p99, max, and how many
never arrived). While the victim runs, one attack runs in its own process (its CPU is not
the victim's), from an address of its own (127.0.0.2; the victim is on 127.0.0.1;
`--sources N` spreads it over N addresses, as a botnet would):

- `anonymous`: HTTPS requests without a token (GET /events, POST /events, POST /clients)
  over `--connections` keep-alive connections;
- `tokens`: bad bearer tokens, every one distinct: half malformed, half well-formed and
  signed by another key (a real ECDSA signature the router must check and refuse);
- `forbidden`: the valid token of `mallory`, a user with no rights (403s);
- `tcp`: the TCP port: connections that never start TLS (held until closed), plaintext
  hellos, and TLS hellos without a client certificate;
- `caps`: `eve`, a user allowed predicates and client caches on a type nobody publishes,
  subscribing distinct patterns over TCP and registering HTTP clients up to her caps, and
  trying on past them.

Each round runs every case in turn against the same router, the baseline (no attack) first,
so that the victim with and without each attack is compared under the same machine load
(the load average is reported with every case). Reported per case: the victim's latency
(median of the rounds' p50/p99 and the worst max), the router's resident memory before,
at its peak during, and 3 s after the attack, and the attack's achieved rate (requests or
connections per second) with its answers counted, and the router's CPU (share of one core)
while the victim ran: on a small machine the attacker's own CPU slows the victim too, and
this figure tells the router's cost apart from the machine's. Target (issue 27): victim p99 under
10 ms, memory bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import AA, report


#: Where the attacks come from: addresses of their own, as a flood from the Internet would
#: (the victim is on 127.0.0.1; `--sources N` spreads each attack over N addresses).
def sources(n: int) -> list[str]:
    return [f"127.0.{2 + i // 250}.{2 + i % 250}" for i in range(n)]


CASES = ("baseline", "anonymous", "tokens", "forbidden", "tcp", "caps")

PERMISSIONS = """\
[users.pub]
publish = ["reading"]

[users.alice]
subscribe = ["reading"]
patterns = "predicates"

[users.mallory]                 # known, with no rights at all

[users.eve]                     # low privilege: her own type, predicates, client caches
subscribe = ["noise"]
patterns = "predicates"
client_caches = true
"""


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu(pid: int) -> float:
    """CPU seconds process *pid* has used (user and system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> float:
    return os.getloadavg()[0]


# -- the router ---------------------------------------------------------------------------------


def make_certs(d: Path) -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization

    from aa.router.security import issue_token
    from aa.tools.certs_cmd import init_ca, issue

    init_ca(d)
    issue(d, "bench", "router", days=2)
    for user in ("pub", "alice", "eve"):
        issue(d, user, "client", days=2)
    (d / "perms.toml").write_text(PERMISSIONS)
    key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), password=None)
    return {u: issue_token(key, u, now=time.time(), days=1) for u in ("mallory", "eve")}  # type: ignore[arg-type]


def start_router(d: Path) -> tuple[subprocess.Popen[str], str, tuple[str, int]]:
    env = {**os.environ, "AA_DISCOVERY_INTERFACES": "lo"}
    cmd = [AA, "router", "--port", "0", "--http-port", "0", "--no-discovery"]
    cmd += ["--cert", str(d / "bench.pem"), "--key", str(d / "bench.key")]
    cmd += ["--ca", str(d / "ca.pem"), "--no-anonymous", "--permissions", str(d / "perms.toml")]
    err = open(d / "router.log", "w")  # noqa: SIM115 (the router's for its life)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, start_new_session=True
    )
    assert proc.stdout is not None
    tcp = re.search(r"listening on (\S+)", proc.stdout.readline())
    http = re.search(r"on https://([\d.]+):(\d+)", proc.stdout.readline())
    if not (tcp and http):
        proc.kill()
        raise RuntimeError("router did not start: " + (d / "router.log").read_text()[-2000:])
    return proc, tcp.group(1), (http.group(1), int(http.group(2)))


# -- the victim ---------------------------------------------------------------------------------


def _config(endpoint: str, d: Path, user: str | None) -> Any:
    from aa.client import ClientConfig

    if user is None:
        return ClientConfig(routers=(endpoint,), ca=d / "ca.pem", cert=None, key=None)
    return ClientConfig(
        routers=(endpoint,), ca=d / "ca.pem", cert=d / f"{user}.pem", key=d / f"{user}.key"
    )


def victim(endpoint: str, d: Path, rate: float, seconds: float, ready: Any, out: Any) -> None:
    from aa.client import AsyncClient

    async def main() -> None:
        latencies: list[float] = []
        n = int(rate * seconds)
        done = asyncio.get_running_loop().create_future()

        def on_event(ev: Any) -> None:
            latencies.append(time.perf_counter() - ev.values["Sent"])
            if len(latencies) >= n and not done.done():
                done.set_result(None)

        async with (
            AsyncClient(config=_config(endpoint, d, "alice")) as sub,
            AsyncClient(config=_config(endpoint, d, "pub")) as pub,
        ):
            await sub.subscribe("Seq >= 0", on_event)
            ready.set()
            start = time.perf_counter()
            for i in range(n):
                wait = start + i / rate - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                pub.publish_nowait({"Seq": i, "Sent": time.perf_counter()}, type="reading")
            try:
                async with asyncio.timeout(10):
                    await done
            except TimeoutError:
                pass
        out.put({"sent": n, "latencies": latencies})

    asyncio.run(main())


# -- the attacks --------------------------------------------------------------------------------


class Http:
    """One keep-alive HTTPS connection, raw: the attacker's CPU goes into requests, not into
    an HTTP library."""

    def __init__(self, address: tuple[str, int], tls: ssl.SSLContext, local: str) -> None:
        self.address, self.tls, self.local = address, tls, local
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, headers: str = "", body: bytes = b"") -> int:
        if self.writer is None:
            try:
                self.reader, self.writer = await asyncio.open_connection(
                    *self.address,
                    ssl=self.tls,
                    server_hostname="localhost",
                    local_addr=(self.local, 0),
                )
            except (OSError, ssl.SSLError):
                await asyncio.sleep(0.01)
                return 0
        assert self.reader is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{headers}"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        try:
            answer = await self.reader.readuntil(b"\r\n\r\n")
            status = int(answer.split(b" ", 2)[1])
            m = re.search(rb"(?i)content-length: (\d+)", answer)
            if m:
                await self.reader.readexactly(int(m.group(1)))
            if re.search(rb"(?i)connection: close", answer):
                self.close()
            return status
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            self.close()
            return 0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def _bad_tokens(n: int) -> list[str]:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    def b64(b: bytes) -> str:
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    other = ec.generate_private_key(ec.SECP256R1())
    out = []
    now = int(time.time())
    for i in range(n):
        if i % 2:
            out.append(f"aa1.{os.urandom(24).hex()}!{i}")  # malformed
            continue
        claims = {"sub": "carol", "iat": now, "exp": now + 86400, "jti": os.urandom(8).hex()}
        signed = "aa1." + b64(json.dumps(claims, separators=(",", ":")).encode())
        sig = other.sign(signed.encode(), ec.ECDSA(hashes.SHA256()))
        out.append(f"{signed}.{b64(sig)}")
    return out


async def _http_flood(
    address: tuple[str, int],
    d: Path,
    token_of: Any,
    connections: int,
    local: list[str],
    stop: Any,
) -> Counter[int]:
    tls = ssl.create_default_context(cafile=str(d / "ca.pem"))
    statuses: Counter[int] = Counter()
    routes = [
        ("GET", "/events?since=1h", b""),
        ("POST", "/events", b'{"type": "reading", "values": {"x": 1}}'),
        ("POST", "/clients", b'{"name": "x", "patterns": [{"source": "x > 1"}]}'),
    ]

    async def one(k: int) -> None:
        conn = Http(address, tls, local[k % len(local)])
        i = k
        while not stop.is_set():
            method, path, body = routes[i % len(routes)]
            token = token_of(i)
            headers = f"Authorization: Bearer {token}\r\n" if token else ""
            statuses[await conn.request(method, path, headers, body)] += 1
            i += connections
        conn.close()

    await asyncio.gather(*(one(k) for k in range(connections)))
    return statuses


async def _tcp_flood(
    endpoint: str, d: Path, connections: int, local: list[str], stop: Any
) -> Counter[str]:
    from aa.mesh import Connection
    from aa.mesh.protocol import Hello

    host, port = endpoint.rsplit(":", 1)
    tls = ssl.create_default_context(cafile=str(d / "ca.pem"))  # no client certificate
    counts: Counter[str] = Counter()

    async def silent(k: int) -> None:  # opens, never starts TLS, waits to be closed
        while not stop.is_set():
            try:
                r, w = await asyncio.open_connection(
                    host, int(port), local_addr=(local[k % len(local)], 0)
                )
                counts["silent"] += 1
                while not stop.is_set():
                    try:
                        async with asyncio.timeout(0.5):
                            if await r.read(1024) == b"":
                                break
                    except TimeoutError:
                        continue
                w.close()
            except OSError:
                counts["error"] += 1
                await asyncio.sleep(0.05)

    async def hello(secure: bool, k: int) -> None:
        name = "tls-hello" if secure else "plain-hello"
        i = 0
        while not stop.is_set():
            i += 1
            try:
                r, w = await asyncio.open_connection(
                    host,
                    int(port),
                    ssl=tls if secure else None,
                    server_hostname=host if secure else None,
                    local_addr=(local[k % len(local)], 0),
                )
                w.write(Connection().send(Hello(client_id=f"x{os.getpid()}-{i}")))
                async with asyncio.timeout(5):
                    await r.read(65536)
                w.close()
                counts[name] += 1
            except (OSError, TimeoutError, ssl.SSLError):
                counts["error"] += 1

    await asyncio.gather(
        *(silent(k) for k in range(connections)),
        *(hello(False, k) for k in range(connections // 4)),
        *(hello(True, k) for k in range(connections // 4)),
    )
    return counts


async def _caps_flood(
    endpoint: str, address: tuple[str, int], d: Path, token: str, local: list[str], stop: Any
) -> Counter[str]:
    from aa.client import AsyncClient

    counts: Counter[str] = Counter()
    tls = ssl.create_default_context(cafile=str(d / "ca.pem"))

    async def patterns(k: int) -> None:
        async with AsyncClient(config=_config(endpoint, d, "eve")) as c:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    await c.subscribe(f"Seq > {k * 1_000_000 + i}")
                    counts["subscribed"] += 1
                except Exception:
                    counts["refused"] += 1
                    await asyncio.sleep(0.01)

    async def clients(k: int) -> None:
        conn = Http(address, tls, local[k % len(local)])
        pats = ",".join(f'{{"source": "Seq > {j}"}}' for j in range(16))
        body = f'{{"name": "eve", "patterns": [{pats}]}}'.encode()
        while not stop.is_set():
            status = await conn.request(
                "POST", "/clients", f"Authorization: Bearer {token}\r\n", body
            )
            counts[f"http-{status}"] += 1
        conn.close()

    await asyncio.gather(*(patterns(k) for k in range(4)), *(clients(k) for k in range(4)))
    return counts


def attacker(
    case: str,
    endpoint: str,
    address: tuple[str, int],
    d: Path,
    tokens: dict[str, str],
    connections: int,
    local: list[str],
    started: Any,
    stop: Any,
    out: Any,
) -> None:
    bad = _bad_tokens(20_000) if case == "tokens" else []

    async def main() -> Counter[Any]:
        def http(token_of: Any) -> Any:
            return _http_flood(address, d, token_of, connections, local, stop)

        if case == "anonymous":
            return await http(lambda i: None)
        if case == "tokens":
            return await http(lambda i: bad[i % len(bad)])
        if case == "forbidden":
            return await http(lambda i: tokens["mallory"])
        if case == "tcp":
            return await _tcp_flood(endpoint, d, connections, local, stop)
        return await _caps_flood(endpoint, address, d, tokens["eve"], local, stop)

    started.set()
    t0 = time.perf_counter()
    counts = asyncio.run(main())
    seconds = time.perf_counter() - t0
    out.put({"seconds": seconds, "counts": {str(k): v for k, v in counts.items()}})


# -- one case -----------------------------------------------------------------------------------


def run_case(
    case: str,
    router: subprocess.Popen[str],
    endpoint: str,
    address: tuple[str, int],
    d: Path,
    tokens: dict[str, str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    before = rss(router.pid)
    uptime = load()
    stop, started, attack_out = ctx.Event(), ctx.Event(), ctx.Queue()
    attack = None
    if case != "baseline":
        attack = ctx.Process(
            target=attacker,
            args=(
                case,
                endpoint,
                address,
                d,
                tokens,
                args.connections,
                sources(args.sources),
                started,
                stop,
                attack_out,
            ),
        )
        attack.start()
        started.wait(60)
        time.sleep(1.0)  # let the flood reach its pace before the victim starts
    ready, out = ctx.Event(), ctx.Queue()
    vic = ctx.Process(target=victim, args=(endpoint, d, args.rate, args.seconds, ready, out))
    vic.start()
    peak = rss(router.pid)
    cpu0, t0 = cpu(router.pid), time.monotonic()
    got = None
    while got is None:
        try:
            got = out.get(timeout=0.2)
        except Exception:
            peak = max(peak, rss(router.pid))
            if not vic.is_alive() and out.empty():
                stop.set()
                raise RuntimeError(f"the victim failed ({case})") from None
    router_cpu = (cpu(router.pid) - cpu0) / (time.monotonic() - t0)
    vic.join(30)
    attack_figures: dict[str, Any] = {}
    if attack is not None:
        stop.set()
        a = attack_out.get(timeout=60)
        attack.join(30)
        total = sum(v for k, v in a["counts"].items() if k not in ("silent",))
        attack_figures = {
            "attack_per_s": round(total / a["seconds"]),
            "attack_counts": a["counts"],
        }
        time.sleep(3.0)  # what the router gives back once the attack is over
    lat = sorted(got["latencies"])
    ms = [x * 1000 for x in lat]

    def pct(p: float) -> float:
        return round(ms[min(len(ms) - 1, int(p * len(ms)))], 2) if ms else float("nan")

    return {
        "case": case,
        "load1": round(uptime, 2),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": round(ms[-1], 2) if ms else None,
        "lost": got["sent"] - len(lat),
        "router_cpu": round(router_cpu, 2),
        "rss_before_mb": round(before / 2**20, 1),
        "rss_peak_mb": round(peak / 2**20, 1),
        "rss_after_mb": round(rss(router.pid) / 2**20, 1),
        **attack_figures,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES)
    )
    ap.add_argument("--runs", type=int, default=3, help="rounds of every case")
    ap.add_argument("--seconds", type=float, default=10.0, help="the victim's time per case")
    ap.add_argument("--rate", type=float, default=200.0, help="the victim's events/s")
    ap.add_argument("--connections", type=int, default=64, help="the attacker's connections")
    ap.add_argument(
        "--sources", type=int, default=1, help="addresses the attack comes from (127.0.x.y)"
    )
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            ap.error(f"unknown case {c!r}")
    d = Path(tempfile.mkdtemp(prefix="aa-bench-flood-"))
    tokens = make_certs(d)
    router, endpoint, address = start_router(d)
    rounds: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    try:
        for r in range(args.runs):
            for case in cases:
                fig = run_case(case, router, endpoint, address, d, tokens, args)
                rounds[case].append(fig)
                print(json.dumps({"round": r + 1, **fig}), file=sys.stderr, flush=True)
    finally:
        router.terminate()
        router.wait(10)
    for case, figs in rounds.items():
        report(
            f"flood-{case}",
            {
                "rounds": len(figs),
                "rate": args.rate,
                "seconds": args.seconds,
                "load1": [f["load1"] for f in figs],
                "p50_ms": statistics.median(f["p50_ms"] for f in figs),
                "p99_ms": statistics.median(f["p99_ms"] for f in figs),
                "p99_ms_each": [f["p99_ms"] for f in figs],
                "max_ms": max(f["max_ms"] or 0 for f in figs),
                "lost": sum(f["lost"] for f in figs),
                "router_cpu": [f["router_cpu"] for f in figs],
                "rss_mb_before_peak_after": [
                    [f["rss_before_mb"], f["rss_peak_mb"], f["rss_after_mb"]] for f in figs
                ],
                "attack_per_s": [f.get("attack_per_s") for f in figs],
                "sources": args.sources,
                "connections": args.connections,
                "target_p99_ms": 10.0,
            },
        )


if __name__ == "__main__":
    main()
