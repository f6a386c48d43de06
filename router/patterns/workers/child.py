"""The worker process: patterns of the worker tier run here, under RestrictedPython as in
the router (defence in depth) and inside limits the operating system enforces.

Lock-down, in this order, before the first pattern is compiled: everything is imported;
the shared slot is mapped and its descriptor closed; every descriptor but the pipe (0 and 1)
is closed; then `setrlimit` caps the address space (`RLIMIT_AS`: a pattern that allocates
past it gets MemoryError, and is stopped), the CPU time (`RLIMIT_CPU`, re-armed before each
batch: the kernel kills a worker that outruns it even if the router's watchdog did not),
open files at 2 (`RLIMIT_NOFILE`: no new socket, file or pipe can be opened, so no network
even if the sandbox were broken), file size 0, core dumps 0, and processes (`RLIMIT_NPROC`,
for an unprivileged user: no fork).

A worker is one `PatternEngine` (in-process mode) whose keys are the router's small ints.
Every evaluation goes through `Worker.run_wrapper`, which writes the shared slot (whom the
router blames if the evaluation never returns), gives the sandbox's random module the
pattern instance's own `random.Random`, has the state measured on every run, and charges
the evaluation's time to its client's CPU share (see the package docstring).
"""

from __future__ import annotations

import gc
import mmap
import os
import random
import resource
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aa.mesh import Event, PatternError, PatternSpec, UsageError
from aa.mesh.protocol import event_to_wire, pack, unpack

from ..engine import PatternEngine
from ..index import Matcher, Member
from ..sandbox import MEMORY, TIMEOUT, HostFacts, SandboxLimits, SandboxStop, XPathProgram
from .carry import NotPortable, dump_state, load_state
from .config import MAX_STOP_MESSAGE, lock_down
from .slots import MATCHER
from .wire import SLOT, SLOT_BYTES, FrameReader, encode

__all__ = ["child_main", "Worker"]

#: Shortest tick budget an evaluation gets when its client's share is spent, in seconds.
_MIN_LIMIT = 0.0005
#: CPU seconds a worker may use past its last re-arming before the kernel kills it: the
#: backstop behind the router's watchdog, re-armed before each batch and every
#: `_REARM_EVERY` evaluations (RLIMIT_CPU is in
#: whole seconds and counts since the process started, so it is re-armed per batch).
_BATCH_CPU = 10
_REARM_EVERY = 256
#: What a client's patterns may send back, per second, beyond their CPU share: deliveries
#: (each costs the router about a microsecond on its loop) and bytes of derived events
#: (each byte is decoded, checked and written again by the router). The bucket of each holds
#: a fifth of a second's worth (so a burst costs the router's loop about 20 ms at most). A
#: pattern whose client runs past either is stopped.
CLIENT_DELIVERIES_PER_S = 100_000
CLIENT_DERIVED_BYTES_PER_S = 16_000_000
_RATE_BURST = 0.2
#: Seconds a worker must wait for its next message to count as idle (keeping up), which
#: tops every client's CPU allowance up. A busy router sends the next batch at once.
_IDLE_GAP = 0.005
#: Allocations after which the worker collects garbage, between two batches. Automatic
#: collection is off: it would run inside some evaluation and be charged to its client.
_GC_AFTER = 50_000
#: The clients dividing a busy worker's time are those that ran something in the last
#: `_SHARE_WINDOW` seconds, counted again every `_SHARE_EVERY` seconds.
_SHARE_WINDOW = 1.0
_SHARE_EVERY = 0.01
_perf = time.perf_counter
_mono_ns = time.monotonic_ns
_thread_ns = time.thread_time_ns
_pack_slot = SLOT.pack_into


class _Client:
    __slots__ = ("tokens", "stamp", "ran", "deliveries", "bytes")

    def __init__(self, burst: float) -> None:
        self.tokens = burst
        self.deliveries = CLIENT_DELIVERIES_PER_S * _RATE_BURST
        self.bytes = CLIENT_DERIVED_BYTES_PER_S * _RATE_BURST
        self.stamp = self.ran = _perf()  # when tokens were last credited; last evaluation


class Worker:
    """One worker's patterns and the handling of the router's messages."""

    def __init__(self, facts: dict[str, Any], slot: Any, write: Callable[[bytes], None]) -> None:
        self.slot = slot
        self.write = write
        self.peer_count = 0
        self.time_budget = float(facts["time_budget"])
        self.burst = float(facts["client_burst"])
        self.kill_ns = int(facts["kill_after"] * 1e9)
        self.compile_ns = int(facts["compile_deadline"] * 1e9)
        host = HostFacts(
            router_id=facts["router_id"],
            router_name=facts["router_name"],
            clock=lambda: datetime.now(UTC),
            peer_count=lambda: self.peer_count,
        )
        limits = SandboxLimits(
            time_budget=self.time_budget,
            max_state_bytes=facts["max_state_bytes"],
            max_sequence=facts["max_sequence"],
        )
        self.engine = _CachingEngine(
            host=host,
            limits=limits,
            on_failure=self._failed,
            on_errors=self._erred,
            isolation="in-process",
            on_compiled=self._compiled,
        )
        self.budget = self.engine.sandbox.budget
        self.random = self.engine.sandbox.random
        self.clients: dict[str, _Client] = {}
        self.client_of: dict[int, str] = {}  # wkey → client
        #: Standalone matchers (client caches'), by wkey: each has its own bucket and state.
        self.matchers: dict[int, Matcher] = {}
        self.matcher_wkeys: dict[int, int] = {}  # id(matcher) → its wkey
        self.charged: dict[int, _Client] = {}  # wkey → the client its evaluations are charged to
        self._placing: tuple[int, str] = (0, "")  # (iid, client) of the sub being compiled
        self.stops: list[list[Any]] = []
        #: Notices of patterns that raised, sent before the next reply (`runerrors.py`).
        self.errors: list[list[Any]] = []
        self.share = 1.0
        self.next_share = 0.0
        #: Share of wall time the worker was on a CPU in its last batch: a client's
        #: allowance grows by the wall time since its last evaluation times this fraction, so
        #: time the machine gave to other processes is not credited as CPU.
        self.on_cpu = 1.0
        #: Seconds the worker just waited for the router (0 while it is kept busy), and
        #: since when.
        self.idle = 0.0
        self.idle_from = _perf()
        #: CPU each instance (by iid) took in the batch being run, in ns, sent with its
        #: answer: the thread's CPU clock around each evaluation, as charged to its client
        #: (wall time would charge a cheap script for the core another process took).
        self.cpu: dict[int, int] = {}

    # -- messages --------------------------------------------------------------------------

    def handle(self, msg: list[Any]) -> None:
        op = msg[0]
        if op == "batch":
            self.batch(msg[1], msg[2], msg[3])
        elif op == "sub":
            self.subscribe(*msg[1:])
        elif op == "probe":
            self.probe(msg[1], msg[2], msg[3], msg[4])
        elif op == "export":
            self.export(msg[1], msg[2])
        elif op == "precompile":
            self.precompile(msg[1], msg[2], msg[3])
        elif op == "uncache":
            self.engine.cache.clear()
        elif op == "update":
            try:
                self.engine.update(msg[1], msg[2])
            except Exception:
                pass  # unknown key: stopped already, the router hears of it separately
        elif op == "unsub":
            self.engine.unsubscribe(msg[1])
            m = self.matchers.pop(msg[1], None)
            self.matcher_wkeys.pop(id(m), None)
            self.charged.pop(msg[1], None)
            self.client_of.pop(msg[1], None)

    def subscribe(
        self,
        wkey: int,
        iid: int,
        kernel: str,
        fmt: str,
        source: str,
        params: dict[str, Any],
        client: str,
        kind: int = 0,
        state: bytes = b"",
        scope: list[str] | None = None,
    ) -> None:
        """Place *wkey*'s pattern (with the *state* its pattern carried from probation,
        `carry.py`: the bucket takes it if it has none yet), to run only over the event
        types *scope* admits (None: any)."""
        self._placing = (iid, client)
        self.clients.setdefault(client, _Client(self.burst))
        _pack_slot(self.slot, 0, iid, _mono_ns(), self.compile_ns)
        try:
            spec = PatternSpec(kernel=kernel, format=fmt, source=source)
            if kind == MATCHER:
                m = self.engine.matcher(spec, params, scope=None if scope is None else tuple(scope))
                self.matchers[wkey] = m
                self.matcher_wkeys[id(m)] = wkey
            else:
                self.engine.subscribe(
                    wkey, spec, params, scope=None if scope is None else tuple(scope)
                )
        except PatternError as exc:
            self.write(encode(["refused", wkey, exc.code, _short(str(exc))]))
            return
        except Exception as exc:  # MemoryError, RecursionError while compiling
            self.write(
                encode(
                    [
                        "refused",
                        wkey,
                        "pattern-refused",
                        _short(f"pattern refused: {type(exc).__name__} while compiling"),
                    ]
                )
            )
            return
        finally:
            _pack_slot(self.slot, 0, 0, 0, 0)
            self.budget.violation = None
        self.client_of[wkey] = client
        self.charged[wkey] = self.clients[client]
        bucket = self.bucket(wkey)
        if (
            state
            and bucket is not None
            and not bucket.state
            and bucket.instance.program.kind == "script"
        ):
            try:
                bucket.state = load_state(state)
            except NotPortable:
                pass  # from a worker that should not have sent it: the pattern starts empty

    def bucket(self, wkey: int) -> Any:
        """*wkey*'s bucket (its state), a subscriber's or a standalone matcher's."""
        m = self.matchers.get(wkey)
        return m.bucket if m is not None else self.engine.bucket_of(wkey)

    def export(self, seq: int, wkeys: list[int]) -> None:
        """*wkeys*' states, moving off probation: bytes (b"": none), None if not portable."""
        out: list[Any] = []
        for wkey in wkeys:
            bucket = self.bucket(wkey)
            try:
                out.append(
                    [wkey, dump_state(bucket.state) if bucket is not None and bucket.state else b""]
                )
            except Exception:  # NotPortable, or MemoryError under the worker's limit
                out.append([wkey, None])
        self.write(encode(["exported", seq, out]))

    def precompile(self, kernel: str, fmt: str, source: str) -> None:
        """A spare compiles a placed pattern ahead of need (`pool._prime`); a failure is
        left to the real subscribe to report."""
        try:
            spec = PatternSpec(kernel=kernel, format=fmt, source=source)
            self.engine.cache[(kernel, fmt, source)] = self.engine.compile_fresh(spec)
        except Exception:
            pass
        self.budget.violation = None

    def _compiled(self, spec: PatternSpec, program: Any) -> None:
        """Wrap a newly compiled program's `run` (before any bucket takes it); not while it
        is only compiled ahead (`precompile`: wrapped when a subscribe takes it)."""
        if self.engine.precompiling:
            return
        iid, client = self._placing
        program.run = self.run_wrapper(program.run, iid, self.clients[client])

    def run_wrapper(self, run: Callable[..., Any], iid: int, owner: _Client) -> Callable[..., Any]:
        slot, budget, time_budget, kill_ns = self.slot, self.budget, self.time_budget, self.kill_ns
        switch, rng = self.random, random.Random()

        worker, burst, matcher_wkeys, charged = self, self.burst, self.matcher_wkeys, self.charged
        cpu = self.cpu

        program = getattr(run, "__self__", None)
        counter = [0]

        def evaluate(bucket: Any, event: Event, *rest: Any) -> Any:
            members = bucket.members  # a kill blames this bucket: a member's key (a wkey)
            first_key = members.key if type(members) is Member else next(iter(members), 0)
            if type(first_key) is not int:  # a cache's matcher: the Matcher is its member
                first_key = matcher_wkeys.get(id(first_key), 0)
            client = charged.get(
                first_key, owner
            )  # the bucket's client pays, not the pattern's first
            start = _perf()
            if start > worker.next_share:
                worker.update_share(start)
            elapsed = start - client.stamp
            tokens = (
                client.tokens + elapsed * worker.share * worker.on_cpu
            )  # CPU seconds, as charged
            client.stamp = client.ran = start
            client.deliveries = min(
                CLIENT_DELIVERIES_PER_S * _RATE_BURST,
                client.deliveries + elapsed * CLIENT_DELIVERIES_PER_S,
            )
            client.bytes = min(
                CLIENT_DERIVED_BYTES_PER_S * _RATE_BURST,
                client.bytes + elapsed * CLIENT_DERIVED_BYTES_PER_S,
            )
            counter[0] += 1
            if counter[0] % _REARM_EVERY == 0:
                _rearm()
            if tokens > burst:
                tokens = burst
            limit = time_budget if tokens >= time_budget else max(tokens, _MIN_LIMIT)
            budget.limit = limit
            switch.current = rng
            bucket.state_countdown = 1  # `state` measured after every run
            _pack_slot(slot, 0, -first_key if first_key else iid, _mono_ns(), kill_ns)
            cpu_from = _thread_ns()
            try:
                result = run(bucket, event, *rest)
            except SandboxStop as stop:
                if stop.code == TIMEOUT and limit < time_budget:
                    raise SandboxStop(TIMEOUT, _SHARE_MESSAGE) from None
                raise
            finally:
                _pack_slot(slot, 0, 0, 0, 0)
                budget.limit = time_budget
                used = _thread_ns() - cpu_from
                client.tokens = tokens - used * 1e-9
                cpu[iid] = cpu.get(iid, 0) + used
            if client.tokens < -burst:
                budget.violation = None
                raise SandboxStop(TIMEOUT, _SHARE_MESSAGE)
            if result:
                client.deliveries -= (
                    len(bucket.members) if result is True else sum(map(len, result.values()))
                )
                client.bytes -= getattr(program, "last_derived_bytes", 0)
                if client.deliveries < 0:
                    raise SandboxStop(MEMORY, _DELIVERIES_MESSAGE)
                if client.bytes < 0:
                    raise SandboxStop(MEMORY, _BYTES_MESSAGE)
            return result

        return evaluate

    def accepting(self, event: Event) -> list[int]:
        """The standalone matchers that accept *event*; one that breaks the sandbox is
        stopped (reported with the next reply) and dropped."""
        return [wkey for wkey, m in list(self.matchers.items()) if self.accepts(wkey, m, event)]

    def accepts(self, wkey: int, m: Matcher, event: Event) -> bool:
        bucket = m.bucket
        receives = bucket.instance.receives
        if receives is not None and not receives(event.type):
            return False  # its owner may not receive this type: it never sees it
        try:
            return bool(bucket.run(bucket, event))
        except SandboxStop as stop:
            self.budget.violation = None
            del self.matchers[wkey]
            self.matcher_wkeys.pop(id(m), None)
            self._failed([wkey], stop.code, stop.message)
            return False

    def probe(self, seq: int, wkey: int, needs: list[bool], blob: bytes) -> None:
        """Dry runs (`pool.probe`): does *wkey*'s pattern let each event through? A
        subscriber's answers as `PatternEngine.matches_prototype` (a script on a copy of its
        state); a matcher's as evaluating it. A pattern stopped meanwhile answers no."""
        self.refill()
        _rearm()
        trusted = Event.trusted
        events = [trusted(v, t, m, i) for i, t, v, m in unpack(blob)]
        results: list[bool] = []
        matcher = self.matchers.get(wkey)
        for event, need in zip(events, needs):
            if matcher is not None:
                results.append(wkey in self.matchers and self.accepts(wkey, matcher, event))
                continue
            try:
                results.append(self.engine.matches_prototype(wkey, event, needs_names=bool(need)))
            except UsageError:  # stopped (by this very dry run, perhaps)
                results.append(False)
        stops, self.stops = self.stops, []
        self.write(encode(["probed", seq, results, stops]))

    def _failed(self, keys: list[Any], code: str, message: str) -> None:
        for k in keys:
            self.client_of.pop(k, None)
            self.charged.pop(k, None)
        self.stops.append([list(keys), code, _short(message)])

    def _erred(self, keys: list[Any], notice: Any) -> None:
        self.errors.append([list(keys), notice.error, notice.count, notice.line, notice.text])

    def refill(self) -> None:
        """Before a batch: time the worker spent idle (waiting for the router) is credited
        to every client whole, since nobody needed it; time it worked is credited at the
        share (`update_share`), here and before each evaluation."""
        now = _perf()
        clients = self.clients.values()
        self.update_share(now)
        idle, burst = self.idle, self.burst
        for c in clients:
            if idle:
                c.tokens = min(burst, c.tokens + idle + (self.idle_from - c.stamp) * self.share)
                c.stamp = now
        self.idle = 0.0

    def update_share(self, now: float) -> None:
        """One over the clients that ran something in the last `_SHARE_WINDOW` seconds."""
        since = now - _SHARE_WINDOW
        needing = sum(1 for c in self.clients.values() if c.ran > since)
        self.share = 1.0 / max(needing, 1)
        self.next_share = now + _SHARE_EVERY

    def batch(self, seq: int, peer_count: int, blob: bytes) -> None:
        self.peer_count = peer_count
        self.refill()
        wall, cpu_start = _perf(), time.thread_time()
        _rearm()
        trusted = Event.trusted
        events = [trusted(v, t, m, i) for i, t, v, m in unpack(blob)]
        deliveries: list[Any] = []
        derived: list[Any] = []
        derived_at: dict[int, int] = {}
        keep: list[Event] = []  # alive until the reply is built: ids must not be reused
        match = self.engine.match
        matchers = self.matchers
        for index, event in enumerate(events):
            if matchers:
                for wkey in self.accepting(event):
                    deliveries += (wkey, index)
            for key, ev in match(event):
                if ev is event:
                    deliveries += (key, index)
                    continue
                ref = derived_at.get(id(ev))
                if ref is None:
                    ref = derived_at[id(ev)] = -1 - len(derived)
                    derived.append(event_to_wire(ev))
                    keep.append(ev)
                deliveries += (key, ref)
        stops, self.stops = self.stops, []
        if self.errors:
            errors, self.errors = self.errors, []
            self.write(encode(["errors", errors]))
        spent = [n for pair in self.cpu.items() for n in pair]
        self.cpu.clear()
        self.write(encode(["done", seq, deliveries, pack(derived), stops, spent]))
        wall = _perf() - wall
        if wall > 0.001:  # long enough for the CPU clock to say something
            self.on_cpu = min(1.0, max(0.05, (time.thread_time() - cpu_start) / wall))
        if gc.get_count()[0] > _GC_AFTER:
            gc.collect()  # between batches, charged to nobody (automatic collection is off)


class _CachingEngine(PatternEngine):
    """The worker's engine: compiles through a cache of programs compiled ahead of need
    (`Worker.precompile`), each taken once (its `run` is then wrapped for its instance)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cache: dict[tuple[str, str, str], Any] = {}
        self.precompiling = False
        self._wrap = kwargs["on_compiled"]

    def compile_fresh(self, spec: PatternSpec) -> Any:
        self.precompiling = True
        try:
            return super()._compile(spec)
        finally:
            self.precompiling = False

    def _compile(self, spec: PatternSpec) -> Any:
        program = self.cache.pop((spec.kernel, spec.format, spec.source), None)
        if program is None:
            return super()._compile(spec)
        self._wrap(spec, program)
        return program


_SHARE_MESSAGE = (
    "pattern stopped: its client's patterns together used more than their share of the worker's CPU"
)
_DELIVERIES_MESSAGE = (
    f"pattern stopped: its client's patterns together made more than {CLIENT_DELIVERIES_PER_S:,} "
    "deliveries a second"
)
_BYTES_MESSAGE = (
    "pattern stopped: its client's patterns together derived more than "
    f"{CLIENT_DERIVED_BYTES_PER_S:,} bytes of events a second"
)


def _rearm() -> None:
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime) + _BATCH_CPU
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))


def _short(text: str) -> str:
    return text if len(text) <= MAX_STOP_MESSAGE else text[: MAX_STOP_MESSAGE - 3] + "..."


def child_main(slot_fd: int) -> None:
    """The worker's main loop: serve the router on fds 0/1 until the pipe closes."""
    slot = mmap.mmap(slot_fd, SLOT_BYTES)
    os.close(slot_fd)
    sys.stderr = sys.__stderr__ = _Null()  # type: ignore[assignment,misc]  # fd 2 is closed below
    reader = FrameReader()
    hello = _read_until(reader, lambda m: m[0] == "hello")
    if hello is None:
        return
    facts = hello[1]
    out = os.fdopen(1, "wb", buffering=0)

    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = out.write(view)
            view = view[n or 0 :]

    worker = Worker(facts, slot, write)
    XPathProgram.load()  # everything imported before the lock-down (the zygote did already)
    gc.collect()
    gc.freeze()  # what start-up built is never garbage: keep it out of every collection
    gc.disable()
    lock_down(int(facts["memory"]))
    write(encode(["ready"]))
    while True:
        msg = reader.next()
        if msg is None:
            waited = _perf()
            data = os.read(0, 1 << 20)
            if _perf() - waited > _IDLE_GAP:  # the router had nothing for us
                worker.idle, worker.idle_from = _perf() - waited, waited
            if not data:
                return
            reader.feed(data)
            continue
        worker.handle(msg)


def _read_until(reader: FrameReader, want: Callable[[list[Any]], bool]) -> list[Any] | None:
    while True:
        msg = reader.next()
        if msg is not None:
            if want(msg):
                return msg
            continue
        data = os.read(0, 1 << 20)
        if not data:
            return None
        reader.feed(data)


class _Null:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
