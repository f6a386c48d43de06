"""A budget of refusals per caller, so that a flood of bad credentials costs the router little
(no I/O; `now` is passed in).

Every request the gate refuses (401: no, a bad or a forged token; 403: a user without the
right) costs the router the whole way to the refusal: TLS, HTTP parsing, routing, and for a
token an ECDSA verification. A caller that keeps being refused is no user who mistyped
a token: once its budget is spent, `Guard` answers its requests 429 at the door, before
anything is decoded or verified, and only after a pause (`MAX_PAUSE`), which holds a
keep-alive connection's next request back too: a flooder's rate is bounded by its
connections (capped per address) over the pause, whatever it sends.

Who a caller is, here: a request carrying a user token the router verified before
(`aa.router.security.TokenVerifier.known`) is that user, so a user refused for want of a
right runs out of their own budget and not of their neighbours'; anything else (no token, a
token never verified, a client's token) is its address. A known user's token therefore
still gets in from an address whose strangers spent its budget.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

__all__ = [
    "RefusalBudget",
    "REFUSAL_BURST",
    "REFUSAL_RATE",
    "MAX_PAUSE",
    "MAX_CALLERS",
    "REFUSED_STATUSES",
]

#: Refusals a caller may have in a row before it is held back: a script with an expired
#: token, or a browser that asks a few pages before its user pastes a token, stays under it.
REFUSAL_BURST: Final = 20
#: Refusals per second a caller earns back: one a second is a person retrying by hand.
REFUSAL_RATE: Final = 1.0
#: Longest pause, seconds, before a held-back caller's 429: long enough to slow a flooder's
#: keep-alive connection to a request a second, short enough that a person is not left
#: waiting.
MAX_PAUSE: Final = 1.0
#: Callers remembered (about 150 bytes each); the least recently refused goes when full
#: (and gets its whole burst again): a flood from many addresses costs bounded memory.
MAX_CALLERS: Final = 4096
#: The answers that count as refusals.
REFUSED_STATUSES: Final = frozenset({401, 403})


class RefusalBudget:
    """Per-caller token buckets of refusals. ``wait(caller, now)`` says how long the caller
    must wait before it may be refused again (0: let it in); ``refused(caller, now)``
    spends one."""

    def __init__(
        self,
        *,
        burst: int = REFUSAL_BURST,
        rate: float = REFUSAL_RATE,
        max_callers: int = MAX_CALLERS,
    ) -> None:
        self.burst = burst
        self.rate = rate
        self.max_callers = max_callers
        self._left: OrderedDict[str, tuple[float, float]] = OrderedDict()  # caller → (left, at)
        #: Requests answered 429 at the door.
        self.held_back = 0

    def __len__(self) -> int:
        return len(self._left)

    def _now_left(self, caller: str, now: float) -> float | None:
        entry = self._left.get(caller)
        if entry is None:
            return None
        left, at = entry
        return min(float(self.burst), left + (now - at) * self.rate)

    def wait(self, caller: str, now: float) -> float:
        """Seconds until *caller* has a refusal to spend again; 0 when it has one now."""
        left = self._now_left(caller, now)
        if left is None or left >= 1.0:
            return 0.0
        return (1.0 - left) / self.rate

    def refused(self, caller: str, now: float) -> None:
        """*caller* was refused: one refusal spent."""
        left = self._now_left(caller, now)
        left = float(self.burst) if left is None else left
        self._left.pop(caller, None)
        self._left[caller] = (max(0.0, left - 1.0), now)
        while len(self._left) > self.max_callers:
            self._left.popitem(last=False)
