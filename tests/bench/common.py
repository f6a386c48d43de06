"""Helpers the benchmarks share: start routers as real processes, print results."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

AA = str(Path(sys.executable).with_name("aa"))


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


def start_router(*extra: str) -> tuple[subprocess.Popen[str], str]:
    """`aa router --port 0` in its own process; returns it and its endpoint.

    Discovery is off unless *extra* asks for it: a benchmark's router that found another
    router on this machine would join its mesh and count that mesh's events too.
    """
    env = {**os.environ, "AA_DISCOVERY_INTERFACES": "lo"}
    wants_discovery = any(a.startswith("--discovery") or a == "--zeroconf" for a in extra)
    isolation = [] if wants_discovery or "--no-discovery" in extra else ["--no-discovery"]
    proc = subprocess.Popen(
        [AA, "router", "--port", "0", *isolation, *extra],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"listening on (\S+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"router did not start: {line!r}")
    return proc, m.group(1)


def report(name: str, figures: dict[str, object]) -> None:
    print(json.dumps({"bench": name, "machine": machine(), **figures}), flush=True)


def children(pid: int) -> list[int]:
    """The running child processes of *pid* (the event log's writer)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return out
