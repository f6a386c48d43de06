"""Issue 5 benchmark: 1,000 registered HTTP clients polling one router's feeds.

    python tests/bench/bench_http.py                  # polls from wrk (Debian package wrk), 10 s
    python tests/bench/bench_http.py --tool httpx     # the same polls from httpx in this process

`aa router` runs in its own process with HTTP on. Each client has one of ten patterns and the
default cache policy; a publisher sends `--rate` events/s over TCP while the clients poll,
so some polls find new entries (200, Atom rendered) and most do not (304 to If-None-Match).
Each poll is one client's conditional GET of its feed after its cursor, with its token,
round-robin over the clients, `--concurrency` polls in flight on a pooled keep-alive client;
a poll that finds new entries moves the client's cursor past them (the poll of the new
position counts too), as a phone does. Reported: polls/s,
latency p50/p99/max, the count of each status.

Target (issue 5): at least 1,000 polls/s with p99 under 50 ms, 304 answers included.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from common import AA, report  # noqa: E402

ROOMS = 10


def start_router() -> tuple[subprocess.Popen[str] | None, str, str]:
    env = {**os.environ, "AA_DISCOVERY_INTERFACES": "lo"}
    proc = subprocess.Popen(
        [AA, "router", "--port", "0", "--http-port", "0", "--no-discovery"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    assert proc.stdout is not None
    tcp = re.search(r"listening on (\S+)", proc.stdout.readline())
    http = re.search(r"on (http://\S+)", proc.stdout.readline())
    if not (tcp and http):
        proc.kill()
        raise RuntimeError("router did not start")
    return proc, tcp.group(1), http.group(1).rstrip("/")


async def register(http: httpx.AsyncClient, n: int) -> list[tuple[str, dict[str, str]]]:
    async def one(k: int) -> tuple[str, dict[str, str]]:
        r = await http.post("/clients", json={"name": f"bench-{k}", "patterns": [{"source": f"Room == 'r{k % ROOMS}'"}]})
        r.raise_for_status()
        c = r.json()
        return f"/clients/{c['id']}/feed", {"Authorization": f"Bearer {c['token']}"}

    out = []
    for start in range(0, n, 100):
        out += await asyncio.gather(*(one(k) for k in range(start, min(n, start + 100))))
    return out


async def publisher(endpoint: str, rate: float, stop: asyncio.Event) -> int:
    from aa.client import AsyncClient

    sent = 0
    if rate <= 0:
        return 0
    async with AsyncClient(endpoint) as c:
        start = time.perf_counter()
        while not stop.is_set():
            await c.publish({"Room": f"r{sent % ROOMS}", "Temperature": 20 + sent % 10, "Seq": sent})
            sent += 1
            delay = start + sent / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
    return sent


async def poll_with_httpx(base: str, clients: list, seconds: float, concurrency: int, tcp: str, rate: float) -> dict:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as http:
        etags: dict[int, str] = {}
        cursors: dict[int, str] = {}
        for k, (url, auth) in enumerate(clients):  # warm up: every client polls once
            r = await http.get(url, headers=auth)
            etags[k], cursors[k] = r.headers["etag"], r.headers["aa-cursor"]
        stop = asyncio.Event()
        pub = asyncio.create_task(publisher(tcp, rate, stop))
        order = itertools.cycle(range(len(clients)))
        latencies: list[float] = []
        statuses: Counter[int] = Counter()
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                k = next(order)
                url, auth = clients[k]
                t0 = time.perf_counter()
                r = await http.get(url, params={"after": cursors[k]}, headers={**auth, "If-None-Match": etags[k]})
                latencies.append(time.perf_counter() - t0)
                statuses[r.status_code] += 1
                if r.status_code == 200:  # a phone takes the new entries and polls after them
                    r2 = await http.get(url, params={"after": r.headers["aa-cursor"]}, headers=auth)
                    etags[k], cursors[k] = r2.headers["etag"], r2.headers["aa-cursor"]

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        stop.set()
        published = await pub
    latencies.sort()
    return {
        "polls": len(latencies),
        "polls_per_s": round(len(latencies) / elapsed),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
        "max_ms": round(latencies[-1] * 1000, 2),
        "statuses": dict(statuses),
        "published": published,
    }


WRK_SCRIPT = """
-- Each wrk thread has its own Lua state and ONE connection, so its requests and responses
-- alternate and `cur` names the client a response is for. Thread t polls clients t+1,
-- t+1+STEP, …, so each client is one thread's, as a phone is one.
local STEP = %d
local clients = {%s}
local etag, cursor = {}, {}
for k, c in ipairs(clients) do cursor[k] = c[3]; etag[k] = c[4] end
local i, cur = 0, 0
n200, n304, nother = 0, 0, 0
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("slot", #threads - 1)
end

function init(args)
  i = slot + 1 - STEP
end

function request()
  i = i + STEP
  if i > #clients then i = slot + 1 end
  cur = i
  local c = clients[i]
  local h = {["Authorization"] = "Bearer " .. c[2]}
  if etag[i] then h["If-None-Match"] = etag[i] end
  return wrk.format("GET", c[1] .. "?after=" .. cursor[i], h)
end

function response(status, headers, body)
  if status == 200 then
    n200 = n200 + 1
    local moved = headers["aa-cursor"]
    if moved ~= cursor[cur] then   -- new entries: a phone takes them and polls after them
      cursor[cur] = moved
      etag[cur] = nil
    else
      etag[cur] = headers["etag"]
    end
  elseif status == 304 then
    n304 = n304 + 1
  else
    nother = nother + 1
  end
end

function done(summary, latency, requests)
  local a, b, c = 0, 0, 0
  for _, t in ipairs(threads) do a = a + t:get("n200"); b = b + t:get("n304"); c = c + t:get("nother") end
  local e = summary.errors
  io.write(string.format("AA polls=%%d seconds=%%.3f p50=%%.3f p99=%%.3f max=%%.3f errors=%%d s200=%%d s304=%%d other=%%d\\n",
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000, e.connect + e.read + e.write + e.timeout + e.status, a, b, c))
end
"""


async def poll_with_wrk(base: str, clients: list, seconds: float, concurrency: int, tcp: str, rate: float) -> dict:
    """The same polls from wrk, `concurrency` threads of one connection each. Every client's
    cursor and ETag are fetched first, as in the httpx run."""
    async with httpx.AsyncClient(base_url=base) as http:
        rows = []
        for url, auth in clients:
            cursor = (await http.get(url, headers=auth)).headers["aa-cursor"]
            etag = (await http.get(url, params={"after": cursor}, headers=auth)).headers["etag"]
            rows.append('{"%s", "%s", "%s", %r}' % (url, auth["Authorization"].split()[1], cursor, etag))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_SCRIPT % (concurrency, ",\n".join(rows)))
    stop = asyncio.Event()
    pub = asyncio.create_task(publisher(tcp, rate, stop))
    proc = await asyncio.create_subprocess_exec(
        "wrk", f"-t{concurrency}", f"-c{concurrency}", f"-d{int(seconds)}s", "-s", f.name, base,
        stdout=subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    stop.set()
    published = await pub
    os.unlink(f.name)
    m = re.search(r"AA polls=(\d+) seconds=([\d.]+) p50=([\d.]+) p99=([\d.]+) max=([\d.]+) errors=(\d+) "
                  r"s200=(\d+) s304=(\d+) other=(\d+)", out.decode())
    if not m:
        raise RuntimeError(out.decode())
    polls, secs = int(m.group(1)), float(m.group(2))
    return {"polls": polls, "polls_per_s": round(polls / secs), "p50_ms": float(m.group(3)),
            "p99_ms": float(m.group(4)), "max_ms": float(m.group(5)), "errors": int(m.group(6)),
            "statuses": {"200": int(m.group(7)), "304": int(m.group(8)), "other": int(m.group(9))},
            "published": published}


async def main(args: argparse.Namespace) -> None:
    if args.http:  # a router that is already running
        proc, tcp, base = None, args.router, args.http.rstrip("/")
    else:
        proc, tcp, base = start_router()
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            t0 = time.perf_counter()
            clients = await register(http, args.clients)
            registering = time.perf_counter() - t0
        tool = args.tool
        if tool == "wrk" and shutil.which("wrk") is None:
            print("bench_http: wrk is not installed (Debian package wrk); polling with httpx", file=sys.stderr)
            tool = "httpx"
        if tool == "wrk":
            figures = await poll_with_wrk(base, clients, args.seconds, args.concurrency, tcp, args.rate)
        else:
            figures = await poll_with_httpx(base, clients, args.seconds, args.concurrency, tcp, args.rate)
        ok = figures["polls_per_s"] >= 1000 and figures["p99_ms"] < 50
        report("http-poll", {"tool": tool, "clients": args.clients, "concurrency": args.concurrency,
                             "register_s": round(registering, 2), **figures, "target_met": ok})
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=4, help="polls in flight (wrk: threads of one connection each)")
    p.add_argument("--rate", type=float, default=2.0, help="events/s published (over TCP) while polling")
    p.add_argument("--tool", choices=("wrk", "httpx"), default="wrk",
                   help="what polls: wrk (C; the default when installed) or httpx in this process "
                   "(which, on a 2-core machine, is the bottleneck before the router is)")
    p.add_argument("--http", metavar="URL", help="poll this running router's HTTP endpoint instead of starting one")
    p.add_argument("--router", metavar="H:P", help="its TCP endpoint (for the publisher), with --http")
    asyncio.run(main(p.parse_args()))
