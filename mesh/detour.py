"""Routing around a congested link (pure: no I/O, no asyncio): which routers a copy is for,
and which neighbours reach them without the links to avoid.

Interest routing (`aa.mesh.interest`) sends an event down the shortest-path tree of its
source. When the link to one of those children is congested (its send buffer grew past a
bound: the router decides, locally) and other links reach the same routers, the router
sends the event that way instead, as a *directed* copy: a flood group whose header names
the routers it is for (`FloodGroup.to`). No routing table changes and no message goes to
the rest of the mesh: the decision lives in that one router, and ends when the buffer
drains. The rules, which every router applies to the same view:

1. **For whom.** A copy for child *c* of the tree of source *s* is for the routers below
   *c* whose own interest may match the event (`detour_targets`): exactly the routers that the
   copy through *c* would have reached and that want it.
2. **Which way.** A breadth-first tree from the router itself over the view's graph,
   without the routers already on the copy's path and without the links to avoid (its
   congested ones), neighbours in order of router id (`Detours.first_hops`). Each
   neighbour gets one directed copy naming the targets behind it. A target that cannot be
   reached so keeps the congested link (a detour is a choice, never a loss).
3. **Onwards.** A router that receives a directed copy removes itself from the targets
   and sends the rest the same way (rule 2, from itself, avoiding its own congested
   links): hop by hop the targets split, each reached by one copy.
4. **Seen or not.** A directed copy is forwarded to its targets even when its events were
   seen here already (by an ordinary copy or by another directed copy whose path met this
   one): it is the only copy on its way to them. It is dispatched only if fresh (GUID
   de-duplication, as ever): so no duplicates, and no loss to the de-duplication.
5. **Ordinary duties.** A router that first meets an event in a directed copy also does
   what the ordinary copy would have made it do (its children in the source's tree that
   may want it), since that copy, if it comes later, is dropped as seen — unless the
   router is above one of the copy's targets in the source's tree: then its part of the
   tree is the detoured one, whose wanting routers are all targets of directed copies.

Loops cannot form: a copy is never sent to a router on its path (`aa.mesh.flood`, rule 2),
and each target is in one copy at a time, so a detour costs at most one message per target
per hop. A router that is unsure (its view unsettled or incomplete) floods the events of a
directed copy as an ordinary one, as it does any other.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Final

from .event import Event
from .interest import MeshInterests
from .protocol import MAX_GROUP_TO

__all__ = ["Detours", "detour_targets", "MAX_DETOUR_PLANS"]

#: Breadth-first trees kept (one per path and set of links to avoid), in trees: each holds
#: an entry per router of the mesh; a congested router computes a handful.
MAX_DETOUR_PLANS: Final = 64


def detour_targets(view: MeshInterests, source: str, child: str, event: Event) -> list[str] | None:
    """The routers below *child* (itself included) in the tree of *source* whose own interest
    may match *event*, sorted; None when that is not known (no tree, *child* not in it, an
    interest unknown, or more than `MAX_GROUP_TO` of them).

    >>> from aa.mesh import Interest, InterestFilter
    >>> view = MeshInterests()
    >>> hot = Interest.of([InterestFilter(type="hot")])
    >>> for rid, peers in {"a": "bc", "b": "ad", "c": "ad", "d": "bc"}.items():
    ...     _ = view.put(rid, peers, hot if rid == "d" else Interest.NOTHING)
    >>> detour_targets(view, "a", "b", Event(values={}, type="hot"))
    ['d']
    """
    tree = view.tree(source)
    if tree is None or child not in tree.parent:
        return None
    out: list[str] = []
    stack = [child]
    while stack:
        v = stack.pop()
        if not tree.folded[v].may_match(event):
            continue  # nobody below v wants it
        own = view.interest(v)
        if own is None:
            return None
        if own.may_match(event):
            out.append(v)
            if len(out) > MAX_GROUP_TO:
                return None
        stack.extend(tree.children.get(v, ()))
    out.sort()
    return out


class Detours:
    """Rule 2 over one view, with the breadth-first trees cached until the view changes.

    >>> from aa.mesh import Interest
    >>> view = MeshInterests()
    >>> for rid, peers in {"a": "bc", "b": "ad", "c": "ad", "d": "bc"}.items():
    ...     _ = view.put(rid, peers, Interest.NOTHING)
    >>> Detours(view).first_hops("a", ["d"], blocked=(), avoid={"b"})
    {'c': ['d']}
    >>> Detours(view).first_hops("a", ["d"], blocked=("c",), avoid={"b"}) is None
    True
    """

    def __init__(self, view: MeshInterests) -> None:
        self.view = view
        self._graph: Mapping[str, Sequence[str]] | None = None
        self._plans: OrderedDict[tuple[str, frozenset[str], frozenset[str]], dict[str, str]] = (
            OrderedDict()
        )

    def first_hops(
        self, me: str, targets: Iterable[str], *, blocked: Collection[str], avoid: Collection[str]
    ) -> dict[str, list[str]] | None:
        """Neighbour of *me* → the *targets* reached through it, over the view's graph without
        the routers *blocked* (the copy's path) and the links from *me* to *avoid*; None if
        one of *targets* cannot be reached so, or *me* is not in the view."""
        graph = self.view.graph()
        if graph is not self._graph:  # the view changed: every tree may have
            self._graph = graph
            self._plans.clear()
        key = (me, frozenset(blocked) - {me}, frozenset(avoid))
        hop = self._plans.get(key)
        if hop is None:
            if me not in graph:
                return None
            hop = self._plans[key] = _first_hops(graph, me, key[1], key[2])
            if len(self._plans) > MAX_DETOUR_PLANS:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        out: dict[str, list[str]] = {}
        for t in targets:
            if t == me:
                continue
            first = hop.get(t)
            if first is None:
                return None
            out.setdefault(first, []).append(t)
        return out


def _first_hops(
    graph: Mapping[str, Sequence[str]], me: str, blocked: frozenset[str], avoid: frozenset[str]
) -> dict[str, str]:
    """Router → the neighbour of *me* its breadth-first path (neighbours in id order)
    starts with, over *graph* without *blocked* and the links from *me* to *avoid*."""
    first: dict[str, str] = {}
    queue: deque[str] = deque()
    for w in graph.get(me, ()):
        if w not in blocked and w not in avoid and w not in first:
            first[w] = w
            queue.append(w)
    while queue:
        v = queue.popleft()
        via = first[v]
        for w in graph.get(v, ()):
            if w != me and w not in first and w not in blocked:
                first[w] = via
                queue.append(w)
    return first
