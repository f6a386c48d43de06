"""The packages' source carries no history (STYLE 18): no issue numbers, no dates and no load
figures in its comments and docstrings. A comment says why the code is as it is today; which
issue asked for it, when and under what load it was measured go in the commit message and in
docs/ (`docs/performance.md` for figures with their commands, `docs/decisions.md` for the why
and the history).

Only prose is read — comments and docstrings of the Python modules, and the text of the
static files the HTTP endpoint serves — so a string the code uses (a help text's example
date, a CSS colour) is never flagged, and the patterns are narrow: an ISO timestamp in an
example (``2030-01-02T03:04:05Z``) or a subscription id (``alice#3``) passes.
"""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize
import tomllib
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: The packages' folders, as pyproject.toml installs them (`aa.router` from `router/`, ...).
PACKAGE_DIRS = sorted(
    set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
            "package-dir"
        ].values()
    )
)
#: Static files served to browsers: source too, read whole (they hold no Python).
STATIC_SUFFIXES = (".js", ".css", ".html")

_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
#: What history looks like in prose, each with what it is called in a failure.
HISTORY: dict[str, re.Pattern[str]] = {
    # "issue 12", "issues 12 and 13", "Issue #15", "PR #40"
    "an issue number": re.compile(r"\b(?:issues?|PR|pull request)\s*#?\d+\b", re.IGNORECASE),
    # "2026-11-27", "2026-11-27 09:20" — not an example timestamp "2030-01-02T03:04:05Z"
    "a date": re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b(?!T)"),
    # "27 November 2026", "Nov 27, 2026", "November 2026"
    "a written date": re.compile(
        rf"\b(?:\d{{1,2}}\s+{_MONTH}\.?,?\s+(?:19|20)\d\d"
        rf"|{_MONTH}\.?\s+(?:\d{{1,2}},?\s+)?(?:19|20)\d\d)\b"
    ),
    # "load 0.45", "load average 1.2", "load 0.3–1.3 at their starts"
    "a load figure": re.compile(r"\bload(?:\s+average)?(?:\s+(?:of|about|at start))?\s+\d+\.\d"),
}
#: In Python prose only (a static file's "#000" is a colour): "(#12)", "see #12" — not
#: "alice#3", not a regex's "[-#0 +]".
ISSUE_REFERENCE: re.Pattern[str] = re.compile(r"(?:^|(?<=[\s(]))#\d+\b")


def _python_prose(source: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every comment and docstring line of a Python module's source:
    every comment token, and every string that stands alone as a statement (module, class
    and function docstrings, and the attribute docstrings that follow a field)."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for offset, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + offset, line


def history_in(text: str, *, python: bool = True) -> list[str]:
    """What in *text* is history: the kinds found, each with the words that matched.
    *python*: the text is a Python comment or docstring, where ``#12`` is an issue too."""
    patterns = dict(HISTORY, **({"an issue reference": ISSUE_REFERENCE} if python else {}))
    return [f"{what} ({m.group(0)!r})" for what, rx in patterns.items() for m in rx.finditer(text)]


def _package_files() -> Iterator[pathlib.Path]:
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and (path.suffix == ".py" or path.suffix in STATIC_SUFFIXES):
                yield path


def test_the_packages_source_holds_no_issue_numbers_dates_or_load_figures() -> None:
    found = []
    for path in _package_files():
        source = path.read_text(encoding="utf-8")
        python = path.suffix == ".py"
        lines = _python_prose(source) if python else enumerate(source.splitlines(), start=1)
        for number, line in lines:
            for what in history_in(line, python=python):
                found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()}")
    assert not found, (
        "history in the packages' source (STYLE 18): keep the why in a line or two, move the "
        "figures to docs/performance.md and the story to docs/decisions.md:\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "text",
    [
        "Choice (issue 12). Each bucket's pattern",
        "Issue 15 measured uvloop at about 10 % more events/s",
        "the BE-Tree workload of issues 12 and 14",
        "see #16 for the frame cap",
        "fixed in PR #40",
        "(5 runs on the idle machine, 2026-11-24 02:27)",
        "Before this release (2026-11-27): 94,600/s",
        "measured on 27 November 2026",
        "as of Nov 27, 2026",
        "since November 2026",
        "three pairs, load 0.3–1.3 at their starts",
        "idle machine, load average 0.45",
    ],
)
def test_history_is_found(text: str) -> None:
    assert history_in(text)


@pytest.mark.parametrize(
    "text",
    [
        "`issue_token` is what aa certs token runs",
        "a token issued 5 minutes ago",
        "+ alice#3 on router 9f2c…        a subscription matches now",
        '_PRINTF_SPEC = re.compile(r"[-#0 +]*(\\*|\\d+)?")',
        '>>> parse_since("2030-01-02T03:04:05Z").isoformat()',
        "'2030-01-11T10:00:00+00:00'",
        ">>> t0 = datetime(2030, 1, 7, 9, tzinfo=timezone.utc)",
        "<data>/eventlog/date=YYYY-MM-DD/hour=HH/part-<router>-<seq>.parquet",
        "64 MiB is about 450,000 rows of five values",
        "load the artefact if it changed",
        "a router may load 2 files at start",
        "Trust model (Å §4.6): a mesh has one CA",
    ],
)
def test_ordinary_code_and_prose_pass(text: str) -> None:
    assert history_in(text) == []


def test_a_colour_in_a_static_file_is_no_issue_reference() -> None:
    assert history_in('path.setAttribute("fill", "#000");', python=False) == []
    assert history_in("see issue 12", python=False)


def test_only_comments_and_docstrings_of_python_are_read() -> None:
    source = '''"""Module docstring, issue 12."""
HELP = "default: 2030-01-07, a Monday; issue 3 of the magazine"
class C:
    """Class docstring."""
    x: int = 1
    """Field docstring, measured 2026-11-27."""
y = 2  # comment, load 0.45
'''
    seen = {number: history_in(text) for number, text in _python_prose(source) if history_in(text)}
    assert sorted(seen) == [1, 6, 7]
