"""The brokers of bench_peers.py, each started for one run on a free port of 127.0.0.1 from
a config file written for it that binds loopback only, and stopped by the same run.

    with start("nats", tmpdir) as broker:   # broker.address == "127.0.0.1:PORT"
        ...

"aa" is an `aa router --no-discovery --no-http` (tests/bench/common.py); "nats" is
nats-server; "mqtt" is Mosquitto; "zenoh-router" is a zenoh-python session in router mode
(`zenoh.open` with `mode: "router"`), run by this file in the peers' environment:

    tests/bench/peers/.venv/bin/python servers.py zenoh-router 127.0.0.1:PORT

"zenoh" runs peer to peer and has no broker: its "broker" is only a free loopback port for
the subscriber to listen on.
"""

from __future__ import annotations

import json
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import start_router

HERE = Path(__file__).resolve().parent
PEERS_PYTHON = HERE / ".venv" / "bin" / "python"
LOOPBACK = "127.0.0.1"
START_S = 15.0  # a broker that has not said it is ready by then failed to start
STOP_S = 10.0  # SIGTERM, then SIGKILL after this long


def free_port() -> int:
    """A port of 127.0.0.1 nobody listens on now (the kernel's pick for a bind to port 0)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


@dataclass
class Broker:
    system: str
    address: str
    proc: subprocess.Popen[str] | None  # None for zenoh: nothing runs between the peers


def line_queue(stream: IO[str]) -> queue.Queue[str | None]:
    """The lines of *stream*, read by a daemon thread (so that a server's log never blocks it)."""
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _await_line(
    proc: subprocess.Popen[str], lines: queue.Queue[str | None], marker: str, what: str
) -> list[str]:
    """Read *lines* until one contains *marker*; raise with what the server said if not."""
    seen: list[str] = []
    deadline = time.monotonic() + START_S
    while True:
        left = deadline - time.monotonic()
        try:
            line = lines.get(timeout=max(left, 0.01))
        except queue.Empty:
            line = None
        if line is None or left <= 0:
            stop(proc)
            raise RuntimeError(
                f"{what} did not start: {''.join(seen[-10:]).strip() or 'no output'}"
            )
        seen.append(line)
        if marker in line:
            return seen


def _await_port(proc: subprocess.Popen[str], port: int, what: str) -> None:
    """Wait until *proc* accepts connections on 127.0.0.1:*port*."""
    deadline = time.monotonic() + START_S
    while True:
        try:
            with socket.create_connection((LOOPBACK, port), timeout=1):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                raise RuntimeError(f"{what} did not start listening on {LOOPBACK}:{port}") from None
            time.sleep(0.02)


def stop(proc: subprocess.Popen[str] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_S)


def _nats(tmp: Path) -> tuple[subprocess.Popen[str], str, queue.Queue[str | None]]:
    port = free_port()
    conf = tmp / "nats.conf"
    # Client port on loopback only; no monitoring port, cluster, gateway or leaf node (all
    # off unless configured).
    conf.write_text(f'host: "{LOOPBACK}"\nport: {port}\n')
    proc = subprocess.Popen(
        ["nats-server", "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines = line_queue(proc.stderr)
    _await_line(proc, lines, "Server is ready", "nats-server")
    return proc, f"{LOOPBACK}:{port}", lines


def _mosquitto(tmp: Path) -> tuple[subprocess.Popen[str], str, queue.Queue[str | None]]:
    port = free_port()
    conf = tmp / "mosquitto.conf"
    # One listener on loopback; no persistence; nothing of a subscriber's stream dropped
    # (the queue limits apply to QoS 1/2, set unbounded in case); the log says when a
    # subscription is in place (`subscribe`), which the C client cannot. The log goes to
    # stderr: mosquitto does not flush stdout when it is a pipe. TCP_NODELAY on its sockets,
    # as nats-server, Zenoh and Aa (asyncio) have by default: Nagle would hold back the
    # small messages of the latency run by up to the peer's delayed-ACK time (40 ms).
    conf.write_text(
        f"listener {port} {LOOPBACK}\n"
        "allow_anonymous true\n"
        "persistence false\n"
        "set_tcp_nodelay true\n"
        "max_queued_messages 0\n"
        "max_queued_bytes 0\n"
        "log_dest stderr\n"
        "log_type error\nlog_type warning\nlog_type subscribe\n"
        "log_timestamp false\n"
    )
    proc = subprocess.Popen(
        ["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    lines = line_queue(proc.stderr)
    _await_port(proc, port, "mosquitto")  # it logs nothing when its listener is up
    return proc, f"{LOOPBACK}:{port}", lines


def zenoh_config(mode: str, address: str, *, listen: bool) -> str:
    """A Zenoh session's config (JSON5) confined to loopback: one TCP endpoint on
    127.0.0.1, to listen on or to connect to; no multicast scouting (it would join
    224.0.0.224 on the machine's interfaces) and no gossip."""
    host, _ = address.rsplit(":", 1)
    if host != LOOPBACK:
        raise SystemExit(f"zenoh: refusing a non-loopback address {address}")
    endpoint = [f"tcp/{address}"]
    conf = {
        "mode": mode,
        "listen": {"endpoints": endpoint if listen else []},
        "connect": {"endpoints": [] if listen else endpoint},
        "scouting": {
            "multicast": {"enabled": False, "listen": False},
            "gossip": {"enabled": False},
        },
    }
    return json.dumps(conf)


def _zenoh_router(tmp: Path) -> tuple[subprocess.Popen[str], str, queue.Queue[str | None]]:
    address = f"{LOOPBACK}:{free_port()}"
    proc = subprocess.Popen(
        [str(PEERS_PYTHON), __file__, "zenoh-router", address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines = line_queue(proc.stdout)
    _await_line(proc, lines, "ready", "zenoh router")
    _await_port(proc, int(address.rsplit(":", 1)[1]), "zenoh router")
    return proc, address, lines


def serve_zenoh_router(address: str) -> None:
    """A Zenoh router on *address* until stdin closes or SIGTERM (run in the peers' venv)."""
    import zenoh

    zenoh.init_log_from_env_or("error")
    conf = zenoh.Config.from_json5(zenoh_config("router", address, listen=True))
    with zenoh.open(conf):
        print("ready", flush=True)
        sys.stdin.read()


@dataclass
class Running:
    broker: Broker
    log: queue.Queue[str | None] | None  # the server's log lines, for readiness markers

    @property
    def address(self) -> str:
        return self.broker.address

    @property
    def pid(self) -> int | None:
        return self.broker.proc.pid if self.broker.proc else None

    def await_log(self, marker: str, what: str) -> None:
        assert self.broker.proc is not None and self.log is not None
        _await_line(self.broker.proc, self.log, marker, what)


@contextmanager
def start(system: str, tmp: Path) -> Iterator[Running]:
    """The broker for *system* ("aa", "nats", "mqtt", "zenoh-router", "zenoh"), stopped on
    leaving."""
    proc: subprocess.Popen[str] | None = None
    log = None
    if system == "aa":
        proc, endpoint = start_router("--no-discovery", "--no-http")
        if not endpoint.startswith(LOOPBACK + ":"):
            stop(proc)
            raise RuntimeError(f"aa router is not on loopback: {endpoint}")
        address = endpoint
    elif system == "nats":
        proc, address, log = _nats(tmp)
    elif system == "mqtt":
        proc, address, log = _mosquitto(tmp)
    elif system == "zenoh-router":
        proc, address, log = _zenoh_router(tmp)
    elif system == "zenoh":
        address = f"{LOOPBACK}:{free_port()}"
    else:
        raise ValueError(f"unknown broker {system!r}")
    try:
        yield Running(Broker(system, address, proc), log)
    finally:
        stop(proc)


def installed(system: str) -> str | None:
    """Why *system*'s server is missing, or None if it is there."""
    binary = {"nats": "nats-server", "mqtt": "mosquitto"}.get(system)
    if binary and shutil.which(binary) is None:
        return f"{binary} is not installed (tests/bench/peers/setup.sh installs it)"
    if system == "zenoh-router" and not PEERS_PYTHON.exists():
        return "no tests/bench/peers/.venv (tests/bench/peers/setup.sh makes it)"
    return None


if __name__ == "__main__":
    if sys.argv[1:2] != ["zenoh-router"] or len(sys.argv) != 3:
        raise SystemExit("usage: servers.py zenoh-router 127.0.0.1:PORT")
    serve_zenoh_router(sys.argv[2])
