"""The packages stay mypy clean (STYLE: typed, with a py.typed marker), checked strictly.

The packages live in folders named `mesh`, `router`, … and are installed as `aa.mesh`,
`aa.router`, … by the editable install's import hook, which mypy cannot follow. Checked as
`mesh`, `router`, … every `from aa.mesh import …` would be a missing module, silently `Any`.
So mypy checks them under their installed names, through a tree of links `aa/<package>`
made for the run; its options (strict) come from `[tool.mypy]` in pyproject.toml.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["mesh", "router", "client", "http_api", "addins", "tools"]
#: Most `type: ignore` comments the packages may hold: the code is typed so that mypy
#: follows it (narrowing, Protocols, casts where a value is known), not silenced.
MAX_IGNORES = 20
_IGNORE = re.compile(r"#\s*type:\s*ignore")
#: An ignore that names its error codes and says why: `# type: ignore[code]  # why`.
_EXPLAINED = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(,\s*[a-z-]+)*\]\s*#\s*\S")


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the tree of links and mypy's cache, shared by this file's runs: the
    packages are checked from scratch once, and the probe below reuses what that run learnt
    of them (mypy's cache is keyed by each module's source, so an edit is checked again)."""
    folder = tmp_path_factory.mktemp("mypy")
    tree = folder / "src"
    (tree / "aa").mkdir(parents=True)
    for package in PACKAGES:
        (tree / "aa" / package).symlink_to(ROOT / package, target_is_directory=True)
    return folder


def mypy(folder: Path, *args: str) -> tuple[int, str]:
    """Run mypy on *args* with `aa.<package>` importable; its exit code and its report."""
    tree = folder / "src"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(folder / "cache"), *args],
        cwd=ROOT,
        env={**os.environ, "MYPYPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return result.returncode, (result.stdout + result.stderr).replace(f"{tree}/aa/", "")


@pytest.mark.timeout(600)  # a strict check from scratch: minutes on a busy machine
def test_packages_are_mypy_clean(checked: Path) -> None:
    code, report = mypy(checked, *(arg for p in PACKAGES for arg in ("-p", f"aa.{p}")))
    assert code == 0, report


@pytest.mark.timeout(600)  # from scratch when run alone
def test_the_check_sees_the_packages_under_their_installed_names(
    checked: Path, tmp_path: Path
) -> None:
    """A type error across packages is found: `aa.mesh` is no missing (`Any`) module."""
    probe = tmp_path / "probe.py"
    probe.write_text("from aa.mesh import Event\n\nx: int = Event\n")
    code, report = mypy(checked, str(probe))
    assert code == 1, report
    assert "probe.py:3: error: Incompatible types in assignment" in report, report


def _ignores() -> list[tuple[str, str]]:
    """(place, line) of every `type: ignore` in the packages' source."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _IGNORE.search(line):
                    found.append((f"{path.relative_to(ROOT)}:{n}", line.strip()))
    return found


def test_type_ignores_stay_few_and_each_says_why() -> None:
    found = _ignores()
    listing = "\n".join(f"{place}: {line}" for place, line in found)
    assert len(found) <= MAX_IGNORES, (
        f"{len(found)} type: ignore (at most {MAX_IGNORES}):\n{listing}"
    )
    unexplained = [f"{place}: {line}" for place, line in found if not _EXPLAINED.search(line)]
    assert not unexplained, "type: ignore without its code and a reason:\n" + "\n".join(unexplained)
