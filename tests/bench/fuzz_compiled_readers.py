"""A larger attack on the compiled readers than the suite's: mutated, cut and spliced frames
read by the compiled path and by the reference, which must give the same events or the same
error; and floats chosen to be hard written by the event log's reader, which must equal
``repr``. Run once after changing a reader (a few minutes):

    ./.venv/bin/python tests/bench/fuzz_compiled_readers.py --frames 100000 --floats 1000000

Prints what it tried and the slowest single compiled read; exits 1 at the first difference
(and prints the frame, as hex, to replay it).
"""

from __future__ import annotations

import argparse
import math
import random
import struct
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' `support`

from aa.mesh import Event
from aa.router.eventlog import fastpath
from tests import test_compiled_deliveries as deliveries_t
from tests import test_compiled_publishes as publishes_t


def seeds_publish() -> list[bytes]:
    t = publishes_t
    out = [t.frame(1, [t.usual(i) for i in range(40)]), t.frame(2, t.EVENTS[:4])]
    out += [t.frame(3, t.EVENTS), t.frame(4, t.OTHERS + t.EVENTS[:2])]
    out += [t.odd_frame(b"\x94\xa1a\xc0" + v + b"\x80") for v in t.ODD_VALUES]
    out += t.bad_frames()
    return [f for f in out if len(f) < 200_000]


def seeds_deliver() -> list[bytes]:
    t = deliveries_t
    out = [
        t.frame([([1], t.usual(i)) for i in range(40)]),
        t.frame([([1, 2], e) for e in t.EVENTS[:5]]),
        t.frame(
            [([i % 3, 7], Event(values={"l": [i, {"m": [None]}]}, id=f"x{i}")) for i in range(9)]
        ),
    ]
    out += t.bad_frames()
    return [f for f in out if len(f) < 200_000]


def mutate(rnd: random.Random, frames: list[bytes]) -> bytes:
    """One of *frames* flipped, cut, grown or spliced with another, a few times over."""
    data = bytearray(rnd.choice(frames))
    for _ in range(rnd.choice([1, 1, 1, 2, 3, 4])):
        if len(data) < 6:
            break
        pos = rnd.randrange(4, len(data))
        choice = rnd.random()
        if choice < 0.4:
            data[pos] = rnd.randrange(256)
        elif choice < 0.5:
            data[pos] = rnd.choice([0xC0, 0xC1, 0xDC, 0xDD, 0xDE, 0xDF, 0xDB, 0xC6, 0xC9, 0xFF])
        elif choice < 0.6:
            del data[pos : pos + rnd.randint(1, 8)]
        elif choice < 0.7:
            data[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 4)))
        elif choice < 0.8:  # splice: this frame's start, another's end
            other = rnd.choice(frames)
            data = data[:pos] + other[rnd.randrange(4, len(other)) :]
        elif choice < 0.9:  # a length field made huge
            data[pos : pos + 4] = rnd.choice([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff"])
        else:
            del data[pos:]
        if rnd.random() < 0.8:  # keep the frame's own length right, mostly
            data[:4] = (len(data) - 4).to_bytes(4, "big")
    return bytes(data)


def fuzz_frames(
    name: str,
    module: Any,
    seeds: list[bytes],
    n: int,
    seed: int,
) -> None:
    rnd = random.Random(seed)
    whole = slowest = 0.0
    read_whole = 0
    counted = module.counted
    data = b""
    worst = b""
    worst_args: tuple[Any, ...] = ()

    def timed(*args: Any) -> Any:  # one compiled read, timed alone
        nonlocal whole, slowest, worst, worst_args
        t0 = time.process_time()
        got = counted(*args)
        took = time.process_time() - t0
        whole += took
        if took > slowest:
            slowest, worst, worst_args = took, data, args
        return got

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "counted", timed)
        for i in range(n):
            data = mutate(rnd, seeds)
            compiled = module.read(data, True, mp)
            read_whole += sum(module.compiled_reads)
            reference = module.read(data, False, mp)
            if not module.same_answer(compiled, reference):
                print(f"{name}: DIFFERENT at frame {i}: {data.hex()}")
                print("compiled: ", compiled)
                print("reference:", reference)
                sys.exit(1)
    again = []  # the slowest read timed again (a pause of the collector is no finding)
    for _ in range(5):
        t0 = time.process_time()
        counted(*worst_args)
        again.append(time.process_time() - t0)
    print(
        f"{name}: {n} mutated frames, same answer on both paths; {read_whole} read by the "
        f"compiled reader; slowest compiled read {slowest * 1e3:.2f} ms CPU "
        f"({min(again) * 1e3:.2f} ms read again), "
        f"mean {whole / n * 1e6:.1f} us (slowest frame: {len(worst)} bytes, "
        f"{worst[:60].hex()}...)"
    )


def hard_floats(n: int, seed: int) -> list[float]:
    """Floats where a short writer goes wrong: halfway decimals and their neighbours, powers
    of ten and two, the ends of the range `_short_float` writes itself (2**-14, 2**53), the
    subnormal boundary, signed zeros, and random 15- to 17-digit decimals."""
    rnd = random.Random(seed)
    out: list[float] = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308]
    edges = [2.0**e for e in range(-1074, 1024)] + [10.0**k for k in range(-20, 24)]
    edges += [2.0**-14, 2.0**53, 2.0**-1022, 1e-4, 1e16]
    for x in edges:
        for sign in (1, -1):
            y = sign * x
            out.append(y)
            lo = hi = y
            for _ in range(3):
                lo, hi = math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf)
                out += [lo, hi]
    while len(out) < n:
        kind = rnd.randrange(5)
        if kind == 0:  # a decimal half way between two of 15 or 16 digits
            digits = rnd.choice([15, 16, 17])
            m = rnd.randrange(10 ** (digits - 1), 10**digits) * 10 + 5
            x = float(f"{m}e{rnd.randint(-22, 20)}")
        elif kind == 1:  # a random decimal of 15 to 17 digits
            digits = rnd.choice([15, 16, 17])
            m = rnd.randrange(10 ** (digits - 1), 10**digits)
            x = float(f"{m}e{rnd.randint(-22, 20)}")
        elif kind == 2:  # a dyadic rational: exact in few bits, its decimal may end in 5
            x = rnd.randrange(1, 2 ** rnd.randint(1, 53)) / 2.0 ** rnd.randint(0, 70)
        elif kind == 3:  # any bit pattern in the range written without an exponent
            x = struct.unpack("<d", rnd.getrandbits(64).to_bytes(8, "little"))[0]
            if math.isfinite(x) and x:
                x = math.ldexp(math.frexp(x)[0], rnd.randint(-15, 55))
        else:
            x = struct.unpack("<d", rnd.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(x):
            x = math.nextafter(x, rnd.choice([math.inf, -math.inf])) if rnd.random() < 0.3 else x
            out.append(x)
    return out[:n] if n >= 10_000 else out


def fuzz_floats(n: int, seed: int) -> None:
    floats = hard_floats(n, seed)
    batch = 20_000
    for at in range(0, len(floats), batch):
        part = floats[at : at + batch]
        data = msgpack.packb([["e", None, {"v": part}, {}]], use_bin_type=True)
        table = fastpath.table_from_chunks([(1.7e9, 1, data, None)], "me")
        assert table is not None
        got = dict(table.column("values")[0].as_py())["v"][1:-1].split(",")
        for x, text in zip(part, got, strict=True):
            if text != repr(x):
                print(f"floats: DIFFERENT: {x!r} ({x.hex()}) written {text}")
                sys.exit(1)
    print(f"floats: {len(floats)} hard floats written as repr writes them")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=100_000, help="mutated frames per reader")
    ap.add_argument("--floats", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=8)
    args = ap.parse_args()
    if publishes_t._publishes is None or deliveries_t._deliver is None:
        sys.exit("the compiled readers are not built (or AA_PURE_PYTHON is set)")
    fuzz_floats(args.floats, args.seed)
    fuzz_frames("publish", publishes_t, seeds_publish(), args.frames, args.seed)
    fuzz_frames("deliver", deliveries_t, seeds_deliver(), args.frames, args.seed)


if __name__ == "__main__":
    main()
