"""The README's figures can be reproduced with the commands beside them: every benchmark
command the README names (``python tests/bench/NAME.py --flag …``, in backticks, in its
tables and text) names a benchmark that exists, and every flag it gives is one that
benchmark takes. Running them is a matter of minutes to hours and of an idle machine, so
that is left to the reader (and to whoever updates a figure); this keeps the commands from
rotting as the benchmarks change."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: A benchmark command in backticks: `python tests/bench/NAME.py ...` (also with .venv/bin/).
COMMAND = re.compile(r"`(?:\S*/)?python3? (tests/bench/\w+\.py)([^`]*)`")


def commands() -> list[tuple[str, list[str]]]:
    return [(path, shlex.split(rest)) for path, rest in COMMAND.findall(README)]


def test_the_readme_names_its_benchmarks() -> None:
    named = {path for path, _ in commands()}
    assert {
        "tests/bench/bench_router.py",
        "tests/bench/bench_peers.py",
        "tests/bench/bench_ring.py",
    } <= named


@pytest.mark.parametrize("path", sorted({path for path, _ in commands()}))
def test_each_benchmark_command_of_the_readme_runs_as_written(path: str) -> None:
    script = ROOT / path
    assert script.is_file(), f"the README names {path}, which does not exist"
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", done.stdout))
    for _, args in (c for c in commands() if c[0] == path):
        for arg in args:
            if arg.startswith("--"):
                flag = arg.split("=", 1)[0]
                assert flag in flags, f"the README runs {path} with {flag}, which it does not take"
