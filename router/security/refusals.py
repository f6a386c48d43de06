"""A budget of refusals per caller, so that a flood of refused requests or connections costs
the router little (no I/O; `now` is passed in).

Every refusal costs the router the whole way to it: over HTTP(S) (401: no, a bad or a forged
token; 403: a user without the right; 503: a cap reached, come back later) TLS, HTTP
parsing, routing and, for a token, an ECDSA verification; on the TCP port a TLS handshake (a
key exchange and a signature) before the hello can be refused. A caller that keeps being
refused is no user who mistyped a token: once its budget is spent it is held back at the
door, before anything is decoded, verified or handshaken, until it has earned a refusal back
(`REFUSAL_RATE`). A caller earns nothing back while it is held back, so one that keeps
knocking stays out: it must stop for a while to get in.

- The HTTP endpoint's guard (`aa.http_api`) answers it 429 after a pause (`MAX_PAUSE`),
  which holds a keep-alive connection's next request back too: a flooder's rate is bounded
  by its connections (capped per address) over the pause, whatever it sends. There a caller
  is the user of a token the router verified before (`TokenVerifier.known`), so a user
  refused for want of a right spends their own budget and not their neighbours', and a known
  user's token still gets in from an address whose strangers spent its budget; anything
  else (no token, a token never verified, a client's token) is its address.
- The TCP port (`Listener`) closes a held-back address's new connections as it accepts
  them; its refusals are failed or plaintext handshakes and refused hellos
  (`Gate.admit_client`). Connections already open are not touched.
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
]

#: Refusals a caller may have in a row before it is held back: a script with an expired
#: token, a browser that polls the monitor for a while before its user pastes a token, a
#: client retrying without its certificate, or a test walking every door, stays under it;
#: a flood spends it within a fraction of a second (a refusal costs about a millisecond).
REFUSAL_BURST: Final = 100
#: Refusals per second a caller earns back: a page polling a few routes without a token
#: keeps its budget, and a flooder held back costs the router a few milliseconds a second.
REFUSAL_RATE: Final = 5.0
#: Pause, seconds, before a held-back caller's 429: long enough to slow a flooder's
#: keep-alive connection to a request a second, short enough that a person is not left
#: waiting.
MAX_PAUSE: Final = 1.0
#: Callers remembered (about 150 bytes each); the least recently refused goes when full
#: (and gets its whole burst again): a flood from many addresses costs bounded memory.
MAX_CALLERS: Final = 4096


class RefusalBudget:
    """Per-caller token buckets of refusals. ``wait(caller, now)`` says how long the caller
    must wait before it may be refused again (0: let it in); ``refused(caller, now)``
    spends one; ``hold(caller, now)`` holds back a caller that did not wait."""

    def __init__(
        self,
        *,
        burst: int = REFUSAL_BURST,
        rate: float = REFUSAL_RATE,
        max_callers: int = MAX_CALLERS,
        max_pause: float = MAX_PAUSE,
    ) -> None:
        self.burst = burst
        #: Pause before a held-back caller's answer, seconds (`MAX_PAUSE`).
        self.max_pause = max_pause
        self.rate = rate
        self.max_callers = max_callers
        self._left: OrderedDict[str, tuple[float, float]] = OrderedDict()  # caller → (left, at)
        #: Callers held back (`hold`): requests answered 429, connections closed at accept.
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

    def hold(self, caller: str, now: float) -> float:
        """*caller*, out of refusals, is held back now: it earns nothing back during its
        pause (`max_pause` seconds, returned), so a caller that keeps knocking stays out."""
        self.held_back += 1
        self._left.pop(caller, None)
        self._left[caller] = (-self.max_pause * self.rate, now)
        while len(self._left) > self.max_callers:
            self._left.popitem(last=False)
        return self.max_pause

    def refused(self, caller: str, now: float) -> None:
        """*caller* was refused: one refusal spent."""
        left = self._now_left(caller, now)
        left = float(self.burst) if left is None else left
        self._left.pop(caller, None)
        self._left[caller] = (max(0.0, left - 1.0) if left >= 0 else left, now)
        while len(self._left) > self.max_callers:
            self._left.popitem(last=False)
