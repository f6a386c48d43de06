"""The source a `.pyx` extension is built from: the `.pyx` and what Cython reads with it.

A `.pyx` may take in other files of the project: ``include "x.pxi"`` (its text, pasted in), a
`.pxd` of the same name beside it, and ``cimport``s of the project's own `.pxd` files (each
of those may include and cimport again). An edit to any of them changes the extension, so
the hash that says whether an extension is fresh (`source_digest`) covers them all.

Both `setup.py` (which writes the hash beside each extension it builds, and loads this file
by its path: it cannot import the package it builds) and `aa.mesh._speedups.pyx_fresh`
(which compares it) use this module, so the rule is one. Only the standard library here.

Paths are resolved as Cython resolves them, relative to the file that names them; an
absolute ``cimport aa.x.y`` from the folder that holds the top package's folders (the
repository's root in a checkout, ``aa/`` in an install: the same layout below it). A name
that resolves to no file of the project (``from libc.string cimport memcpy``) is Cython's
own and not hashed.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

__all__ = ["dependencies", "source_digest"]

_INCLUDE = re.compile(r"""^\s*include\s+["']([^"']+)["']""")
_CIMPORT = re.compile(r"^\s*cimport\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)")
_FROM_CIMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+cimport\s+\(?([\w\s,]+)")
_TOP = "aa"


def _root(folder: Path) -> Path:
    """The folder holding the top package's folders: the first one up without `__init__.py`."""
    while (folder / "__init__.py").is_file():
        folder = folder.parent
    return folder


def _module_files(folder: Path, module: str, names: list[str]) -> list[tuple[str, Path]]:
    """The project's `.pxd` files that ``from module cimport names`` (``names`` empty:
    ``cimport module``) in a file of *folder* reads, each with a name for it."""
    dots = len(module) - len(module.lstrip("."))
    parts = [p for p in module[dots:].split(".") if p]
    if dots:
        base = folder
        for _ in range(dots - 1):
            base = base.parent
    elif parts and parts[0] == _TOP:
        base, parts = _root(folder), parts[1:]
    else:
        return []  # Cython's own (libc, cpython) or another package's
    found = []
    target = base.joinpath(*parts)
    if parts and target.with_suffix(".pxd").is_file():
        found.append((f"{module}.pxd", target.with_suffix(".pxd")))
    for name in names:
        path = target / f"{name}.pxd"
        if path.is_file():
            found.append((f"{module}/{name}.pxd", path))
    return found


def _direct(path: Path, text: str) -> list[tuple[str, Path]]:
    """What the file *path* (its *text*) takes in itself, in the order it names them."""
    folder = path.parent
    found: list[tuple[str, Path]] = []
    if path.suffix == ".pyx" and path.with_suffix(".pxd").is_file():
        found.append((path.with_suffix(".pxd").name, path.with_suffix(".pxd")))
    for line in text.splitlines():
        include = _INCLUDE.match(line)
        if include:
            found.append((include.group(1), Path(os.path.normpath(folder / include.group(1)))))
            continue
        plain = _CIMPORT.match(line)
        if plain:
            for item in plain.group(1).split(","):
                found += _module_files(folder, item.split()[0], [])
            continue
        frm = _FROM_CIMPORT.match(line)
        if frm:
            names = [n.split()[0] for n in frm.group(2).split(",") if n.strip()]
            found += _module_files(folder, frm.group(1), names)
    return found


def dependencies(pyx: Path) -> list[tuple[str, Path]]:
    """The project's files Cython reads with *pyx*, recursively, each once, in the order they
    are first named, each with the name it is named by (an include's path as written).
    `FileNotFoundError` if one of them is missing."""
    seen = {pyx.resolve()}
    out: list[tuple[str, Path]] = []
    todo = [(pyx, pyx.read_text(encoding="utf-8"))]
    while todo:
        path, text = todo.pop(0)
        for name, dep in _direct(path, text):
            key = dep.resolve()
            if key in seen:
                continue
            seen.add(key)
            out.append((name, dep))
            todo.append((dep, dep.read_text(encoding="utf-8")))
    return out


def source_digest(pyx: Path) -> str | None:
    """The hex SHA-256 of *pyx* and of every file it takes in (`dependencies`), or None when
    one of them cannot be read. A `.pyx` that takes in nothing has the hash of its bytes
    alone, as before includes were counted."""
    try:
        digest = hashlib.sha256(pyx.read_bytes())
        for name, dep in dependencies(pyx):
            data = dep.read_bytes()
            digest.update(f"\0{name}\0{len(data)}\0".encode())
            digest.update(data)
    except (OSError, UnicodeDecodeError):
        return None
    return digest.hexdigest()
