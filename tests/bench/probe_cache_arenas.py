"""Which objects, allocated while client caches lived, outlive them and keep Python's allocator
from giving their arenas back?

    python tests/bench/probe_cache_arenas.py --no-trace       # arena counts and RSS, seconds
    python tests/bench/probe_cache_arenas.py --caches 1000    # who pins them (tracemalloc: slow)
    python tests/bench/probe_cache_arenas.py --no-expire      # tombstones and seen ids kept
    python tests/bench/probe_cache_arenas.py --no-trace --new-arenas --caches 10000   # seconds
    PYTHONMALLOC=malloc python tests/bench/probe_cache_arenas.py --no-trace --json

A router in this process (no discovery, loopback only) and real TCP clients in the same
process: each cache is one connection (hello, ``CacheRegister``, its answer, close); then each
is removed the same way (``CacheRemove``); with --events, a burst of that many events
(``bench_client_caches``'s) is acknowledged while the caches live. The router's cache clock
and the control flood's seen ids are then moved past every tombstone's and id's time, the
collector runs, the router's own second heap trim (`TRIM_AGAIN_AFTER`) is awaited, and:

- with --no-trace: the allocator's arena counts (``sys._debugmallocstats``; not under
  another allocator, ``PYTHONMALLOC=malloc``), the bytes in its blocks, and this process's
  RSS, before the caches, with them, and after; with --json, one JSON line of them instead;
- else (tracemalloc on, which hides the allocator's counts): the small blocks (<= 512 bytes,
  what the allocator's arenas serve) still allocated that were allocated while the caches
  lived, by allocating line; the live objects among them (the survivors) by allocating line,
  with their types and how many distinct 1 MiB arenas (``id >> 20``) they sit in;
- the arenas that hold few live objects, with what is in them;
- with --new-arenas (and --no-trace; fast, no tracemalloc): every live object (those the
  collector knows and what they refer to) in a 1 MiB address range (``id >> 20``) that held
  none before the caches came, range by range, with its type and a short repr. These are
  the objects that keep the caches' arenas from going back. (A range that held only
  objects the collector cannot reach before is counted as new.)

Output: plain text. Bounded: --caches connections, one at a time per worker.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import re
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_client_caches import _burst, _request, rss
from support.waits import wait_for

from aa.mesh import PatternSpec
from aa.mesh.protocol import CacheRegister, CacheRemove
from aa.router import Router, RouterConfig, memory
from aa.router.caches import CacheConfig

ARENA_SHIFT = 20
MB = 2**20


def arenas() -> tuple[int, int] | None:
    """(arenas allocated now, bytes in arenas) from ``sys._debugmallocstats``; None when
    Python's allocator is not in use (``PYTHONMALLOC=malloc``) and prints no counts."""
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode()
    current = re.search(r"# arenas allocated current\s*=\s*([\d,]+)", text)
    total = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    if current is None or total is None:
        if tracemalloc.is_tracing():
            raise RuntimeError("sys._debugmallocstats printed no arena counts (tracemalloc on)")
        return None
    return int(current[1].replace(",", "")), int(total[1].replace(",", ""))


def rss_now() -> int:
    return rss(os.getpid())


async def _each(endpoint: str, n: int, make: Any, concurrency: int = 16) -> None:
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            await _request(endpoint, *make(i))

    async with asyncio.timeout(600):
        await asyncio.gather(*(worker() for _ in range(concurrency)))


def live_objects() -> dict[int, object]:
    """Every object the collector knows, and the objects they refer to (strings, ints, ...)."""
    found: dict[int, object] = {}
    todo = gc.get_objects()
    for obj in todo:
        found[id(obj)] = obj
    while todo:
        refs = gc.get_referents(*todo)
        todo = []
        for ref in refs:
            if id(ref) not in found:
                found[id(ref)] = ref
                todo.append(ref)
    return found


def _site(frames: Any) -> str:
    """The allocating line (most recent frame), and the newest frame of Aa's own code."""
    frames = list(frames)
    ours = [f for f in frames if "/bench/" not in f.filename and "/wt-" in f.filename]
    last = frames[-1]
    text = f"{Path(last.filename).name}:{last.lineno}"
    if ours and ours[-1] is not last:
        text += f" <- {Path(ours[-1].filename).name}:{ours[-1].lineno}"
    return text


def where(obj: object) -> str:
    tb = tracemalloc.get_object_traceback(obj)
    return "?" if tb is None else _site(tb)


def print_new_arenas(old_ranges: set[int], top: int) -> None:
    """The live objects in 1 MiB ranges that held none in *old_ranges*, range by range."""
    objs = live_objects()
    per: dict[int, list[object]] = collections.defaultdict(list)
    for k, o in objs.items():
        if k >> ARENA_SHIFT not in old_ranges:
            per[k >> ARENA_SHIFT].append(o)
    kinds: collections.Counter[str] = collections.Counter()
    print(f"1 MiB ranges new since the caches came, holding live objects: {len(per)}")
    for arena, found in sorted(per.items()):
        types = collections.Counter(type(o).__name__ for o in found)
        kinds.update(types)
        print(f"  {arena << ARENA_SHIFT:#x}: {len(found)} objects {dict(types.most_common(6))}")
        for o in found[:4]:
            try:
                text = repr(o)[:90]
            except Exception:  # a half-made object's repr may fail: its type is enough
                text = "?"
            print(f"      {text}")
    print(f"types: {dict(kinds.most_common(top))}")


async def probe(args: argparse.Namespace) -> None:
    config = RouterConfig(port=0, name="probe", caches=CacheConfig(sweep_interval=0.05))
    async with Router(config) as router:
        endpoint = router.endpoint
        caches = router.caches
        now = [1_000_000.0]
        caches._clock = lambda: now[0]

        def reg(tag: str) -> Any:
            return lambda i: (
                f"{tag}-{i}",
                CacheRegister(
                    req=1, pattern=PatternSpec(source=f"x > {i} and y < {i}"), timeout=3600.0
                ),
            )

        def rem(tag: str) -> Any:
            return lambda i: (f"{tag}-{i}", CacheRemove(req=1))

        await _each(endpoint, 200, reg("warm"))
        await _each(endpoint, 200, rem("warm"))
        now[0] += 7200.0
        caches.sweep()
        gc.collect()
        before = arenas()
        old_ranges = {k >> ARENA_SHIFT for k in live_objects()} if args.new_arenas else set()
        rss = [rss_now()]
        if args.trace:  # with tracemalloc on, the allocator's own counts are not printed
            tracemalloc.start(args.frames)
        await _each(endpoint, args.caches, reg("bench"))
        if args.events:
            await _burst(endpoint, args.events, args.caches, seed=2)
        held = (0, 0) if args.trace else arenas()
        rss.append(rss_now())
        await _each(endpoint, args.caches, rem("bench"))
        await asyncio.sleep(args.settle)
        if args.expire:
            now[0] += 7200.0
            caches.sweep()
            router.mesh.relay.control_rules.seen.expire(10.0**9)
        gc.collect()
        if not args.trace:
            # the router's sweep loop asks the heap once more, itself
            await wait_for(lambda: caches._trim_again_at is None and not memory._due, 60.0)
            after = arenas()
            figures = {"rss_before": rss[0], "rss_with": rss[1], "rss_after": rss_now()}
            if args.new_arenas:
                print_new_arenas(old_ranges, args.top)
            if args.json:
                print(json.dumps(figures))
                return
            if before is not None and held is not None and after is not None:
                print(f"arenas: before {before[0]}, with caches {held[0]}, after {after[0]}")
                print(
                    f"bytes in blocks: before {before[1] / MB:.1f} MB, with {held[1] / MB:.1f}"
                    f" MB, after {after[1] / MB:.1f} MB"
                )
            print(f"RSS: before {rss[0] / MB:.1f} MB, with {rss[1] / MB:.1f} MB,", end=" ")
            print(f"after {figures['rss_after'] / MB:.1f} MB")
            return
        objs = live_objects()
        survivors = {
            k: o for k, o in objs.items() if tracemalloc.get_object_traceback(o) is not None
        }
        sites = {k: where(o) for k, o in survivors.items()}
        small: collections.Counter[str] = collections.Counter()
        small_bytes: collections.Counter[str] = collections.Counter()
        if args.trace:
            for trace in tracemalloc.take_snapshot().traces:
                if trace.size <= 512:  # what the object allocator serves from its arenas
                    site = _site(trace.traceback)
                    small[site] += 1
                    small_bytes[site] += trace.size
        tracemalloc.stop()
        after = arenas()
        if before is not None and after is not None:
            print(f"arenas: before {before[0]}, after removal {after[0]}")
            print(f"bytes in blocks: before {before[1] / MB:.1f} MB, after {after[1] / MB:.1f} MB")
        print("small blocks still allocated, by allocating line (blocks, bytes):")
        for site, n in small.most_common(args.top):
            print(f"  {n:7d} {small_bytes[site]:9d}  {site}")
        print(f"live objects {len(objs)}, allocated while the caches lived: {len(survivors)}")
        by_site: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        site_arenas: dict[str, set[int]] = collections.defaultdict(set)
        for k, o in survivors.items():
            s = sites[k]
            by_site[s][type(o).__name__] += 1
            site_arenas[s].add(k >> ARENA_SHIFT)
        rows = sorted(by_site.items(), key=lambda kv: -len(site_arenas[kv[0]]))
        print("\nsurvivors by allocating line (arenas touched, types):")
        for s, types in rows[: args.top]:
            print(f"  {len(site_arenas[s]):4d} arenas  {s:40s} {dict(types.most_common(4))}")
        per_arena: collections.Counter[int] = collections.Counter(k >> ARENA_SHIFT for k in objs)
        new_arenas = {k >> ARENA_SHIFT for k in survivors}
        sparse = sorted(a for a in new_arenas if per_arena[a] <= args.sparse)
        print(
            f"\narenas holding survivors: {len(new_arenas)}; with <= {args.sparse} live "
            f"objects: {len(sparse)}"
        )
        inside: collections.Counter[str] = collections.Counter()
        for k, o in objs.items():
            if k >> ARENA_SHIFT in sparse:
                inside[f"{type(o).__name__} @ {sites.get(k, 'before')}"] += 1
        for what, n in inside.most_common(args.top):
            print(f"  {n:6d}  {what}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--caches", type=int, default=2_000)
    p.add_argument("--events", type=int, default=0, help="a burst of this many, caches live")
    p.add_argument("--json", action="store_true", help="with --no-trace: one JSON line")
    p.add_argument("--settle", type=float, default=1.0)
    p.add_argument("--no-expire", dest="expire", action="store_false")
    p.add_argument("--no-trace", dest="trace", action="store_false")
    p.add_argument("--new-arenas", action="store_true", help="with --no-trace: who holds them")
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--sparse", type=int, default=64)
    asyncio.run(probe(p.parse_args()))


if __name__ == "__main__":
    main()
