"""aa.router.patterns.workers — the worker tier: patterns that are code (scripts,
expressions outside the closed grammar, XPath) run in sandbox worker processes.

Why processes: ticks between the sandbox's loop steps cannot stop one long call into C
(a catastrophic regular expression, a big-int division, `sorted()` of millions), and guards
inside the router's process cannot bound memory. A process can be limited by the operating
system and killed. Inside each worker the RestrictedPython sandbox of `aa.router.patterns`
still runs every pattern (defence in depth); around it the kernel enforces the limits
(`child.py`); the router watches a deadline per evaluation and kills and replaces a worker
stuck past it (`pool.py`).

How the engine uses it::

    PatternEngine.subscribe ─► tier? (outside the predicate grammar: `predicates/grammar.py`)
        router:  compiled and matched in-process
        worker:  pre-compiled in the router if short Python (`prechecked`: an
                 immediate refusal), then
                 WorkerPool.subscribe(key, spec, params, client)
    PatternEngine.match(event) ─► WorkerPool.dispatch(event)   (queued, never waited on)
        … a worker's reply ─► deliver([(key, event), ...]) ─► key.deliver(ev), flushed
    a stop in a worker / a kill ─► PatternEngine's on_failure(keys, code, message)

Placement: a pool, with client affinity, and probation. The pool has `WorkerConfig.workers`
regular processes (default 2: one per core of the machines Aa targets), as many probation
processes for new patterns (`probation.py`: a pattern moves to a regular worker, its state
carried, once it has run 100 events over a second there), and one warm spare. All of a
client's patterns of one kind go to the worker it was placed on (the one serving the fewest
clients when its first pattern came); a shared pattern (Å §4.3: one instance, its
subscribers a group) lives on the worker of its first subscriber — with at most a second
instance on probation for subscribers whose params are new to it. Why not a process per
client: a worker forked from the zygote holds tens of MB resident, a few of them its own, and
a router may serve thousands of clients; and a process per client
would not stop one person with many connections. Why not spread each client's patterns over all
workers: a hostile client would then reach every worker, and each of its patterns could cost every
other client a kill and re-creation; with affinity it reaches one worker, and fairness inside that
worker bounds even that.

Fairness inside a worker: each client has a CPU allowance (a token bucket of
`WorkerConfig.client_burst` seconds, 30 ms by default), and every evaluation is charged to the
client of the bucket it runs (its first subscriber's: a shared pattern's subscribers with other
params pay for their own, not the client that placed the pattern) (timed with the thread's CPU
clock, so a machine busy with other processes charges nobody). While the worker works, each
client is credited an equal share of the time passing among the clients that needed the worker
in the last batch; time the worker waits for the router is credited to everybody whole. A
client's evaluations get a tick budget of no more than its allowance left (a loop stops as soon
as its client's share is spent), and a pattern whose client runs a debt of one more burst is
stopped ("its client's patterns together used more than their share of the worker's CPU"). So a
client's patterns together use at most their share of a busy worker, whatever their number, and
one client's hostile pattern delays the other clients on its worker by the burst and the debt
plus one evaluation (30 + 30 + 20 ms of CPU), or by one kill deadline and a re-creation if it is
stuck in C.

A killed or crashed worker: the subscribers of the bucket it was evaluating (named in the
shared slot: the pattern and params it was running) are stopped with the reason, and no
one else; if a regular worker, the culprit client's other patterns there go back on
probation; every other pattern of that worker is
re-created on the spare from its source and its subscribers' current params, in
subscription order, and the batch the dead worker had not answered is sent again. Workers
are forked from a zygote that has imported everything once (`zygote.py`: ~15 ms, where a
new Python process takes 0.5 s and more on a busy machine), so the spare behind the spare
is ready before the next kill; and the spare compiles the placed sources ahead of need
(`WorkerPool._prime`), so re-creating 100 patterns takes a cache lookup each, not a
compilation (a kill's cost to them: `tests/bench/bench_workers.py`). Their
`state` starts again empty, as after a router restart: a state is plain data of the
process that died, and copying it out after each run would cost each run a serialisation.

Nothing else of theirs runs in the router either. Client caches get a `RemoteMatcher`
(`PatternEngine.matcher`): placed on a worker like a subscriber (charged to the cache's
client), evaluated there on every dispatched event with its own bucket and state, and each
event it accepts handed back, in order, to the cache. Quench dry runs, history replay and
one-shot queries are dry runs in the pattern's worker (`WorkerPool.probe`: a chunk of
events between two batches, one bool each back), awaited by their task while the router's
loop goes on. The router only compiles short sources at subscribe, for an immediate
refusal (`prechecked`); it never runs them.

Backlog: a worker more than `MAX_BACKLOG_EVENTS` events behind drops the newest, and its
subscribers are told how many (`missed_each`: a client gets a `Missed(count)` frame, as a
slow reader does), never unbounded memory in the router.
"""

from .config import MAX_STOP_MESSAGE, PRECHECK_MAX_SOURCE, WorkerConfig
from .hooks import RemoteMatcher, RemoteProgram, deliver_each, missed_each, prechecked
from .pool import WorkerPool
from .tier import ISOLATIONS, WorkerTier

__all__ = [
    "ISOLATIONS",
    "MAX_STOP_MESSAGE",
    "PRECHECK_MAX_SOURCE",
    "RemoteMatcher",
    "RemoteProgram",
    "WorkerConfig",
    "WorkerPool",
    "WorkerTier",
    "deliver_each",
    "missed_each",
    "prechecked",
]
