"""Build hooks: compile the event path's modules with Cython where it and a C compiler are.

Everything else about the distribution is in pyproject.toml. The modules are compiled from
their plain `.py` source (Cython's pure-Python mode; a `.pxd` beside a module may declare C
types for it). Without Cython or a compiler, or if a module fails to compile, the install
goes on without that extension and Aa runs its Python source: `aa.mesh._speedups` decides
at import time, and `aa --version` says which path runs.

Each extension gets a `<extension>.src-sha256` beside it, the hash of the source it was
built from (a `.pyx` with the files it includes and cimports: `mesh/_pyx_source.py`), so an
editable install whose source has been edited since runs the edit, not a stale extension.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: Modules of `mesh/` to compile (keep in step with `aa.mesh._speedups.COMPILED_MODULES`).
COMPILED_MODULES = (
    "values",
    "protocol/wire_events",
)

#: Modules written for Cython (`.pyx`, no Python twin: each is a fast path beside Python code
#: that does the same, chosen by its caller), as (module, source).
PYX_MODULES = (
    ("aa.router.eventlog._columns", "router/eventlog/_columns.pyx"),
    ("aa.router._stamp", "router/_stamp.pyx"),
    ("aa.client._deliver", "client/_deliver.pyx"),
    ("aa.client._publish", "client/_publish.pyx"),
    ("aa.router.wire._publishes", "router/wire/_publishes.pyx"),
    ("aa.router.patterns._match", "router/patterns/_match.pyx"),
)

#: Cython's directives for all of them. Type annotations are not read as C types: they are
#: for mypy, and read by Cython they would change what a function accepts (a `str`
#: parameter would refuse a str subclass with a TypeError). C types go in `.pxd` files.
DIRECTIVES = {
    "language_level": 3,
    "annotation_typing": False,
    "binding": True,
    "embedsignature": True,
}


def _load_pyx_source() -> ModuleType:
    """`mesh/_pyx_source.py`, loaded by its path: setup.py cannot import the package it builds,
    and the hash it writes must be the one `aa.mesh.pyx_fresh` computes."""
    spec = importlib.util.spec_from_file_location("_aa_pyx_source", Path("mesh/_pyx_source.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_PYX_SOURCE = _load_pyx_source()

#: Cython's translations (`.c`) are kept here between builds.
BUILD_DIR = Path("build/cython")

#: Each extension's source hash, taken before Cython reads the source: the hash written beside
#: an extension is the one of the source it was translated from, not of one edited since.
_BEFORE: dict[str, str | None] = {}


def _note(text: str) -> None:
    print(f"aa-mesh: {text}", file=sys.stderr)


def _extensions() -> list[Extension]:
    if os.environ.get("AA_BUILD_PURE", "") not in ("", "0"):
        _note("AA_BUILD_PURE set: not compiling the event path")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _note("Cython is not installed: the event path stays pure Python")
        return []
    modules = [
        Extension(
            "aa.mesh." + m.replace("/", "."),
            [f"mesh/{m}.py"],
            optional=True,
        )
        for m in COMPILED_MODULES
    ]
    modules += [Extension(name, [source], optional=True) for name, source in PYX_MODULES]
    _drop_stale_translations(modules)
    options = {"compiler_directives": DIRECTIVES, "build_dir": str(BUILD_DIR), "quiet": True}
    try:
        translated = cythonize(modules, nthreads=os.cpu_count() or 1, **options)  # a core each
    except Exception:  # a Cython error fails the whole call: translate one by one
        translated = []
        for module in modules:
            try:
                translated += cythonize([module], **options)
            except Exception as exc:
                _note(f"Cython could not translate {module.name} ({exc}): it stays pure Python")
    _record_translations()
    return translated


def _drop_stale_translations(modules: list[Extension]) -> None:
    """Hash each module's source before Cython reads it (`_BEFORE`), and delete a kept
    translation made from another source. Cython reuses a `.c` newer than its source by the
    files' times alone, which an older tree unpacked over the build folder would fool; the
    hash beside each `.c` says what it was made from."""
    for module in modules:
        source = _source(module)
        digest = _BEFORE[module.name] = _digest(source)
        translation = (BUILD_DIR / source).with_suffix(".c")
        made_from = Path(f"{translation}.src-sha256")
        try:
            kept = made_from.read_text().strip()
        except OSError:
            kept = None
        if digest is None or kept != digest:
            translation.unlink(missing_ok=True)
            made_from.unlink(missing_ok=True)


def _record_translations() -> None:
    """After Cython ran: beside each `.c`, the hash of the source it was made from."""
    for name, digest in _BEFORE.items():
        translation = (BUILD_DIR / _source_of(name)).with_suffix(".c")
        if digest is not None and translation.is_file():
            Path(f"{translation}.src-sha256").write_text(digest + "\n")


class OptionalBuildExt(build_ext):
    """`build_ext` that never fails the install: a module that does not compile (no C
    compiler, no Python headers) is left as Python source, said once. Each extension built
    gets the hash of its source beside it, in the build folder and, for an editable
    install, beside the source."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:  # `pip install` gives none: compile one module a core
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            _note(f"no C compiler usable ({exc}): the event path stays pure Python")
            return
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            filename = self.get_ext_filename(self.get_ext_fullname(ext.name))
            built = Path(self.build_lib, filename)
            if not built.is_file():
                continue
            digest = _digest(_source(ext))
            if digest is None:
                _note(f"{_source(ext)} takes in a file that is not there: {ext.name} not used")
                continue
            if _BEFORE.get(ext.name, digest) != digest:
                _note(f"{_source(ext)} changed during the build: {ext.name} not used; build again")
                continue
            digest += "\n"
            Path(f"{built}.src-sha256").write_text(digest)
            if self.inplace:
                package = ext.name.rpartition(".")[0]
                beside = Path(build_py.get_package_dir(package), Path(filename).name)
                if beside.is_file():
                    Path(f"{beside}.src-sha256").write_text(digest)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            _note(f"{ext.name} not compiled ({exc}): it stays pure Python")

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        return outputs + [f"{o}.src-sha256" for o in outputs if Path(o).is_file()]


def _digest(source: Path) -> str | None:
    """The hash of what *source* is built from: a `.pyx` with the files it takes in (None if
    one is not there)."""
    if source.suffix == ".pyx":
        digest: str | None = _PYX_SOURCE.source_digest(source)
        return digest
    return hashlib.sha256(source.read_bytes()).hexdigest()


def _source(ext: Extension) -> Path:
    """The file extension *ext* is compiled from."""
    return _source_of(ext.name)


def _source_of(name: str) -> Path:
    """The file the extension *name* is compiled from: ``mesh/x/y.py`` for ``aa.mesh.x.y``,
    or its `.pyx` (`PYX_MODULES`)."""
    pyx = dict(PYX_MODULES).get(name)
    if pyx is not None:
        return Path(pyx)
    return Path("mesh", *name.split(".")[2:]).with_suffix(".py")


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
