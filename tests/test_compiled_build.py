"""The compiled event path: which path a process runs, and what it says about it.

A copy of the installed `aa.mesh` (with whatever extensions the install built) is imported
from a temporary folder in a fresh interpreter, so each case can take the copy apart —
remove an extension, edit a source — without touching the real install.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

import aa.mesh
from aa.mesh import _speedups

ROOT = Path(__file__).resolve().parents[1]
MESH = Path(aa.mesh.__file__).parent
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]

needs_compiled = pytest.mark.skipif(
    not all((MESH / f"{m}{SUFFIX}").is_file() for m in _speedups.COMPILED_MODULES),
    reason="this install has no compiled event path (no Cython or C compiler at install)",
)

SHOW = (
    "import aa.mesh, aa.mesh.values as v, aa.mesh.protocol.wire_events as f; "
    "print(aa.mesh.event_path(why=True)); print(v.__file__.rsplit('/', 1)[1]); "
    "print(f.__file__.rsplit('/', 1)[1])"
)


def run_copy(tmp_path: Path, env: dict[str, str] | None = None) -> list[str]:
    """What a fresh interpreter importing the copy under *tmp_path* says (SHOW)."""
    full = {k: v for k, v in os.environ.items() if k != _speedups.PURE_ENV}
    full.update(env or {}, PYTHONPATH=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", SHOW],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=tmp_path,
    )
    return out.stdout.splitlines()


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The installed aa.mesh, copied as tmp_path/aa/mesh (aa is a namespace package)."""
    shutil.copytree(MESH, tmp_path / "aa" / "mesh", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "aa" / "mesh"


def test_setup_compiles_the_modules_the_switch_knows():
    """setup.py and the switch name the same modules (one list would need setup.py to
    import the package it builds)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    listed = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == "COMPILED_MODULES" for t in node.targets)
    )
    assert tuple(listed) == _speedups.COMPILED_MODULES
    for module in listed:
        assert (ROOT / "mesh" / f"{module}.py").is_file()


def _setup_list(name: str) -> tuple[Any, ...]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    return next(
        tuple(ast.literal_eval(node.value))
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == name for t in node.targets)
    )


def _can_compile() -> bool:
    """Whether this machine has what setup.py compiles with: a C compiler and Python's headers."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    return shutil.which(cc) is not None and headers.is_file()


@pytest.mark.skipif(
    not _can_compile() or os.environ.get("AA_BUILD_PURE", "") not in ("", "0"),
    reason="no C compiler or Python headers here: the install is pure Python by design",
)
def test_with_a_c_compiler_the_install_built_every_module():
    """setup.py never fails the install: a module that does not compile (or a Cython error,
    which makes it build none) leaves the source running, said only in pip's output. On a
    machine that can compile, that is a broken build, and the compiled paths' own tests
    would only skip: so this fails instead, naming the modules."""
    if os.environ.get(_speedups.PURE_ENV, "") not in ("", "0"):
        pytest.skip(f"{_speedups.PURE_ENV} is set: the extensions are not looked at")
    missing = [m for m in _setup_list("COMPILED_MODULES") if not _speedups._fresh(m)]
    for name, source in _setup_list("PYX_MODULES"):
        stem = name.rpartition(".")[2]
        if not _speedups.pyx_fresh(ROOT / Path(source).parent, stem):
            missing.append(source)
    assert not missing, f"built from another source or not at all: {missing} (see pip -v)"


@needs_compiled
def test_the_install_runs_the_compiled_path(copy: Path):
    """An install with a C compiler (`make`'s `pip install -e`) runs the extensions."""
    assert run_copy(copy.parents[1]) == [
        "compiled event path",
        f"values{SUFFIX}",
        f"wire_events{SUFFIX}",
    ]


def test_pure_python_on_request(copy: Path):
    assert run_copy(copy.parents[1], {"AA_PURE_PYTHON": "1"}) == [
        "pure Python: AA_PURE_PYTHON=1",
        "values.py",
        "wire_events.py",
    ]


def test_no_extensions_runs_the_source_and_says_why(copy: Path):
    """A machine without a compiler installs the source only."""
    for path in copy.rglob(f"*{SUFFIX}*"):
        path.unlink()
    lines = run_copy(copy.parents[1])
    assert lines[0].startswith("pure Python: not compiled (no Cython or no C compiler")
    assert lines[1:] == ["values.py", "wire_events.py"]


@needs_compiled
def test_an_edited_source_is_run_not_its_stale_extension(copy: Path):
    """An editable install whose source changed after `pip install -e` runs the source, for
    every compiled module (never half one path, half the other), until it is rebuilt."""
    with (copy / "protocol" / "wire_events.py").open("a") as f:
        f.write("\n# edited\n")
    assert run_copy(copy.parents[1]) == [
        "pure Python: source changed since it was compiled: protocol/wire_events",
        "values.py",
        "wire_events.py",
    ]


@needs_compiled
def test_one_missing_extension_makes_the_whole_path_pure(copy: Path):
    (copy / f"values{SUFFIX}").unlink()
    assert run_copy(copy.parents[1]) == [
        "pure Python: not compiled: values",
        "values.py",
        "wire_events.py",
    ]


@pytest.mark.parametrize("pure", ["", "1"])
def test_version_says_which_path(pure: str):
    env = {**os.environ, "AA_PURE_PYTHON": pure}

    def said(*argv: str) -> str:
        return subprocess.run(
            [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=60, check=True
        ).stdout

    path = said(
        "-c", "import aa.mesh, aa.mesh.values as v; print(aa.mesh.event_path(), v.__file__)"
    )
    name, _, file = path.strip().rpartition(" ")
    assert name == ("pure Python" if pure or file.endswith(".py") else "compiled event path")
    out = said("-m", "aa.tools.cli", "--version")
    assert out.startswith("aa ") and out.endswith(f" ({name})\n")


def _shared_reader_copy(tmp_path: Path) -> tuple[Path, Path]:
    """The client's delivery reader (its `.pyx`, extension and hash) and the `.pxi` it
    includes, copied into *tmp_path* in the package's layout: (the client folder, the .pxi)."""
    client = ROOT / "client"
    (tmp_path / "client").mkdir()
    (tmp_path / "mesh").mkdir()
    for path in client.glob("_deliver.*"):
        shutil.copy(path, tmp_path / "client" / path.name)
    pxi = tmp_path / "mesh" / "_msgpack_read.pxi"
    shutil.copy(ROOT / "mesh" / "_msgpack_read.pxi", pxi)
    return tmp_path / "client", pxi


@pytest.mark.skipif(
    not list((ROOT / "client").glob(f"_deliver{SUFFIX}")),
    reason="the client's delivery reader is not compiled here",
)
def test_an_edit_to_an_included_file_makes_the_extension_stale(tmp_path, monkeypatch):
    """Both frame readers include `mesh/_msgpack_read.pxi`: an edit to it leaves their
    extensions built from other code, so they are not used (the Python reference runs) until
    built again; a `.pyx` whose included file is gone is not used either."""
    monkeypatch.delenv(_speedups.PURE_ENV, raising=False)
    folder, pxi = _shared_reader_copy(tmp_path)
    assert _speedups.pyx_fresh(folder, "_deliver")
    original = pxi.read_bytes()
    pxi.write_bytes(original.replace(b"raise _Other()", b"raise _Other()  # edited", 1))
    assert not _speedups.pyx_fresh(folder, "_deliver")
    pxi.unlink()
    assert not _speedups.pyx_fresh(folder, "_deliver")
    pxi.write_bytes(original)
    assert _speedups.pyx_fresh(folder, "_deliver")


def test_the_source_hash_follows_includes_and_the_projects_cimports(tmp_path):
    """What a `.pyx` takes in, as Cython finds it: its includes (relative to the file that
    names them, recursively), the `.pxd` of its own name, and cimports of the project's
    `.pxd` files (relative, or absolute below `aa`); Cython's own cimports are not files
    of the project. Each counts in the hash once."""
    from aa.mesh._pyx_source import dependencies, source_digest

    root = tmp_path  # the folder holding the top package's folders, as `aa/` in an install
    for folder in ("pkg", "pkg/sub", "other"):
        (root / folder).mkdir()
        (root / folder / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "_fast.pyx").write_text(
        'from libc.string cimport memcpy\ninclude "../shared.pxi"\n'
        "from . cimport helper\ncimport aa.other.types as t\n"
    )
    (root / "pkg" / "sub" / "_fast.pxd").write_text("cdef int x\n")
    (root / "pkg" / "shared.pxi").write_text('include "more.pxi"\ninclude "../pkg/more.pxi"\n')
    (root / "pkg" / "more.pxi").write_text("cdef int y\n")
    (root / "pkg" / "sub" / "helper.pxd").write_text("cdef int z\n")
    (root / "other" / "types.pxd").write_text("ctypedef int T\n")
    pyx = root / "pkg" / "sub" / "_fast.pyx"
    assert [(name, path.relative_to(root).as_posix()) for name, path in dependencies(pyx)] == [
        ("_fast.pxd", "pkg/sub/_fast.pxd"),
        ("../shared.pxi", "pkg/shared.pxi"),
        ("./helper.pxd", "pkg/sub/helper.pxd"),
        ("aa.other.types.pxd", "other/types.pxd"),
        ("more.pxi", "pkg/more.pxi"),
    ]
    before = source_digest(pyx)
    assert before is not None
    (root / "other" / "types.pxd").write_text("ctypedef long T\n")
    assert source_digest(pyx) not in (None, before)
    (root / "pkg" / "more.pxi").unlink()
    assert source_digest(pyx) is None
    alone = root / "alone.pyx"
    alone.write_bytes(b"def f():\n    return 1\n")
    assert source_digest(alone) == hashlib.sha256(alone.read_bytes()).hexdigest()
