"""Warnings for patterns that may never match: names that look like typos of names events
have carried, and bare names obviously meant as text.

    >>> pattern_warnings(PatternSpec(source="Temprature > 100"), seen={"Temperature", "Sensor"})
    ['no event has had `Temprature`; did you mean `Temperature`?']
    >>> pattern_warnings(PatternSpec(source="Door == 'open'"), seen={"Temperature", "Sensor"})
    []
    >>> pattern_warnings(PatternSpec(source="Sensor == lab-1"), seen={"Sensor"})
    ["`lab-1` is read as an expression, not as text; did you mean Sensor == 'lab-1'?"]

A name no event has had is the normal case in publish/subscribe (subscribers come first), so
it is warned about only when it is a near miss of a name seen: equal but for case, or within
`typo_distance` edits (Damerau–Levenshtein, a transposition one edit) of it.

Pure: the router passes the value names it has seen (recently, or from the mining job's
schema); the caller shows the warnings at subscribe and subscribes anyway (a name may simply
not have been published yet). With no names seen at all, only the text hints are given.
"""

from __future__ import annotations

import ast
import builtins as _builtins
import re
from collections.abc import Collection, Mapping
from typing import Any

from aa.mesh import PatternSpec

from .predicates import parse_conjunction

__all__ = [
    "pattern_warnings",
    "typo_distance",
    "MAX_WARNINGS",
    "MAX_ADVICE_SOURCE",
    "MAX_SUGGESTION_COMPARISONS",
]

#: Most warnings for one pattern: a pattern of a hundred typos needs the first few. The work
#: stops there too, not after (advice runs on the router's loop at every subscribe).
MAX_WARNINGS = 5
#: Longest source given advice (characters). Parsing is linear, but a subscribe must stay
#: cheap for the router whatever a stranger sends; real patterns are far shorter.
MAX_ADVICE_SOURCE = 8192
#: Most seen names compared per subscribe when looking for a "did you mean": an attacker can
#: fill the seen names (10,000) with look-alikes; past this budget a warning has no suggestion.
MAX_SUGGESTION_COMPARISONS = 4000
#: Longest name looked at for a near miss (characters): edit distances cost its length.
MAX_TYPO_NAME = 64
#: Names a pattern resolves without the event (expressions and scripts).
_FRAMEWORK = frozenset(
    {"type", "meta", "event", "params", "state", "forward", "new_event", "subscribers", "router"}
)
_DEFAULT_BUILTINS = frozenset(dir(_builtins)) | {
    "math",
    "re",
    "statistics",
    "datetime",
    "random",
    "collections",
    "itertools",
    "json",
    "functools",
}


def pattern_warnings(
    spec: PatternSpec,
    seen: Collection[str],
    params: Mapping[str, Any] | None = None,
    builtins: Collection[str] = _DEFAULT_BUILTINS,
) -> list[str]:
    """Warnings for *spec* given the value names *seen* on the mesh, the subscriber's
    *params* and the names the sandbox provides (*builtins*). Never raises: a pattern that
    does not parse gets no warnings (subscribing reports its error)."""
    if spec.kernel != "python" or len(spec.source) > MAX_ADVICE_SOURCE:
        return []
    params = params or {}
    if spec.format == "expr":
        # The common conjunction of names and literals, every name seen or a param, has
        # nothing to warn of: told without `ast`, as subscribing reads it.
        light = parse_conjunction(spec.source)
        if light is not None and all(n in seen or n in params for n in light.names):
            return []
    try:
        tree = ast.parse(spec.source, "<pattern>", "eval" if spec.format == "expr" else "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    local = _bound_names(tree)
    unknown = {
        n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Name)
        and isinstance(n.ctx, ast.Load)
        and n.id not in params
        and n.id not in _FRAMEWORK
        and n.id not in builtins
        and n.id not in local
    }
    out = _text_hints(spec.source, tree, unknown, seen)
    hinted = {word for w in out for word in re.split(r"\W+", w.split("`")[1])}
    if seen:
        suggest = _Suggestions(seen)
        for name in sorted(unknown - set(seen)):
            if len(out) >= MAX_WARNINGS:
                break
            if name in hinted:
                continue  # already explained as text
            close = suggest.closest(name)
            if close is not None:  # else a name simply not published yet: nothing to say
                out.append(f"no event has had `{name}`; did you mean `{close}`?")
    return out[:MAX_WARNINGS]


def typo_distance(name: str) -> int:
    """Most edits at which a seen name counts as what *name* was meant to be: none for up to
    three characters (`A` and `B` are two names, not a typo), one up to five, else two.

    >>> [typo_distance(n) for n in ("A", "Door", "Temperature")]
    [0, 1, 2]
    """
    n = len(name)
    return 0 if n <= 3 else 1 if n <= 5 else 2


class _Suggestions:
    """The nearest seen name within `typo_distance` edits, or one equal but for case, under a
    budget of comparisons shared by every name of one pattern."""

    def __init__(self, seen: Collection[str]) -> None:
        self.by_lower = {s.lower(): s for s in seen}
        self.by_length: dict[int, list[str]] = {}
        for s in seen:
            self.by_length.setdefault(len(s), []).append(s)
        self.sorted: set[int] = set()  # lengths whose list is sorted (when first needed)
        self.budget = MAX_SUGGESTION_COMPARISONS

    def closest(self, name: str) -> str | None:
        same_but_case = self.by_lower.get(name.lower())
        k = typo_distance(name)
        if same_but_case is not None or k == 0 or len(name) > MAX_TYPO_NAME:
            return same_but_case
        n = len(name)
        best, best_d = None, k + 1
        for length in sorted(range(n - k, n + k + 1), key=lambda m: abs(m - n)):
            if self.budget <= 0:
                return best
            candidates = self.by_length.get(length, [])
            if length not in self.sorted:
                candidates.sort()  # the same suggestion whatever the order names were seen in
                self.sorted.add(length)
            for candidate in candidates:
                if self.budget <= 0:
                    return best
                self.budget -= 1
                d = _edits(name, candidate, best_d - 1)
                if d < best_d:
                    best, best_d = candidate, d
        return best


def _edits(a: str, b: str, cap: int) -> int:
    """The optimal-string-alignment distance of *a* and *b* (insertions, deletions,
    substitutions, adjacent transpositions), or ``cap + 1`` once it is surely over *cap*:
    only the band of cells within *cap* of the diagonal is computed."""
    if abs(len(a) - len(b)) > cap:
        return cap + 1
    start = 0  # a common prefix and suffix cost no edit: only the middle is compared
    while start < len(a) and start < len(b) and a[start] == b[start]:
        start += 1
    end = 0
    while end < len(a) - start and end < len(b) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    a, b = a[start : len(a) - end], b[start : len(b) - end]
    big = cap + 1
    prev2: list[int] | None = None
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [big] * (len(b) + 1)
        cur[0] = i
        lo, hi = max(1, i - cap), min(len(b), i + cap)
        for j in range(lo, hi + 1):
            cost = a[i - 1] != b[j - 1]
            v = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if prev2 is not None and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                v = min(v, prev2[j - 2] + 1)
            cur[j] = min(v, big)
        if min(cur[max(0, lo - 1) : hi + 1]) > cap:
            return big
        prev2, prev = prev, cur
    return min(prev[len(b)], big)


def _bound_names(tree: ast.AST) -> set[str]:
    """Names a script or comprehension binds itself (never the event's)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
    return out


def _text_hints(source: str, tree: ast.AST, unknown: set[str], seen: Collection[str]) -> list[str]:
    """`Sensor == lab-1`, `Room == A`: a comparison with an operand made only of names that
    are neither seen nor params (joined by `-` or `.`, with numbers) reads as text meant."""
    unseen = unknown - set(seen)
    out: list[str] = []
    segment = _Segments(source)
    for node in ast.walk(tree):
        if len(out) >= MAX_WARNINGS:
            break
        if not isinstance(node, ast.Compare) or not all(
            isinstance(o, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for o in node.ops
        ):
            continue
        operands = [node.left, *node.comparators]
        texts = [_texts(o, unseen) for o in operands]
        if all(texts) and len(operands) == 2:
            # Both sides unseen: `Sensor == lab-1` still reads as a field and a word.
            plain = [isinstance(o, ast.Name) for o in operands]
            if plain.count(True) != 1:
                continue
            texts[plain.index(True)] = []
        if all(texts) or not any(texts):
            continue  # no telling which side is the field
        if len(operands) == 2 and _literal(operands[texts.index([])]):
            continue  # `Door == "open"`: the name beside a literal is the field (not seen yet)
        whole = segment(node)
        for words in texts:
            for word in words:
                text = segment(word)
                if text and len(text) <= 60 and whole:
                    fixed = whole.replace(text, repr(text.replace(" ", "")), 1)
                    out.append(
                        f"`{text}` is read as an expression, not as text; did you mean {fixed}?"
                    )
    return out


def _literal(node: ast.AST) -> bool:
    """A constant, or a tuple, list or set of constants."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(isinstance(e, ast.Constant) for e in node.elts)
    return isinstance(node, ast.Constant)


class _Segments:
    """`ast.get_source_segment` in O(length of the segment): that one splits the whole source
    into lines at every call, which would make advice quadratic in the source."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.starts = [0]
        for line in source.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def __call__(self, node: ast.expr) -> str:
        try:
            lineno, col = node.lineno, node.col_offset
            end, end_col = node.end_lineno, node.end_col_offset
            if end is None or end_col is None or end - lineno > 0:
                return ""  # hints are for one-line operands
            line = self.source[self.starts[lineno - 1] : self.starts[lineno]]
            return line.encode()[col:end_col].decode()  # offsets count UTF-8 bytes
        except (AttributeError, IndexError, UnicodeDecodeError):
            return ""


def _texts(node: ast.expr, unseen: set[str]) -> list[ast.expr]:
    """*node* (or the items of a tuple, list or set) when made only of unseen names."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    out = []
    for item in items:
        names = _word_names(item)
        if names and names <= unseen:
            out.append(item)
    return out


def _word_names(node: ast.expr) -> set[str] | None:
    """The names of an operand built only of names, numbers, `-` and `.`; else None."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        left, right = _word_names(node.left), _word_names(node.right)
        if left is None or right is None:
            return None
        return left | right
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return set()
    if isinstance(node, ast.Attribute):
        return _word_names(node.value)
    return None
