"""Reading the mining job's artefacts (pure file reading, no Spark): the format that
`aa mine` writes (`aa.tools.mining.artefacts`) and the adapters load.

Layout, one folder per task inside the adapters folder::

    <adapters>/<task>/v<N>.json     # written once, under a temporary name, then renamed
    <adapters>/<task>/current       # text: "v<N>.json", replaced atomically after it

So a reader that opens ``current`` and then the file it names always gets a whole artefact,
and a watcher learns of a new version by ``current`` naming another file (`ArtefactWatch`).
Each artefact is one JSON object: ``{"format": 1, "task", "version", "created", "inputs",
"events", "config", "data"}``; ``data`` is the task's own content.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "ARTEFACT_FORMAT",
    "POINTER",
    "Artefact",
    "ArtefactError",
    "ArtefactWatch",
    "list_versions",
    "read_artefact",
    "read_pointer",
    "VERSION_NAME",
]

#: Version of the artefact file layout; a reader refuses a format it does not know.
ARTEFACT_FORMAT: Final = 1
#: Name of the pointer file in each task folder.
POINTER: Final = "current"
#: File name of a version.
VERSION_NAME: Final = re.compile(r"^v(\d+)\.json$")


class ArtefactError(ValueError):
    """An artefact (or its pointer) is missing, unreadable or of an unknown format."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Artefact:
    """One loaded artefact."""

    #: The task that wrote it: "schema", "location", "presence".
    task: str
    #: Its version number (the N of ``v<N>.json``).
    version: int
    #: The whole JSON object (metadata and ``data``).
    document: Mapping[str, Any]
    #: The file it was read from.
    path: Path

    @property
    def data(self) -> Mapping[str, Any]:
        """The task's content."""
        return self.document.get("data") or {}


def list_versions(folder: str | os.PathLike[str]) -> list[int]:
    """Version numbers present in a task folder, ascending."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(m[1]) for n in names if (m := VERSION_NAME.match(n)))


def read_pointer(folder: str | os.PathLike[str]) -> str | None:
    """The file name ``current`` names in a task folder, or None if there is none yet."""
    try:
        name = (Path(folder) / POINTER).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return name or None


def read_artefact(folder: str | os.PathLike[str], name: str | None = None) -> Artefact:
    """The artefact ``current`` points to in a task folder (or the file *name*).

    Raises `ArtefactError` when there is none, or it is unreadable or of another format.

    >>> read_artefact("adapters/location").data["radios"]["02:a0:00:00:00:00"]["floor"]
    0
    """
    folder = Path(folder)
    name = name or read_pointer(folder)
    m = VERSION_NAME.match(name or "")
    if name is None or m is None:
        raise ArtefactError(f"no current artefact in {folder}")
    path = folder / name
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ArtefactError(f"cannot read {path}: {exc}") from exc
    if type(document) is not dict or document.get("format") != ARTEFACT_FORMAT:
        raise ArtefactError(f"{path} is not an artefact of format {ARTEFACT_FORMAT}")
    return Artefact(
        task=str(document.get("task", folder.name)), version=int(m[1]), document=document, path=path
    )


class ArtefactWatch:
    """Tells when a task folder's ``current`` artefact changed, and loads it.

    >>> watch = ArtefactWatch("adapters/schema")
    >>> art = watch.poll()        # the artefact, the first time and after each change
    >>> watch.poll() is None      # unchanged since
    True
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self._seen: tuple[str, int] | None = None  # (file name, its mtime in ns)

    def poll(self) -> Artefact | None:
        """The current artefact if it changed since the last call, else None. A missing or
        broken artefact is None too (the adapter keeps what it had); it is read again once
        ``current`` changes."""
        name = read_pointer(self.folder)
        if name is None:
            return None
        try:
            mtime = (self.folder / name).stat().st_mtime_ns
        except OSError:
            return None
        if self._seen == (name, mtime):
            return None
        self._seen = (name, mtime)
        try:
            return read_artefact(self.folder, name)
        except ArtefactError:
            return None
