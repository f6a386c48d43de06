"""Finding and loading add-ins: modules and packages in a folder, and installed entry points.

Folder rules: ``NAME.py`` and ``NAME/__init__.py`` are add-ins called NAME; names starting
with ``_`` or ``.`` (helpers, ``__pycache__``, hidden files) are not. Each is loaded under a
module name of its own (``aa_addin_<NAME>_<generation>``), fresh from source every time:
bytecode caches are neither read nor written, so an edit is seen even within the second the
last one was made (a ``.pyc`` only records the source's mtime in whole seconds). A package's
own submodules load the same way, so ``from . import helpers`` in an add-in reloads too.

A change is seen through the *signature* of an add-in's files — path, mtime (ns) and size of
every ``.py``, ``.toml`` and ``.json`` file it consists of (for a module, also its settings
file beside it) — which the container compares on each poll.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import itertools
import json
import sys
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib.abc import MetaPathFinder
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from aa.mesh import UsageError

from .api import AddIn

__all__ = [
    "AddInSource",
    "AddInLoadError",
    "scan_folder",
    "load_source",
    "load_entry_point",
    "unload",
    "installed_entry_points",
    "ENTRY_POINT_GROUP",
]

#: The entry-point group installed distributions declare their add-ins under.
ENTRY_POINT_GROUP = "aa.addins"
_PREFIX = "aa_addin_"
_SETTINGS_SUFFIXES = (".toml", ".json")
_generation = itertools.count(1)

Factory = Callable[[], AddIn]


class AddInLoadError(UsageError):
    """An add-in could not be loaded: its code raised on import, it defines no `AddIn`, or
    its settings file is not valid. `__cause__` holds the original error."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AddInSource:
    """An add-in found in a folder or among the installed entry points."""

    name: str
    #: The module file or package folder; None for an entry point.
    path: Path | None = None
    #: Folder that may hold the settings file of an entry-point add-in.
    settings_dir: Path | None = None
    entry_point: EntryPoint | None = None
    #: What the files looked like when found (compare to see a change).
    signature: tuple[tuple[str, int, int], ...] = field(default=(), compare=False)


def scan_folder(folder: Path) -> dict[str, AddInSource]:
    """The add-ins in *folder* now, by name (empty if the folder does not exist)."""
    out: dict[str, AddInSource] = {}
    try:
        entries = sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return out
    for p in entries:
        if p.name.startswith(("_", ".")):
            continue
        if p.is_dir() and (p / "__init__.py").is_file():
            files = [
                f
                for f in p.rglob("*")
                if f.suffix in (".py", *_SETTINGS_SUFFIXES) and "__pycache__" not in f.parts
            ]
            out[p.name] = AddInSource(name=p.name, path=p, signature=_signature(files))
        elif p.suffix == ".py" and p.is_file() and p.stem.isidentifier():
            files = [p, *(p.with_suffix(s) for s in _SETTINGS_SUFFIXES)]
            out[p.stem] = AddInSource(name=p.stem, path=p, signature=_signature(files))
    return out


def _signature(files: Iterable[Path]) -> tuple[tuple[str, int, int], ...]:
    sig = []
    for f in sorted(files):
        try:
            st = f.stat()
        except OSError:
            continue
        sig.append((str(f), st.st_mtime_ns, st.st_size))
    return tuple(sig)


def installed_entry_points() -> list[EntryPoint]:
    """The entry points installed distributions declare under ``aa.addins``."""
    return list(entry_points(group=ENTRY_POINT_GROUP))


# -- loading ---------------------------------------------------------------------------------


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles from source every time: no `.pyc` read, none written."""

    def get_code(self, fullname: str) -> Any:
        path = self.get_filename(fullname)
        return compile(self.get_data(path), path, "exec", dont_inherit=True)


class _AddInFinder(MetaPathFinder):
    """Gives an add-in package's submodules the source-only loader too."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if not fullname.startswith(_PREFIX) or "." not in fullname:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            spec.loader = _SourceOnlyLoader(fullname, spec.origin)
        return spec


_FINDER = _AddInFinder()


def load_source(source: AddInSource) -> tuple[Factory, dict[str, Any], str | None]:
    """(factory of `AddIn` instances, settings, module name to `unload` later) for *source*.
    Raises `AddInLoadError`."""
    if source.entry_point is not None:
        return load_entry_point(source)
    assert source.path is not None
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    modname = f"{_PREFIX}{source.name}_{next(_generation)}"
    package = source.path.is_dir()
    file = source.path / "__init__.py" if package else source.path
    spec = importlib.util.spec_from_file_location(
        modname,
        file,
        loader=_SourceOnlyLoader(modname, str(file)),
        submodule_search_locations=[str(source.path)] if package else None,
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
        factory = _factory(module, source.name)
        settings = _settings(
            module, source.path if package else source.path.with_suffix(""), package
        )
    except BaseException as exc:
        unload(modname)
        if isinstance(exc, AddInLoadError):
            raise
        if not isinstance(exc, Exception):
            raise
        raise AddInLoadError(
            f"add-in {source.name!r} did not load: {type(exc).__name__}: {exc}"
        ) from exc
    return factory, settings, modname


def load_entry_point(source: AddInSource) -> tuple[Factory, dict[str, Any], str | None]:
    """Load an installed add-in: the entry point names an `AddIn` class, a factory, or a
    module holding one. Raises `AddInLoadError`."""
    assert source.entry_point is not None
    try:
        obj = source.entry_point.load()
        module: ModuleType | None
        if isinstance(obj, ModuleType):
            module = obj
            factory = _factory(obj, source.name)
        else:
            module = sys.modules.get(str(getattr(obj, "__module__", "")))
            factory = _as_factory(obj, source.name)
        settings = dict(getattr(module, "SETTINGS", None) or {})
        if source.settings_dir is not None:
            settings.update(_read_settings(source.settings_dir / source.name))
    except AddInLoadError:
        raise
    except Exception as exc:
        raise AddInLoadError(
            f"add-in {source.name!r} did not load: {type(exc).__name__}: {exc}"
        ) from exc
    return factory, settings, None


def unload(modname: str | None) -> None:
    """Forget a loaded add-in's modules (its package's submodules too)."""
    if modname is None:
        return
    for name in [m for m in sys.modules if m == modname or m.startswith(modname + ".")]:
        del sys.modules[name]


def _factory(module: ModuleType, name: str) -> Factory:
    chosen = getattr(module, "ADDIN", None)
    if chosen is not None:
        return _as_factory(chosen, name)
    classes = [
        c
        for c in vars(module).values()
        if inspect.isclass(c)
        and issubclass(c, AddIn)
        and c is not AddIn
        and c.__module__ == module.__name__
    ]
    if len(classes) != 1:
        found = ", ".join(c.__name__ for c in classes) or "none"
        raise AddInLoadError(
            f"add-in {name!r} must define exactly one AddIn subclass or name it ADDIN "
            f"(found: {found})"
        )
    return classes[0]


def _as_factory(obj: Any, name: str) -> Factory:
    if inspect.isclass(obj) and issubclass(obj, AddIn):
        return obj
    if callable(obj):

        def make() -> AddIn:
            made = obj()
            if not isinstance(made, AddIn):
                raise AddInLoadError(
                    f"add-in {name!r}: its factory returned {type(made).__name__}, not an AddIn"
                )
            return made

        return make
    raise AddInLoadError(f"add-in {name!r}: {obj!r} is neither an AddIn class nor a factory")


def _settings(module: ModuleType, stem: Path, package: bool) -> dict[str, Any]:
    settings = dict(getattr(module, "SETTINGS", None) or {})
    settings.update(_read_settings(stem / "settings" if package else stem))
    return settings


def _read_settings(stem: Path) -> dict[str, Any]:
    """``stem.toml``, else ``stem.json``, else nothing. Raises `AddInLoadError`."""
    toml, js = stem.with_name(stem.name + ".toml"), stem.with_name(stem.name + ".json")
    try:
        if toml.is_file():
            with toml.open("rb") as f:
                return tomllib.load(f)
        if js.is_file():
            data = json.loads(js.read_text())
            if not isinstance(data, dict):
                raise ValueError("the settings must be a JSON object")
            return data
    except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError and JSONDecodeError too
        raise AddInLoadError(f"settings of add-in {stem.name!r}: {exc}") from exc
    return {}
