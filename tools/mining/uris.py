"""Why Spark cannot read an event log URI, in one line naming the URI.

Spark (through Hadoop's file systems) reports an input it cannot open as a Java exception
with a stack trace, and names the input its own way (``file:/x`` for ``file:///x``,
``localhost:9000`` for ``127.0.0.1:9000``). `unreadable_input` maps the common causes to
one line that names the input as the user gave it, and the reason:

- no Hadoop file system for the scheme, or its class is not there (a connector's jars are
  missing);
- the host refuses the connection, or is not known;
- the path does not exist, or may not be read.

Anything else is left to the caller's generic line (None).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from urllib.parse import SplitResult, urlsplit

from aa.mesh import UsageError

__all__ = ["UnreadableInput", "unreadable_input"]

#: Schemes of the Hadoop connectors Spark does not ship, and the jars that bring them.
_CONNECTORS = {
    "s3a": "add the hadoop-aws jars (see docs/mining.md)",
    "s3": "use s3a:// with the hadoop-aws jars (see docs/mining.md)",
    "s3n": "use s3a:// with the hadoop-aws jars (see docs/mining.md)",
    "gs": "add the Google Cloud Storage connector's jars",
    "abfs": "add the hadoop-azure jars",
    "abfss": "add the hadoop-azure jars",
    "wasb": "add the hadoop-azure jars",
    "wasbs": "add the hadoop-azure jars",
}


class UnreadableInput(UsageError):
    """An event log root Spark cannot read; the message is one line naming it and why."""


def _texts(exc: BaseException) -> list[str]:
    """The messages of *exc* and, for a Java exception, of its causes."""
    out = [str(exc)]
    java = getattr(exc, "java_exception", None)
    try:
        while java is not None and len(out) < 20:
            out.append(f"{java.getClass().getName()}: {java.getMessage()}")
            java = java.getCause()
    except Exception:  # the JVM is gone: the Python text is enough
        pass
    return out


def _named(inputs: Sequence[str], match: Callable[[SplitResult], bool]) -> str:
    """The input *match* (a predicate on the split URI) picks, else the only remote one, else
    all of them."""
    picked = [u for u in inputs if match(urlsplit(u))]
    if len(picked) == 1:
        return picked[0]
    remote = [u for u in inputs if "://" in u and not u.startswith("file://")]
    return remote[0] if len(remote) == 1 else ", ".join(picked or inputs)


def unreadable_input(exc: BaseException, inputs: Sequence[str]) -> str | None:
    """One line saying which of *inputs* Spark could not read and why, from the exception
    Spark raised while listing them; None if it is not one of the causes above."""
    text = "\n".join(_texts(exc))
    if m := re.search(r'No FileSystem for scheme "?([\w.+-]+)"?', text):
        scheme = m[1]
        uri = _named(inputs, lambda u: u.scheme == scheme)
        hint = _CONNECTORS.get(
            scheme.lower(), "Spark reads file://, hdfs:// and the schemes of connectors it has"
        )
        return f"{uri}: no FileSystem for scheme {scheme}: {hint}"
    if m := re.search(r"Class ([\w.$]+FileSystem) not found", text):
        # A scheme Hadoop maps to a connector class (s3a) whose jars are not there.
        cls = m[1]
        uri = _named(inputs, lambda u: u.scheme.lower() in _CONNECTORS)
        scheme = urlsplit(uri).scheme.lower()
        hint = _CONNECTORS.get(scheme, "add the jars of the connector that has it")
        return f"{uri}: no FileSystem for scheme {scheme} ({cls} not found): {hint}"
    if m := re.search(r"Path does not exist: (\S+?)\.?(?:\s|$)", text):
        path = urlsplit(m[1]).path.rstrip("/")
        uri = _named(inputs, lambda u: u.path.rstrip("/") == path)
        return f"{uri}: no such file or folder"
    if "Connection refused" in text:
        port = re.search(r" to [^\s:]+:(\d+) failed", text)
        uri = _named(inputs, lambda u: port is not None and str(u.port) == port[1])
        return f"{uri}: connection refused"
    if m := re.search(r"UnknownHostException: (?:[\w.]+: )?([^\s:]+)", text):
        host = m[1]
        uri = _named(inputs, lambda u: u.hostname == host.lower())
        return f"{uri}: unknown host {host}"
    if re.search(r"AccessDeniedException|Permission denied|Access Denied", text):
        return f"{_named(inputs, lambda u: False)}: permission denied"
    return None
