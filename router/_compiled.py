"""Which of the router's compiled fast paths (`.pyx` beside the Python code that does the
same) a process uses.

A fast path is used when `setup.py` built it (with Cython and a C compiler) from its `.pyx`
as it is now (the hash in the `.src-sha256` beside the extension) and ``AA_PURE_PYTHON`` is
not set, the event path's switch (`aa.mesh._speedups`). Otherwise its caller runs the Python
code, the reference.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import os
from pathlib import Path
from types import ModuleType
from typing import Final

__all__ = ["load"]

_HERE = Path(__file__).resolve().parent

#: The environment variable that selects the pure-Python path (the event path's switch).
PURE_ENV: Final = "AA_PURE_PYTHON"


def _fresh(stem: str) -> bool:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False
    try:
        source: bytes | None = (_HERE / f"{stem}.pyx").read_bytes()
    except OSError:  # an install without the source: whatever was built with it
        source = None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        ext = _HERE / f"{stem}{suffix}"
        if ext.is_file():
            if source is None:
                return True
            try:
                built_from = Path(f"{ext}.src-sha256").read_text().strip()
            except OSError:
                return False
            return built_from == hashlib.sha256(source).hexdigest()
    return False


def load(stem: str) -> ModuleType | None:
    """The compiled module *stem* of `aa.router` (e.g. ``"_stamp"``), or None when the
    Python code is to run: not built, built from another version of its `.pyx`, or
    ``AA_PURE_PYTHON`` set."""
    if not _fresh(stem):
        return None
    try:
        return importlib.import_module(f"{__package__}.{stem}")
    except ImportError:
        return None
