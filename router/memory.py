"""Giving freed memory back to the operating system.

A client that stops reading makes the router hold its unread deliveries (up to its backlog
bound, `aa.router.config.MAX_SESSION_BACKLOG`) as many medium-sized buffers. Freed when the
client goes (the session lets its transport go at once: uvloop's transport and the session
refer to each other, so they waited for a collection), they leave holes in glibc's heap that
`malloc` keeps for itself, with uvloop's transports (which queue each write as its own
buffer) most of all. `give_back()` asks glibc to return the free pages of its heaps
(`malloc_trim`), in a worker thread, a tenth of a second after it is asked for and at most
once a second; elsewhere than glibc it does nothing. The trim holds the heap's lock while it
walks it (tens of milliseconds after many slow clients), so the loop may wait on its next
`malloc` for that long, once: the price of the memory coming back.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["give_back", "prepare"]

log = logging.getLogger(__name__)

#: At most one trim per this many seconds: a storm of slow clients closing costs one walk a
#: second (a call inside the interval is put off to its end, not dropped).
MIN_INTERVAL = 1.0

_libc: Any = None
_last = -MIN_INTERVAL
_due = 0.0  # when a trim was scheduled (0: none is scheduled or running)
#: Seconds a trim waits after it is asked for (the loop's closing callbacks run first).
AFTER_CLOSE = 0.1
#: Seconds after which a trim still said to be due is taken as lost (its loop closed first).
_LOST_AFTER = 60.0
#: The trims' own thread (one at most), made by `prepare`.
_worker: ThreadPoolExecutor | None = None


def _trim() -> None:
    global _due
    try:
        _libc.malloc_trim(0)
    except Exception:
        log.debug("malloc_trim failed", exc_info=True)
    finally:
        _due = 0.0


def _start() -> None:
    global _last, _due
    _last = time.monotonic()
    try:
        asyncio.get_running_loop().run_in_executor(_thread(), _trim)
    except RuntimeError:  # the loop is closing: its executor is gone
        _due = 0.0


def _thread() -> ThreadPoolExecutor:
    global _worker
    if _worker is None:
        _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aa-trim")
    return _worker


def _load() -> bool:
    """glibc, loaded once (False elsewhere)."""
    global _libc
    if _libc is None:
        try:  # `platform.libc_ver` reads the interpreter's file: once
            _libc = ctypes.CDLL(None) if platform.libc_ver()[0] == "glibc" else False
            if _libc:
                _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    return bool(_libc)


def prepare() -> None:
    """Load glibc and start the trims' thread now, before the router holds much."""
    if _load():
        _thread().submit(lambda: None).result()


def give_back() -> None:
    """Return the heap's free pages to the system soon (from the event loop; elsewhere, as
    in a sans-I/O caller's test, it does nothing)."""
    global _due
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    now = time.monotonic()
    if _due and now - _due < _LOST_AFTER or _libc is False:
        return
    if not _load():
        return
    _due = now
    # Not at once: a closed transport's buffers are freed by callbacks the loop has yet to
    # run (uvloop's close), and a trim that ran first found nothing to give back.
    loop.call_later(max(_last + MIN_INTERVAL - now, AFTER_CLOSE), _start)
