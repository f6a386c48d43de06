"""The manual builds: `mkdocs build --strict` of mkdocs.yml succeeds (a broken link or anchor, a
nav entry without its page, a page missing from the nav, an API reference that cannot be
collected: each is a warning, and strict makes it a failure), with no network; the README
stays a user's page; and every page of docs/ is in the nav except drafts for the lead
(`docs/notes-*.md`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).parent / "mkdocs"
README_MAX_LINES = 350


def nav_pages(nav: list[Any]) -> Iterator[str]:
    """The Markdown files a MkDocs nav names, at any depth."""
    for item in nav:
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for value in item.values():
                if isinstance(value, str):
                    yield value
                else:
                    yield from nav_pages(value)


def mkdocs_config() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")  # PyYAML comes with mkdocs

    class Loader(yaml.SafeLoader):  # mkdocs.yml may hold !ENV and !!python tags: keep them inert
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def test_the_readme_is_a_page_not_a_manual() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines: move the detail to a page of docs/"
    )


def test_every_page_of_the_manual_is_in_the_nav() -> None:
    config = mkdocs_config()
    listed = set(nav_pages(config["nav"]))
    pages = {
        p.relative_to(ROOT / "docs").as_posix()
        for p in (ROOT / "docs").rglob("*.md")
        if not p.name.startswith("notes-")
    }
    assert pages - listed == set(), "pages missing from mkdocs.yml's nav"
    assert listed - pages == set(), "nav entries without a page"


def test_the_readme_links_into_the_manual() -> None:
    """Relative links that work on a code host: each docs/ page the README names exists."""
    import re

    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#]+\.md)(?:#[^)]*)?\)", text)
    assert len(set(targets)) >= 10, targets
    missing = [t for t in targets if not (ROOT / t).is_file()]
    assert not missing, missing


@pytest.mark.timeout(300)
def test_the_manual_builds_strictly(tmp_path: Path) -> None:
    if not MKDOCS.exists():
        pytest.fail("mkdocs is not installed: pip install -e '.[docs]' (make does it)")
    argv = [str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")]
    unshare = shutil.which("unshare")
    offline = unshare is not None and (
        subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0
    )
    if offline:  # no network at all: a plugin that fetches (fonts, social cards) fails here
        argv = [unshare, "-n", *argv]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240, env=_env())
    assert done.returncode == 0, done.stderr[-4000:]
    site = tmp_path / "site"
    for page in ("index.html", "api/index.html", "performance/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "index.html").read_text()
    for name in ("AsyncClient", "Router", "RouterConfig", "HttpEndpoint", "AaError"):
        assert 'id="aa.' in api and name in api, name
    assert not (site / "hooks").exists()  # the build's hook is not published


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
