"""A publisher that unquenches and registers the same prototype in a loop, on a router with many
local subscriptions and other publishers' registrations: the CPU each round costs.

    python tests/bench/bench_quench_loop.py                       # 2,000 subscriptions
    python tests/bench/bench_quench_loop.py --subs 200 --loops 2000

    git show main:router/quench/service.py > /tmp/quench_service_base.py
    python tests/bench/bench_quench_loop.py --quench-service /tmp/quench_service_base.py

One router in this process (no discovery, loopback only); --subs local subscriptions
``SnowDepth > i`` (half of them let the prototype through); --others publishers holding 50
registrations each over their own TCP connections; then one publisher sends ``Unquench`` and
``Quench`` of the same prototype --loops times, each round awaiting the router's answer. The
figure is this process's CPU time (router and the raw clients, which only encode a frame or
two) per round, steadier than wall time on a shared machine. --quench-service runs another
copy of ``router/quench/service.py`` (say, the code before a change) in the router instead,
for paired runs.

Output: one JSON line (tests/bench/common.py `report`) with the figure and the load.
Bounded: every wait has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import report
from test_quench_summaries import SNOW, _QuenchWire

import aa.router.router as router_module
from aa.mesh.protocol import Quench, Unquench
from aa.router import Router, RouterConfig


def use_service(path: str) -> None:
    """Run the `QuenchService` of the file at *path* in the routers made from now on."""
    spec = importlib.util.spec_from_file_location("aa.router.quench._bench_copy", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    router_module.QuenchService = module.QuenchService


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with Router(RouterConfig(port=0, name="bench-quench-loop")) as router:
        for i in range(args.subs):
            router.subscribe(f"SnowDepth > {i}")
        others = []
        for o in range(args.others):
            wire = await _QuenchWire.open(router.endpoint, f"other-{o}")
            await wire.send(*(Quench(reg=n, values={"Other": n}, type="t") for n in range(50)))
            await wire.until(lambda got, w=wire: w.quenched() == 50)
            others.append(wire)
        looper = await _QuenchWire.open(router.endpoint, "looping-publisher")
        register = Quench(reg=1, values=SNOW, type="snow")
        try:
            await looper.send(register)
            await looper.until(lambda got: looper.quenched() == 1)
            start = time.process_time()
            for k in range(args.loops):
                await looper.send(Unquench(reg=1), register)
                await looper.until(lambda got, n=k + 2: looper.quenched() == n)
            cpu = time.process_time() - start
        finally:
            for wire in (*others, looper):
                wire.writer.close()
        return {
            "service": args.quench_service or "this tree",
            "subs": args.subs,
            "other_registrations": args.others * 50,
            "loops": args.loops,
            "cpu_us_per_round": round(cpu / args.loops * 1e6, 1),
            "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--subs", type=int, default=2_000)
    p.add_argument("--others", type=int, default=20, help="publishers of 50 registrations")
    p.add_argument("--loops", type=int, default=500)
    p.add_argument("--quench-service", default="", help="another copy of its service.py")
    args = p.parse_args()
    if args.quench_service:
        use_service(args.quench_service)
    report("quench-loop", asyncio.run(run(args)))


if __name__ == "__main__":
    main()
