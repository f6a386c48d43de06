"""Which routers one router reaches in its view of the mesh, kept up to date one summary at a
time (pure: no I/O, no asyncio).

`aa.mesh.interest.InterestTable` needs, after each summary that changed a router's links,
the routers that left its reach and those that came back (its "confirmed" rule). A walk of
the whole graph per summary costs what the whole mesh costs, and a partition that heals
brings every router a summary of each router whose links changed: a walk each. Here a
summary costs what it changes:

- an edge that appears joins at most one new piece to the reach: a walk of that piece only,
  and each router joins once;
- an edge that goes leaves the reach as it was unless it was the only way between its two
  ends: two walks, one from each end, taken a step at a time in turn, stop as soon as they
  meet (another way exists: the common case) or one runs out; the one that ran out is a
  whole piece of the graph, and only the reach's share of it changes.

The answer is always what a whole walk (`MeshInterests.reachable`) would say;
`tests/test_mesh_interest_reach.py` holds them equal over random changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .interest import MeshInterests

__all__ = ["Reach"]


class Reach:
    """The routers joined to *me* by edges of *view* (both ends claim them), *me* too when
    it is in the view. Tell it of every change of a router's links (`changed`)."""

    def __init__(self, me: str, view: MeshInterests) -> None:
        self.me = me
        self.view = view
        self.routers: set[str] = set()

    def _neighbours(self, v: str) -> list[str]:
        """The routers *v* has edges with, by the claims (no graph build)."""
        peers = self.view.peers
        return [w for w in peers(v) if v in peers(w)]

    def rebuild(self) -> tuple[set[str], set[str]]:
        """A whole walk: (routers that came into reach, routers that left it)."""
        now = self.view.reachable(self.me)
        gained, lost = now - self.routers, self.routers - now
        self.routers = now
        return gained, lost

    def changed(self, origin: str, before: Iterable[str]) -> tuple[set[str], set[str]]:
        """*origin*'s claimed links were *before* and are now what the view holds (nothing
        when it left the view): (routers that came into reach, routers that left it)."""
        view = self.view
        if self.me not in view:
            gone, self.routers = self.routers, set()
            return set(), gone
        if origin not in view or self.me not in self.routers:
            return self.rebuild()  # a router forgotten, or our own first links: rare
        old = set(before)
        now = view.peers(origin)
        mine = set(now)
        peers = view.peers
        removed = [w for w in old - mine if origin in peers(w)]
        added = [w for w in now if w not in old and origin in peers(w)]
        lost: set[str] = set()
        for w in removed:
            self._drop(origin, w, lost)
        gained: set[str] = set()
        for w in added:
            if (origin in self.routers) != (w in self.routers):
                self._grow(w if origin in self.routers else origin, gained)
        return gained - lost, lost - gained

    def _grow(self, start: str, gained: set[str]) -> None:
        """*start* joined the reach: so does every router joined to it."""
        reach = self.routers
        reach.add(start)
        gained.add(start)
        stack = [start]
        while stack:
            for w in self._neighbours(stack.pop()):
                if w not in reach:
                    reach.add(w)
                    gained.add(w)
                    stack.append(w)

    def _drop(self, a: str, b: str, lost: set[str]) -> None:
        """The edge a-b went (the graph holds the rest of the change): take out of the reach
        what it no longer joins to *me*. A piece of the graph that lost its way to *me* holds
        an end of such an edge, so checking each edge's ends finds every such piece."""
        reach = self.routers
        if a not in reach and b not in reach:
            return  # the piece was taken out already (or was never in reach)
        piece = self._split(a, b)
        if piece is None:
            return
        self._cut(piece, lost)
        other = b if a in piece else a
        if other != self.me and other in reach:
            piece = self._split(self.me, other)
            if piece is not None:
                self._cut(piece, lost)

    def _cut(self, piece: set[str], lost: set[str]) -> None:
        """*piece* is a whole piece of the graph: the reach is *me*'s piece, so keep only
        *piece* when it holds *me*, else none of it."""
        reach = self.routers
        if self.me in piece:
            lost |= reach - piece
            reach &= piece
        else:
            lost |= reach & piece
            reach -= piece

    def _split(self, a: str, b: str) -> set[str] | None:
        """None when *a* and *b* are joined; else the whole piece of the graph of one of
        them (the smaller, give or take a step): two walks in turn, one from each."""
        seen = ({a}, {b})
        todo = ([a], [b])
        while True:
            for side in (0, 1):
                mine, theirs = seen[side], seen[1 - side]
                stack = todo[side]
                if not stack:
                    return mine
                for w in self._neighbours(stack.pop()):
                    if w in theirs:
                        return None
                    if w not in mine:
                        mine.add(w)
                        stack.append(w)
