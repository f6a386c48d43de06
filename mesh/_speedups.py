"""Which event path runs: the compiled modules, or their Python source (the reference).

`setup.py` compiles the event path's modules (`COMPILED`) with Cython when it and a C
compiler are at hand; each extension lands beside its `.py` with a `.src-sha256` file
holding the hash of the source it was built from. This module, imported by `aa.mesh`
before any of them, decides once per process:

- `AA_PURE_PYTHON=1` in the environment: the `.py` files, always;
- else the compiled modules, if every one of them is there and was built from the `.py`
  beside it as it is now; an extension missing, or older than an edit of its source (an
  editable install whose source moved on), makes the whole path pure: a half-compiled path
  would be a third configuration nobody tests.

When the path is pure, a finder at the front of `sys.meta_path` loads those modules from
their source (Python's own finders would prefer an extension beside it). Both paths are the
same source, so they behave alike; `tests/test_compiled_*.py` hold the bytes on the wire
and the errors identical.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Final

__all__ = ["COMPILED", "COMPILED_MODULES", "PURE_ENV", "event_path", "load_pyx", "pyx_fresh"]

#: The environment variable that selects the pure-Python path at run time.
PURE_ENV: Final = "AA_PURE_PYTHON"

#: The modules `setup.py` compiles, as paths below `aa.mesh` (keep in step with setup.py).
COMPILED_MODULES: Final = (
    "values",
    "protocol/wire_events",
)

_HERE = Path(__file__).resolve().parent
_PACKAGE = __name__.rpartition(".")[0]  # "aa.mesh"


def _name(module: str) -> str:
    return f"{_PACKAGE}.{module.replace('/', '.')}"


def _extension(module: str) -> Path | None:
    """The compiled file of *module* beside its source, if there is one."""
    folder, _, stem = (_HERE / module).as_posix().rpartition("/")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = Path(f"{folder}/{stem}{suffix}")
        if path.is_file():
            return path
    return None


def _fresh(module: str) -> bool:
    """Whether *module*'s extension exists and was built from its source as it is now."""
    ext = _extension(module)
    if ext is None:
        return False
    try:
        built_from = Path(f"{ext}.src-sha256").read_text().strip()
        source = (_HERE / f"{module}.py").read_bytes()
    except OSError:
        return False
    return built_from == hashlib.sha256(source).hexdigest()


def _decide() -> tuple[bool, str]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False, f"{PURE_ENV}={os.environ[PURE_ENV]}"
    missing = [m for m in COMPILED_MODULES if _extension(m) is None]
    if len(missing) == len(COMPILED_MODULES):
        return False, "not compiled (no Cython or no C compiler when it was installed)"
    if missing:
        return False, f"not compiled: {', '.join(missing)}"
    stale = [m for m in COMPILED_MODULES if not _fresh(m)]
    if stale:
        return False, f"source changed since it was compiled: {', '.join(stale)}"
    return True, ""


COMPILED, _WHY = _decide()


def pyx_fresh(folder: Path, stem: str) -> bool:
    """Whether the extension *stem* in *folder* (a `.pyx` fast path with no Python twin,
    beside its Python reference) is to be used: ``AA_PURE_PYTHON`` not set, and built (by
    setup.py, with Cython and a C compiler) from the `.pyx` as it is now, with the files it
    includes and cimports as they are now (`aa.mesh._pyx_source.source_digest`, against the
    hash in the `.src-sha256` beside the extension). An install without the `.pyx` uses what
    was built with it; one whose `.pyx` takes in a file that is not there does not."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False
    pyx = folder / f"{stem}.pyx"
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        ext = folder / f"{stem}{suffix}"
        if ext.is_file():
            if not pyx.is_file():
                return True
            try:
                built_from = Path(f"{ext}.src-sha256").read_text().strip()
            except OSError:
                return False
            # Imported here: `aa --version` runs this module alone, without its package.
            from ._pyx_source import source_digest

            return built_from == source_digest(pyx)
    return False


def load_pyx(package: str, folder: Path, stem: str) -> ModuleType | None:
    """The compiled module *stem* of *package* (in *folder*) when `pyx_fresh`, else None:
    the Python reference runs instead."""
    if not pyx_fresh(folder, stem):
        return None
    try:
        return importlib.import_module(f"{package}.{stem}")
    except ImportError:
        return None


def event_path(why: bool = False) -> str:
    """ "compiled event path" or "pure Python", what `aa --version` shows; with *why*, the
    pure path's reason after it ("pure Python: AA_PURE_PYTHON=1"), which `aa router` says
    once at start."""
    if COMPILED:
        return "compiled event path"
    return f"pure Python: {_WHY}" if why else "pure Python"


class _SourceFirst(MetaPathFinder):
    """Loads the compiled modules from their `.py` files (the pure path)."""

    def __init__(self) -> None:
        self.sources = {_name(m): _HERE / f"{m}.py" for m in COMPILED_MODULES}

    def find_spec(
        self,
        fullname: str,
        path: object = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(fullname, source)


if not COMPILED and not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
    sys.meta_path.insert(0, _SourceFirst())
