"""A light start: `pip install aa-mesh` (and `make run`) installs what a router needs, not
PySpark, browsers or test tools; `make run` starts the router without building Spark's class
archive first; the archive is shared per PySpark version, not made per clone."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Distributions a router does not need: each is an extra's.
HEAVY = {
    "pyspark",
    "selenium",
    "mypy",
    "pytest",
    "ruff",
    "hypothesis",
    "schemathesis",
    "mkdocs",
    "mkdocs-material",
    "psycopg",
}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_plain_install_has_no_heavy_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    plain = {_name(r) for r in project["dependencies"]}
    assert not plain & HEAVY, plain & HEAVY
    extras = project["optional-dependencies"]
    assert {_name(r) for r in extras["mining"]} == {"pyspark"}
    assert "psycopg" in {_name(r) for r in extras["postgres"]}
    dev = {_name(r) for r in extras["dev"]}
    assert {"pytest", "mypy", "selenium", "ruff"} <= dev
    assert "aa-mesh[postgres,mining,docs]" in extras["dev"]  # make test gets them all


def _recipe(makefile: str, target: str) -> list[str]:
    block = makefile[makefile.index(f"\n{target}:") :].split("\n\n", 1)[0]
    return [line.strip() for line in block.splitlines()[1:] if line.startswith("\t")]


def test_make_run_installs_only_the_router_and_starts_it_at_once() -> None:
    makefile = (ROOT / "Makefile").read_text()
    run_needs = re.search(r"^run: (.*)$", makefile, re.M)
    assert run_needs is not None and run_needs.group(1).split() == ["$(STAMP)"]
    install = _recipe(makefile, "$(STAMP)")
    assert "$(PY) -m pip install -q -e ." in install
    assert not any("[" in line or "aa mine" in line for line in install)  # no extras, no Spark
    assert not [ln for ln in makefile.splitlines() if ln.startswith("\t") and "aa mine" in ln]
    assert "-e '.[dev]'" in " ".join(_recipe(makefile, "$(DEV)"))
    for target in ("test", "lint", "bench", "docs"):
        needs = re.search(rf"^{target}: (.*)$", makefile, re.M)
        assert needs is not None and "$(DEV)" in needs.group(1), target


def test_the_class_archive_is_kept_per_pyspark_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pyspark = pytest.importorskip("pyspark")
    from aa.tools.mining.session import SparkConfig, archive_dir, class_archive_file

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = archive_dir(SparkConfig())
    assert folder == tmp_path / "aa" / pyspark.__version__
    assert archive_dir(SparkConfig(class_archive_dir="")) is None
    # With the shared Spark home, the archive's name no longer depends on the clone.
    monkeypatch.setenv("SPARK_HOME", str(folder / "spark"))
    here = class_archive_file(folder, "/usr/bin/java")
    monkeypatch.setattr(pyspark, "__file__", "/elsewhere/.venv/site-packages/pyspark/__init__.py")
    assert class_archive_file(folder, "/usr/bin/java") == here


def test_the_shared_spark_home_links_pysparks_files_once(tmp_path: Path) -> None:
    pyspark = pytest.importorskip("pyspark")
    from aa.tools.mining.session import shared_spark_home

    home = shared_spark_home(tmp_path)
    assert home == tmp_path / "spark" and (home / ".complete").is_file()
    source = Path(pyspark.__file__).parent
    jars = sorted(p.name for p in (source / "jars").iterdir())
    assert sorted(p.name for p in (home / "jars").iterdir()) == jars
    one = jars[0]
    if os.stat(source / "jars" / one).st_dev == os.stat(tmp_path).st_dev:
        assert (home / "jars" / one).samefile(source / "jars" / one)  # a link, no space taken
    assert (home / "bin" / "spark-submit").is_file()
    assert shared_spark_home(tmp_path) == home  # made once
    assert [p.name for p in tmp_path.iterdir()] == ["spark"]  # nothing half made left
