"""Issue 5 benchmark: 1,000 registered HTTP clients polling one router's feeds.

    python tests/bench/bench_http.py                  # polls from wrk (Debian package wrk), 10 s
    python tests/bench/bench_http.py --tool httpx     # the same polls from httpx in this process
    python tests/bench/bench_http.py --poll-rate 1000 --rate 200 --subscribers 200
                                                      # issue 16: 1,000 phones polling each second
                                                      # beside 200 events/s to 200 TCP subscribers

`aa router` runs in its own process with HTTP on. Each client has one of ten patterns and the
default cache policy; a publisher sends `--rate` events/s over TCP while the clients poll,
so some polls find new entries (200, Atom rendered) and most do not (304 to If-None-Match).
Each poll is one client's conditional GET of its feed after its cursor, with its token,
round-robin over the clients, `--concurrency` polls in flight on a pooled keep-alive client;
a poll that finds new entries moves the client's cursor past them (the poll of the new
position counts too), as a phone does. Reported: polls/s,
latency p50/p99/max, the count of each status.

Target (issue 5): at least 1,000 polls/s with p99 under 50 ms, 304 answers included.

`--poll-rate N` polls open-loop instead (issue 16): N polls/s on a fixed schedule from wrk
(each client in turn, so 1,000 clients at 1,000/s is each phone once a second) over
`--concurrency` keep-alive connections (default 50), a poll's latency counted from its
scheduled time (wrk2's correction for coordinated omission, in the Lua script), while a
second process holds `--subscribers` TCP clients subscribed to every event and the
publisher. wrk is C: 1,000 polls/s cost it a few percent of a core, where this process's
own Python client ran out of CPU at about 300. Reported besides: the router's CPU (share of
one core) and the load average. Target (issue 16): p99 under 50 ms at 1,000 polls/s beside
200 events/s to 200 subscribers:

    python tests/bench/bench_http.py --poll-rate 1000 --rate 200 --subscribers 200

wrk is the Debian package wrk; the benchmark installs it with apt-get when it runs as root.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from common import AA, report

ROOMS = 10


def start_router() -> tuple[subprocess.Popen[str] | None, str, str]:
    env = {**os.environ, "AA_DISCOVERY_INTERFACES": "lo"}
    proc = subprocess.Popen(
        [AA, "router", "--port", "0", "--http-port", "0", "--no-discovery"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        # A session of its own: where the kernel groups CPU time by session (autogroup,
        # Linux's desktop default), the router would otherwise share one group's time with
        # the load generators it is measured against.
        start_new_session=True,
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
        r = await http.post(
            "/clients",
            json={"name": f"bench-{k}", "patterns": [{"source": f"Room == 'r{k % ROOMS}'"}]},
        )
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
            await c.publish(
                {"Room": f"r{sent % ROOMS}", "Temperature": 20 + sent % 10, "Seq": sent}
            )
            sent += 1
            delay = start + sent / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
    return sent


async def poll_with_httpx(
    base: str, clients: list, seconds: float, concurrency: int, tcp: str, rate: float
) -> dict:
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
                r = await http.get(
                    url, params={"after": cursors[k]}, headers={**auth, "If-None-Match": etags[k]}
                )
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
  for _, t in ipairs(threads) do
    a = a + t:get("n200"); b = b + t:get("n304"); c = c + t:get("nother")
  end
  local e = summary.errors
  io.write(string.format(
    "AA polls=%%d seconds=%%.3f p50=%%.3f p99=%%.3f max=%%.3f errors=%%d "
      .. "s200=%%d s304=%%d other=%%d\\n",
    summary.requests, summary.duration / 1e6,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000, e.connect + e.read + e.write + e.timeout + e.status, a, b, c))
end
"""


async def poll_with_wrk(
    base: str, clients: list, seconds: float, concurrency: int, tcp: str, rate: float
) -> dict:
    """The same polls from wrk, `concurrency` threads of one connection each. Every client's
    cursor and ETag are fetched first, as in the httpx run."""
    async with httpx.AsyncClient(base_url=base) as http:
        rows = []
        for url, auth in clients:
            cursor = (await http.get(url, headers=auth)).headers["aa-cursor"]
            etag = (await http.get(url, params={"after": cursor}, headers=auth)).headers["etag"]
            token = auth["Authorization"].split()[1]
            rows.append(f'{{"{url}", "{token}", "{cursor}", {etag!r}}}')
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_SCRIPT % (concurrency, ",\n".join(rows)))
    stop = asyncio.Event()
    pub = asyncio.create_task(publisher(tcp, rate, stop))
    proc = await asyncio.create_subprocess_exec(
        "wrk",
        f"-t{concurrency}",
        f"-c{concurrency}",
        f"-d{int(seconds)}s",
        "-s",
        f.name,
        base,
        stdout=subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    stop.set()
    published = await pub
    os.unlink(f.name)
    m = re.search(
        r"AA polls=(\d+) seconds=([\d.]+) p50=([\d.]+) p99=([\d.]+) max=([\d.]+) errors=(\d+) "
        r"s200=(\d+) s304=(\d+) other=(\d+)",
        out.decode(),
    )
    if not m:
        raise RuntimeError(out.decode())
    polls, secs = int(m.group(1)), float(m.group(2))
    return {
        "polls": polls,
        "polls_per_s": round(polls / secs),
        "p50_ms": float(m.group(3)),
        "p99_ms": float(m.group(4)),
        "max_ms": float(m.group(5)),
        "errors": int(m.group(6)),
        "statuses": {"200": int(m.group(7)), "304": int(m.group(8)), "other": int(m.group(9))},
        "published": published,
    }


PACED_SCRIPT = """
-- Open loop, as wrk2 does: each wrk thread (one connection) sends its polls on a fixed
-- schedule, RATE a second, and a poll's latency counts from when it was DUE, not from when
-- it was sent, so a server that falls behind is charged for the wait (no coordinated
-- omission). Thread t polls clients t+1, t+1+STEP, ... (each client is one thread's, as a
-- phone is one), each once a second when STEP * RATE = the number of clients.
local ffi = require("ffi")
ffi.cdef[[
  typedef struct { long tv_sec; long tv_nsec; } aa_ts;
  int clock_gettime(int, aa_ts *);
]]
local ts = ffi.new("aa_ts")
local function now()
  ffi.C.clock_gettime(1, ts); return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
local STEP, RATE = %d, %f
local clients = {%s}
local etag, cursor = {}, {}
for k, c in ipairs(clients) do cursor[k] = c[3]; etag[k] = c[4] end
local i, cur, sent, t0, due = 0, 0, 0, 0, 0
lat, n200, n304, nother = {}, 0, 0, 0
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("slot", #threads - 1)
end

function init(args)
  i = slot + 1 - STEP
  t0 = now() + 0.2 + slot / (STEP * RATE)   -- threads staggered over one schedule step
end

function delay()   -- ms until the next poll is due (wrk's timers count whole ms: round up)
  local d = (t0 + sent / RATE - now()) * 1000
  if d <= 0 then return 0 end
  return math.ceil(d)
end

function request()
  due = t0 + sent / RATE
  sent = sent + 1
  i = i + STEP
  if i > #clients then i = slot + 1 end
  cur = i
  local c = clients[i]
  local h = {["Authorization"] = "Bearer " .. c[2]}
  if etag[i] then h["If-None-Match"] = etag[i] end
  return wrk.format("GET", c[1] .. "?after=" .. cursor[i], h)
end

function response(status, headers, body)
  lat[#lat + 1] = (now() - due) * 1000
  if status == 200 then
    n200 = n200 + 1
    local moved = headers["aa-cursor"]
    if moved ~= cursor[cur] then   -- new entries, taken: the next poll is after them
      cursor[cur] = moved
      etag[cur] = nil
    else                           -- nothing new: poll conditionally next time
      etag[cur] = headers["etag"]
    end
  elseif status == 304 then
    n304 = n304 + 1
  else
    nother = nother + 1
  end
end

function done(summary, latency, requests)
  local all, a, b, c = {}, 0, 0, 0
  for _, t in ipairs(threads) do
    for _, v in ipairs(t:get("lat")) do all[#all + 1] = v end
    a = a + t:get("n200"); b = b + t:get("n304"); c = c + t:get("nother")
  end
  table.sort(all)
  local function pct(p) return all[math.max(1, math.ceil(#all * p / 100))] or 0 end
  local e = summary.errors
  io.write(string.format(
    "AA polls=%%d seconds=%%.3f p50=%%.3f p99=%%.3f max=%%.3f errors=%%d "
      .. "s200=%%d s304=%%d other=%%d\\n",
    #all, summary.duration / 1e6, pct(50), pct(99), all[#all] or 0,
    e.connect + e.read + e.write + e.timeout + e.status, a, b, c))
end
"""


def ensure_wrk() -> None:
    """wrk (Debian package wrk, C with LuaJIT) polls; installed through apt-get when we are
    root, as tests/bench/peers/setup.sh installs nats-server."""
    if shutil.which("wrk"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SystemExit("bench_http: install wrk (Debian package wrk), or poll with --tool httpx")
    print("bench_http: installing wrk", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "wrk"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )


async def _load(endpoint: str, rate: float, n: int, seconds: float, ready: Any) -> tuple[int, int]:
    """*n* TCP clients subscribed to every event, reading all they get, and a publisher of
    *rate* events/s for *seconds* once they are subscribed; (events published, received)."""
    from aa.client import AsyncClient

    got = 0

    def count(event: object) -> None:
        nonlocal got
        got += 1

    stop = asyncio.Event()
    subscribed = 0

    async def one() -> None:
        nonlocal subscribed
        async with AsyncClient(endpoint) as c:
            await c.subscribe("True", count)
            subscribed += 1
            await stop.wait()

    tasks = [asyncio.create_task(one()) for _ in range(n)]
    while subscribed < n:
        if any(t.done() for t in tasks):
            await asyncio.gather(*tasks)  # raises what failed
        await asyncio.sleep(0.05)
    ready.send("ready")
    pub = asyncio.create_task(publisher(endpoint, rate, stop))
    await asyncio.sleep(seconds)
    stop.set()
    published = await pub
    await asyncio.gather(*tasks, return_exceptions=True)
    return published, got


def _load_process(endpoint: str, rate: float, n: int, seconds: float, pipe: Any) -> None:
    # Behind the router for the CPU: on a small machine, 200 Python subscribers decoding
    # 40,000 events/s would otherwise take the router's core, and the router is measured.
    os.nice(10)
    pipe.send(asyncio.run(_load(endpoint, rate, n, seconds, pipe)))


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system) a process has used so far; 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def poll_open_loop(
    base: str,
    clients: list,
    seconds: float,
    concurrency: int,
    tcp: str,
    rate: float,
    poll_rate: float,
    n_subscribers: int,
    router_pid: int | None = None,
) -> dict:
    """Polls on a fixed schedule from wrk (see PACED_SCRIPT), while another process holds
    the TCP subscribers and the publisher: this one only waits, so neither load generator
    takes its CPU from the other."""
    ensure_wrk()
    async with httpx.AsyncClient(base_url=base) as http:
        rows = []
        for url, auth in clients:
            cursor = (await http.get(url, headers=auth)).headers["aa-cursor"]
            etag = (await http.get(url, params={"after": cursor}, headers=auth)).headers["etag"]
            token = auth["Authorization"].split()[1]
            rows.append(f'{{"{url}", "{token}", "{cursor}", {etag!r}}}')
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(PACED_SCRIPT % (concurrency, poll_rate / concurrency, ",\n".join(rows)))
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    load = ctx.Process(
        target=_load_process, args=(tcp, rate, n_subscribers, seconds + 1.0, theirs), daemon=True
    )
    load.start()
    try:
        await asyncio.to_thread(mine.recv)  # "ready": every subscriber subscribed
        load0 = os.getloadavg()
        cpu0, t0 = cpu_seconds(router_pid), time.perf_counter()
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = await asyncio.create_subprocess_exec(
            "wrk",
            f"-t{concurrency}",
            f"-c{concurrency}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "30s",
            "-s",
            f.name,
            base,
            stdout=subprocess.PIPE,
            start_new_session=True,  # as the router's
        )
        out, _ = await proc.communicate()
        elapsed = time.perf_counter() - t0
        router_cpu = (cpu_seconds(router_pid) - cpu0) / elapsed
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # wrk, waited for
        wrk_cpu = (
            children.ru_utime + children.ru_stime - children0.ru_utime - children0.ru_stime
        ) / elapsed
        published, received = await asyncio.to_thread(mine.recv)
    finally:
        load.join(timeout=30)
        if load.is_alive():
            load.kill()
        os.unlink(f.name)
    m = re.search(
        r"AA polls=(\d+) seconds=([\d.]+) p50=([\d.]+) p99=([\d.]+) max=([\d.]+) errors=(\d+) "
        r"s200=(\d+) s304=(\d+) other=(\d+)",
        out.decode(),
    )
    if not m:
        raise RuntimeError(out.decode())
    polls, secs = int(m.group(1)), float(m.group(2))
    return {
        "polls": polls,
        "polls_per_s": round(polls / secs),
        "p50_ms": round(float(m.group(3)), 2),
        "p99_ms": round(float(m.group(4)), 2),
        "max_ms": round(float(m.group(5)), 2),
        "errors": int(m.group(6)),
        "statuses": {"200": int(m.group(7)), "304": int(m.group(8)), "other": int(m.group(9))},
        "published": published,
        "subscribers": n_subscribers,
        "received": received,
        "router_cpu_share": round(router_cpu, 2),  # of one core, polls + events together
        "wrk_cpu_share": round(wrk_cpu, 2),
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


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
        tool = "open-loop" if args.poll_rate else args.tool
        if args.concurrency is None:
            args.concurrency = 50 if args.poll_rate else 4
        if tool == "wrk" and shutil.which("wrk") is None:
            print(
                "bench_http: wrk is not installed (Debian package wrk); polling with httpx",
                file=sys.stderr,
            )
            tool = "httpx"
        if tool == "open-loop":
            figures = await poll_open_loop(
                base,
                clients,
                args.seconds,
                args.concurrency,
                tcp,
                args.rate,
                args.poll_rate,
                args.subscribers,
                proc.pid if proc else None,
            )
            ok = figures["p99_ms"] < 50 and figures["polls_per_s"] >= 0.95 * args.poll_rate
        elif tool == "wrk":
            figures = await poll_with_wrk(
                base, clients, args.seconds, args.concurrency, tcp, args.rate
            )
        else:
            figures = await poll_with_httpx(
                base, clients, args.seconds, args.concurrency, tcp, args.rate
            )
        if tool != "open-loop":
            ok = figures["polls_per_s"] >= 1000 and figures["p99_ms"] < 50
        report(
            "http-poll",
            {
                "tool": tool,
                "clients": args.clients,
                "concurrency": args.concurrency,
                "register_s": round(registering, 2),
                **figures,
                "target_met": ok,
            },
        )
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="connections polling (wrk: threads of one connection each); 4, or 50 open-loop",
    )
    p.add_argument(
        "--rate", type=float, default=2.0, help="events/s published (over TCP) while polling"
    )
    p.add_argument(
        "--tool",
        choices=("wrk", "httpx"),
        default="wrk",
        help="what polls: wrk (C; the default when installed) or httpx in this process "
        "(which, on a 2-core machine, is the bottleneck before the router is)",
    )
    p.add_argument(
        "--poll-rate",
        type=float,
        default=0.0,
        help="poll open-loop at this many polls/s (issue 16: 1000), instead of as fast as possible",
    )
    p.add_argument(
        "--subscribers", type=int, default=0, help="TCP subscribers to every event (issue 16: 200)"
    )
    p.add_argument(
        "--http",
        metavar="URL",
        help="poll this running router's HTTP endpoint instead of starting one",
    )
    p.add_argument(
        "--router", metavar="H:P", help="its TCP endpoint (for the publisher), with --http"
    )
    asyncio.run(main(p.parse_args()))
