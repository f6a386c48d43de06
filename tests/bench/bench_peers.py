"""Issue 15 benchmark: Aa beside the brokers people use today, in one run on one machine.

    python tests/bench/bench_peers.py                              # all, 5 runs of 100,000 events
    python tests/bench/bench_peers.py --events 10000 --runs 1      # a quick check
    python tests/bench/bench_peers.py --only aa-async --only nats  # some systems only

The workload of bench_router.py: events of five values, one publisher → one broker → one
subscriber, each in its own process, over loopback. Throughput: the publisher sends
--events events as fast as its client takes them; the subscriber measures events/s from its
first event to its last. Latency: the publisher paces --rate events/s (a burst every
millisecond), each event carrying its send time; the subscriber records receive − send and
reports p50/p99/max. Each system gets a fresh broker per run and a 2,000-event warm-up; runs
go round all systems in turn, so that a change in the machine's load hits them alike.

Systems (--only):
  aa-client  Aa router + the blocking `aa.client.Client` at both ends
  aa-async   Aa router + `aa.client.AsyncClient` at both ends
  nats       nats-server (Debian) + nats-py, core NATS (at most once)
  mqtt       Mosquitto (Debian) + paho-mqtt, MQTT 3.1.1 at QoS 0
  mqtt-c     Mosquitto + its C clients mosquitto_pub -l / mosquitto_sub (no Python at all)
  zenoh-router  a Zenoh router (`zenoh.open` with mode "router", its own process) +
             zenoh-python in client mode at both ends, congestion control BLOCK
  zenoh      zenoh-python peer to peer (Rust core), no broker: a reference row only, not a
             target (it skips the hop every other system makes)
Mosquitto and its clients get TCP_NODELAY, which the others have by default.

Aa's clients publish values and subscribe with an `expr` pattern; the Python peers route on a
subject/topic/key and carry the same five values packed with msgpack (the C clients: one
JSON line each). tests/bench/peers/clients.py has the clients, peers/servers.py the brokers.

Installing: the servers come from Debian through apt-get, the peers' Python clients go into
tests/bench/peers/.venv (peers/requirements.txt); peers/setup.sh does both and this script
runs it when something is missing (--no-setup: skip the missing systems instead).

The network stays on this machine: every broker gets a config file that binds one free port
of 127.0.0.1 only, Zenoh's multicast and gossip scouting are off and its sessions (router,
clients, peers) listen and connect on tcp/127.0.0.1 only, Aa's router runs without
discovery; and a guard (peers/loopback.py) lists the TCP/UDP sockets of every process the
benchmark started once a second and stops it, exit status 2, at the first one off loopback.
Every run is bounded in events and in time (a subscriber stops 10 s after its last event,
300 s at most) and stops its broker itself.

Output: JSON lines (tests/bench/common.py `report`): `peers-start` (machine, uptime and load,
versions), one `peers-run` per system and run, one `peers` per system (median events/s of
the runs with min–max, median p99, the CPU µs per event of the broker, of the publisher
while it sends and of the subscriber from its subscription to its last event, events lost),
and
`peers-summary`: the best brokered peer (one broker hop, as Aa: nats, mqtt, mqtt-c,
zenoh-router) and each Aa client's ratio to it, to the best brokered peer with Python
clients (mqtt-c aside), and, as a reference, to Zenoh peer to peer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(PEERS))
import servers  # noqa: E402
from bench_router import process_cpu  # noqa: E402
from clients import DEADLINE_S, IDLE_S, TOPIC, paced, values  # noqa: E402
from common import report  # noqa: E402
from loopback import LoopbackGuard  # noqa: E402

CLIENTS = PEERS / "clients.py"
PEERS_PYTHON = PEERS / ".venv" / "bin" / "python"
# system: (broker, which interpreter runs its clients: "aa" the project's, "peers" the
# peers' environment, None no Python at all)
SYSTEMS: dict[str, tuple[str, str | None]] = {
    "aa-client": ("aa", "aa"),
    "aa-async": ("aa", "aa"),
    "nats": ("nats", "peers"),
    "mqtt": ("mqtt", "peers"),
    "mqtt-c": ("mqtt", None),
    "zenoh-router": ("zenoh-router", "peers"),
    "zenoh": ("zenoh", "peers"),
}
AA_SYSTEMS = ("aa-client", "aa-async")
#: Systems without a broker between publisher and subscriber: printed, never the target.
REFERENCE_SYSTEMS = ("zenoh",)
WARMUP = 2000  # events before each measured run: connections, caches and JITs settle
RUN_S = DEADLINE_S + 30  # a run's hard bound: the subscriber's own deadline, and some
READY_S = 30.0  # a subscriber that has not subscribed by then failed


class RunFailed(RuntimeError):
    pass


def peer_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for cmd in (["nats-server", "--version"], ["mosquitto", "-h"]):
        try:
            text = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
            out[cmd[0]] = text.splitlines()[0].strip() if text else "?"
        except (OSError, subprocess.TimeoutExpired):
            pass
    if PEERS_PYTHON.exists():
        code = (
            "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "('nats-py', 'paho-mqtt', 'eclipse-zenoh', 'msgpack')}))"
        )
        r = subprocess.run(
            [str(PEERS_PYTHON), "-c", code], capture_output=True, text=True, timeout=60
        )
        if r.returncode == 0:
            out.update(json.loads(r.stdout))
    try:
        import importlib.metadata as md

        out["aa-mesh"] = md.version("aa-mesh")
    except Exception:
        pass
    r = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if r.returncode == 0:
        out["aa-commit"] = r.stdout.strip()
    return out


def missing(system: str) -> str | None:
    """Why *system* cannot run here, or None."""
    broker, python = SYSTEMS[system]
    why = servers.installed(broker)
    if why:
        return why
    if python == "peers" and not PEERS_PYTHON.exists():
        return (
            f"no {PEERS_PYTHON.relative_to(HERE.parent.parent)} "
            "(tests/bench/peers/setup.sh makes it)"
        )
    if system == "mqtt-c" and not servers.shutil.which("mosquitto_sub"):
        return "mosquitto-clients is not installed (tests/bench/peers/setup.sh installs it)"
    return None


def next_line(lines: Any, timeout: float) -> str | None:
    import queue

    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None


def python_run(system: str, address: str, n: int, rate: float | None) -> dict[str, Any]:
    """One publisher and one subscriber of *system* (clients.py), *n* events."""
    python = sys.executable if SYSTEMS[system][1] == "aa" else str(PEERS_PYTHON)
    env = {**os.environ, "AA_DISCOVERY_INTERFACES": "lo"}
    base = [python, str(CLIENTS), system]
    sub = subprocess.Popen(
        [*base, "sub", address, "--events", str(n)], stdout=subprocess.PIPE, text=True, env=env
    )
    pub: subprocess.Popen[str] | None = None
    try:
        assert sub.stdout is not None
        lines = servers.line_queue(sub.stdout)
        line = next_line(lines, READY_S)
        if line is None or line.strip() != "ready":
            raise RunFailed(f"{system} subscriber did not get ready: {line!r}")
        extra = ["--rate", str(rate)] if rate else []
        pub = subprocess.Popen(
            [*base, "pub", address, "--events", str(n), *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        # The subscriber reports after its n events, or IDLE_S after its last one; if the
        # publisher failed, or ended without the subscriber getting a thing, do not wait for
        # the subscriber's deadline.
        deadline = time.monotonic() + RUN_S
        pub_done = None
        while True:
            result = next_line(lines, 0.5)
            if result is not None:
                return {**json.loads(result), "pub_cpu_s": publisher_cpu(pub)}
            if pub.poll() is not None:
                if pub.returncode != 0:
                    raise RunFailed(f"{system} publisher failed (exit status {pub.returncode})")
                pub_done = pub_done or time.monotonic()
                if time.monotonic() - pub_done > 2 * IDLE_S:
                    raise RunFailed(f"{system} subscriber got nothing from the publisher")
            if time.monotonic() > deadline:
                raise RunFailed(f"{system} subscriber reported nothing within {RUN_S:.0f} s")
    finally:
        if pub is not None:
            assert pub.stdin is not None
            if not pub.stdin.closed:
                pub.stdin.close()  # the zenoh publisher lingers until then
            try:
                pub.wait(servers.STOP_S)
            except subprocess.TimeoutExpired:
                servers.stop(pub)
        servers.stop(sub)


def publisher_cpu(pub: subprocess.Popen[str]) -> float | None:
    """The CPU seconds the publisher says it spent sending (clients.py `sent()`), once it
    has ended (stdin closed: the zenoh publisher lingers until then)."""
    try:
        out = pub.communicate(timeout=servers.STOP_S)[0]  # closes its stdin
    except subprocess.TimeoutExpired:
        return None
    for line in out.splitlines():
        if line.startswith("{"):
            return float(json.loads(line)["cpu_s"])
    return None


def mqtt_c_run(
    broker: servers.Running, n: int, rate: float | None, tmp: Path, tag: str
) -> dict[str, Any]:
    """Mosquitto's C clients: mosquitto_pub -l publishes one message per line of its stdin,
    mosquitto_sub prints each with its receive time (%U); nothing in Python on the event path
    of the throughput run (its stdin is a file written beforehand)."""
    host, port = broker.address.rsplit(":", 1)
    common = ["-h", host, "-p", port, "-t", TOPIC, "-q", "0", "--nodelay"]
    out_path, in_path = tmp / f"sub-{tag}.out", tmp / f"pub-{tag}.in"
    sub_id = f"bench-sub-c-{tag}"
    with open(out_path, "w") as out:
        sub = subprocess.Popen(
            [
                "mosquitto_sub",
                *common,
                "-i",
                sub_id,
                "-C",
                str(n),
                "-W",
                str(int(DEADLINE_S)),
                "-F",
                "%U %p",
            ],
            stdout=out,
        )
    pub: subprocess.Popen[str] | None = None
    try:
        broker.await_log(f"{sub_id} 0 {TOPIC}", "mosquitto_sub's subscription")
        pub_cmd = ["mosquitto_pub", *common, "-i", f"bench-pub-c-{tag}", "-l"]
        if rate is None:
            with open(in_path, "w") as f:
                now = time.time()
                f.writelines(
                    json.dumps(values(i, now), separators=(",", ":")) + "\n" for i in range(n)
                )
            with open(in_path) as f:
                pub = subprocess.Popen(pub_cmd, stdin=f, text=True)
        else:
            pub = subprocess.Popen(pub_cmd, stdin=subprocess.PIPE, text=True)
            stdin = pub.stdin
            assert stdin is not None

            def send(i: int) -> None:
                stdin.write(json.dumps(values(i, time.time()), separators=(",", ":")) + "\n")
                stdin.flush()

            paced(n, rate, send)
            stdin.close()
        # mosquitto_sub ends after n messages; if some were lost, stop it once its output
        # has not grown for IDLE_S after the publisher finished.
        size, still = -1, time.monotonic()
        deadline = time.monotonic() + RUN_S
        while sub.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            now_size = out_path.stat().st_size
            if now_size != size:
                size, still = now_size, time.monotonic()
            elif pub.poll() is not None and time.monotonic() - still > IDLE_S:
                break
    finally:
        servers.stop(sub)  # type: ignore[arg-type]
        if pub is not None:
            try:
                pub.wait(servers.STOP_S)
            except subprocess.TimeoutExpired:
                servers.stop(pub)
    stamps, lat = [], []
    for line in out_path.read_text().splitlines():
        stamp, _, payload = line.partition(" ")
        try:
            t = float(stamp)
            lat.append(t - json.loads(payload)["Sent"])
        except (ValueError, KeyError):
            continue
        stamps.append(t)
    out_path.unlink()
    in_path.unlink(missing_ok=True)
    result: dict[str, Any] = {
        "got": len(stamps),
        "first": stamps[0] if stamps else 0.0,
        "last": stamps[-1] if stamps else 0.0,
    }
    if len(lat) >= 2:
        lat.sort()
        q = statistics.quantiles(lat, n=100)
        result.update(p50_ms=q[49] * 1000, p99_ms=q[98] * 1000, max_ms=lat[-1] * 1000)
    return result


def per_event(seconds: float | None, n: int) -> float | None:
    return round(seconds / n * 1e6, 2) if seconds is not None and n else None


def measure(system: str, args: argparse.Namespace, tmp: Path, run: int) -> dict[str, Any]:
    """One run of *system*: a fresh broker, a warm-up, throughput, then latency."""
    with servers.start(SYSTEMS[system][0], tmp) as broker:

        def once(n: int, rate: float | None, tag: str) -> dict[str, Any]:
            if system == "mqtt-c":
                return mqtt_c_run(broker, n, rate, tmp, f"{run}-{tag}")
            return python_run(system, broker.address, n, rate)

        once(WARMUP, None, "warm")
        cpu0 = process_cpu(broker.pid) if broker.pid else None
        t = once(args.events, None, "tput")
        cpu = process_cpu(broker.pid) - cpu0 if broker.pid and cpu0 is not None else None
        lat = once(args.latency_events, args.rate, "lat")
    seconds = t["last"] - t["first"]
    return {
        "system": system,
        "run": run,
        "events": t["got"],
        "lost": args.events - t["got"],
        "events_per_s": round(t["got"] / seconds) if seconds > 0 else 0,
        "broker_cpu_us_per_event": round(cpu / t["got"] * 1e6, 2)
        if cpu is not None and t["got"]
        else None,
        "pub_cpu_us_per_event": per_event(t.get("pub_cpu_s"), args.events),
        "sub_cpu_us_per_event": per_event(t.get("cpu_s"), t["got"]),
        "rate": args.rate,
        "latency_events": lat["got"],
        "latency_lost": args.latency_events - lat["got"],
        "p50_ms": round(lat.get("p50_ms", float("nan")), 3),
        "p99_ms": round(lat.get("p99_ms", float("nan")), 3),
        "max_ms": round(lat.get("max_ms", float("nan")), 3),
    }


def summarize(system: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["events_per_s"] for r in runs]
    p99 = [r["p99_ms"] for r in runs]

    def median(key: str) -> float | None:
        got = [r[key] for r in runs if r.get(key) is not None]
        return round(statistics.median(got), 2) if got else None

    return {
        "system": system,
        "runs": len(runs),
        "events_per_s": round(statistics.median(rates)),
        "events_per_s_min": min(rates),
        "events_per_s_max": max(rates),
        "p99_ms": round(statistics.median(p99), 3),
        "p99_ms_min": min(p99),
        "p99_ms_max": max(p99),
        "p50_ms": round(statistics.median(r["p50_ms"] for r in runs), 3),
        "broker_cpu_us_per_event": median("broker_cpu_us_per_event"),
        "pub_cpu_us_per_event": median("pub_cpu_us_per_event"),
        "sub_cpu_us_per_event": median("sub_cpu_us_per_event"),
        "lost": sum(r["lost"] + r["latency_lost"] for r in runs),
    }


def ratios(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The best brokered peer and each Aa client's ratio to it; the same against the best
    brokered peer with Python clients, and against the reference systems (no broker)."""
    out: dict[str, Any] = {}
    rate = {s: v["events_per_s"] for s, v in summaries.items()}
    brokered = [s for s in rate if s not in AA_SYSTEMS and s not in REFERENCE_SYSTEMS]
    python = [s for s in brokered if SYSTEMS[s][1] is not None]
    targets = [("best_peer", brokered), ("best_python_peer", python)]
    targets += [(f"reference_{s}", [s]) for s in REFERENCE_SYSTEMS if s in rate]
    for name, among in targets:
        if not among:
            continue
        best = max(among, key=lambda s: rate[s])
        out[name] = best
        out[f"{name}_events_per_s"] = rate[best]
        for a in AA_SYSTEMS:
            if a in rate and rate[best]:
                out[f"{a}_ratio_to_{name}"] = round(rate[a] / rate[best], 2)
    return out


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--events", type=int, default=100_000, help="events per throughput run (default: 100000)"
    )
    ap.add_argument(
        "--latency-events",
        type=int,
        default=25_000,
        help="events per latency run (default: 25000, 5 s at 5,000 events/s)",
    )
    ap.add_argument(
        "--rate", type=float, default=5000.0, help="events/s of the latency run (default: 5000)"
    )
    ap.add_argument(
        "--runs", type=int, default=5, help="runs per system; the median is reported (default: 5)"
    )
    ap.add_argument(
        "--only",
        action="append",
        metavar="SYSTEM",
        default=None,
        help=f"run only this system (repeatable, or comma-separated): {', '.join(SYSTEMS)}",
    )
    ap.add_argument(
        "--no-setup",
        action="store_true",
        help="do not run tests/bench/peers/setup.sh (apt-get, pip) for what is missing; skip it",
    )
    args = ap.parse_args()
    chosen = [s for item in (args.only or [",".join(SYSTEMS)]) for s in item.split(",") if s]
    unknown = sorted(set(chosen) - set(SYSTEMS))
    if unknown:
        ap.error(f"unknown system {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    if args.events < 2 or args.latency_events < 2 or args.runs < 1 or args.rate <= 0:
        ap.error("--events and --latency-events need at least 2, --runs at least 1, --rate above 0")
    args.systems = [s for s in SYSTEMS if s in chosen]
    return args


def main() -> int:
    args = parse_args()
    start_uptime, start_load = uptime(), os.getloadavg()
    if not args.no_setup and any(missing(s) for s in args.systems):
        env = {**os.environ, "PYTHON": getattr(sys, "_base_executable", sys.executable)}
        subprocess.run(["bash", str(PEERS / "setup.sh")], env=env, check=False)
    skipped = {s: why for s in args.systems if (why := missing(s))}
    systems = [s for s in args.systems if s not in skipped]
    report(
        "peers-start",
        {
            "uptime": start_uptime,
            "load": [round(x, 2) for x in start_load],
            "events": args.events,
            "latency_events": args.latency_events,
            "rate": args.rate,
            "runs": args.runs,
            "systems": systems,
            "versions": peer_versions(),
        },
    )
    for s, why in skipped.items():
        report("peers", {"system": s, "skipped": why})
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    failures = 0
    guard = LoopbackGuard()
    with tempfile.TemporaryDirectory(prefix="aa-bench-peers-") as tmpdir, guard:
        for run in range(1, args.runs + 1):
            for s in systems:
                try:
                    r = measure(s, args, Path(tmpdir), run)
                except (RunFailed, RuntimeError, subprocess.SubprocessError, OSError) as e:
                    failures += 1
                    report("peers-run", {"system": s, "run": run, "error": str(e)})
                    continue
                if guard.found:  # a socket off loopback: stop everything, say which
                    report(
                        "peers-run",
                        {
                            "system": s,
                            "run": run,
                            "error": "socket off loopback",
                            "sockets": guard.found,
                        },
                    )
                    return 2
                results[s].append(r)
                report("peers-run", r)
    summaries = {s: summarize(s, rs) for s, rs in results.items() if rs}
    for s in summaries.values():
        report("peers", s)
    summary: dict[str, Any] = {"uptime_start": start_uptime, "uptime_end": uptime()}
    summary.update(ratios(summaries))
    report("peers-summary", summary)
    return 1 if failures or skipped else 0


if __name__ == "__main__":
    sys.exit(main())
