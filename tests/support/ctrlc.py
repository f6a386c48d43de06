"""Ctrl-C for the commands a test starts, as at a terminal."""

from __future__ import annotations

import signal

__all__ = ["ctrl_c_reaches"]


def ctrl_c_reaches() -> None:
    """In a child before exec (``preexec_fn``): SIGINT back to its default. A suite started
    as a background job without job control (``make test &`` in a script, ``nohup``) has
    SIGINT ignored, and a child inherits that: Python then installs no KeyboardInterrupt,
    and a test that stops an `aa` command with Ctrl-C would wait on a command that never
    heard it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
