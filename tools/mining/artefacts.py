"""Versioned artefact files: what a mining task writes and an adapter add-in loads (the
reading side, shared with the adapters, is `aa.addins.adapters.artefact`).

Layout, one folder per task inside the adapters folder::

    <adapters>/<task>/v1.json
    <adapters>/<task>/v2.json
    <adapters>/<task>/current        # text: "v2.json"

Each ``v<N>.json`` is written once, under a hidden temporary name, then renamed into place
(readers never see half a file); ``current`` is then replaced the same way. So a reader
that opens ``current`` and then the file it names always gets a whole artefact, and a
watcher learns of a new version by ``current``'s content changing (`read_pointer`). Old
versions are kept (the last `KEEP_VERSIONS`), so a bad mining run can be rolled back by
rewriting ``current``.

Every artefact is one JSON object::

    {"format": 1, "task": "location", "version": 2, "created": "2030-01-01T10:00:00+00:00",
     "inputs": ["/data/r1/eventlog", ...], "events": {"read": 1200, "unique": 1000,
     "by_type": {"wifi-scan": 400, ...}}, "config": {...}, "data": {...}}

``data`` is the task's own content (see `aa.tools.mining.schema`, `.location`, `.presence`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from aa.addins.adapters import (
    ARTEFACT_FORMAT,
    POINTER,
    Artefact,
    ArtefactError,
    list_versions,
    read_artefact,
    read_pointer,
)

__all__ = [
    "ARTEFACT_FORMAT",
    "KEEP_VERSIONS",
    "POINTER",
    "TASKS",
    "Artefact",
    "ArtefactError",
    "write_artefact",
    "read_artefact",
    "read_pointer",
    "list_versions",
]

#: Versions kept per task (older ones are deleted after a new one is written): enough to
#: roll back a few bad runs, few enough that a mining cron job cannot fill the disk.
KEEP_VERSIONS: Final = 10
#: The mining tasks, each a folder of the adapters folder.
TASKS: Final = ("schema", "location", "presence")


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _publish(path: Path, text: str) -> bool:
    """Write *text* to *path* if no file is there (False if one is), never partly."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: claim the name, then fill it
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            except FileExistsError:
                return False
            os.replace(tmp, path)
        return True
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_artefact(
    adapters: str | os.PathLike[str],
    task: str,
    data: Mapping[str, Any],
    *,
    inputs: list[str],
    events: Mapping[str, Any],
    config: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> Artefact:
    """Write the next version of *task*'s artefact and point ``current`` at it.

    Returns the written `Artefact`. Raises `OSError` if the folder cannot be written.

    >>> a = write_artefact(tmp, "schema", {"types": {}}, inputs=["/d"], events={"unique": 0})
    >>> a.version, (Path(tmp) / "schema" / "current").read_text()
    (1, 'v1.json')
    """
    folder = Path(adapters) / task
    folder.mkdir(parents=True, exist_ok=True)
    created = (now or datetime.now(UTC)).isoformat()
    version = (list_versions(folder) or [0])[-1] + 1
    while True:
        document = {
            "format": ARTEFACT_FORMAT,
            "task": task,
            "version": version,
            "created": created,
            "inputs": list(inputs),
            "events": dict(events),
            "config": dict(config or {}),
            "data": data,
        }
        text = json.dumps(document, indent=1, sort_keys=False, allow_nan=False) + "\n"
        path = folder / f"v{version}.json"
        # Written whole under a hidden name, then linked into place: a link never replaces
        # a file, so two miners writing at once never share a version, and no reader (nor
        # a run killed half way) ever sees a version file without its content.
        if _publish(path, text):
            break
        version += 1
    _atomic_write(folder / POINTER, path.name)
    for old in list_versions(folder)[:-KEEP_VERSIONS]:
        (folder / f"v{old}.json").unlink(missing_ok=True)
    return Artefact(task=task, version=version, document=document, path=path)
