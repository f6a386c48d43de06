"""The docs' figures can be reproduced with the commands beside them: every benchmark command
that README.md or a page of the manual (`docs/*.md`) names (``python tests/bench/NAME.py
--flag …``, in backticks, in its tables and text) names a benchmark that exists, and every
flag it gives is one that benchmark takes. Running them is a matter of minutes to hours and
of an idle machine, so that is left to the reader (and to whoever updates a figure); this
keeps the commands from rotting as the benchmarks change.

Left out: drafts for the lead (`docs/notes-*.md`), and the record of earlier figures
(`docs/performance-history.md`), whose commands are kept as they were run then, with flags
the benchmarks have since renamed; its figures are not meant to be reproduced by today's
code."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Pages whose commands are a record of what was run, not something to run today.
HISTORY = {"docs/performance-history.md"}
PAGES = {
    p.relative_to(ROOT).as_posix(): p.read_text()
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    if not p.name.startswith("notes-") and p.relative_to(ROOT).as_posix() not in HISTORY
}
#: A benchmark command in backticks: `python tests/bench/NAME.py ...` (also with .venv/bin/).
COMMAND = re.compile(r"`(?:\S*/)?python3? (tests/bench/\w+\.py)([^`]*)`")


def commands() -> list[tuple[str, str, list[str]]]:
    """(page, benchmark, its arguments) for every benchmark command of the pages."""
    return [
        (page, path, shlex.split(rest))
        for page, text in PAGES.items()
        for path, rest in COMMAND.findall(text)
    ]


def test_the_performance_page_names_its_benchmarks() -> None:
    named = {path for page, path, _ in commands() if page == "docs/performance.md"}
    assert {
        "tests/bench/bench_router.py",
        "tests/bench/bench_peers.py",
        "tests/bench/bench_ring.py",
    } <= named


def test_the_history_page_is_still_there() -> None:
    """What is left out above exists (a rename would silently stop the exemption meaning
    anything) and is linked from the performance page."""
    for page in HISTORY:
        assert (ROOT / page).is_file(), page
        assert Path(page).name in PAGES["docs/performance.md"]


@pytest.mark.parametrize("path", sorted({path for _, path, _ in commands()}))
def test_each_benchmark_command_of_the_docs_runs_as_written(path: str) -> None:
    script = ROOT / path
    pages = sorted({page for page, p, _ in commands() if p == path})
    assert script.is_file(), f"{', '.join(pages)} name {path}, which does not exist"
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", done.stdout))
    for page, _, args in (c for c in commands() if c[1] == path):
        for arg in args:
            if arg.startswith("--"):
                flag = arg.split("=", 1)[0]
                assert flag in flags, f"{page} runs {path} with {flag}, which it does not take"
