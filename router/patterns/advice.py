"""Warnings for patterns that cannot match (issue 14): names no event has carried, and bare
names obviously meant as text.

    >>> pattern_warnings(PatternSpec(source="Temprature > 100"), seen={"Temperature", "Sensor"})
    ['no event has had `Temprature`; did you mean `Temperature`?']
    >>> pattern_warnings(PatternSpec(source="Sensor == lab-1"), seen={"Sensor"})
    ["`lab-1` is read as an expression, not as text; did you mean Sensor == 'lab-1'?"]

Pure: the router passes the value names it has seen (recently, or from the mining job's
schema); the caller shows the warnings at subscribe and subscribes anyway (a name may simply
not have been published yet). With no names seen at all, only the text hints are given.
"""

from __future__ import annotations

import ast
import builtins as _builtins
import difflib
import re
from collections.abc import Collection, Mapping
from typing import Any

from aa.mesh import PatternSpec

__all__ = ["pattern_warnings", "MAX_WARNINGS", "MAX_ADVICE_SOURCE", "MAX_SUGGESTION_COMPARISONS"]

#: Most warnings for one pattern: a pattern of a hundred typos needs the first few. The work
#: stops there too, not after (advice runs on the router's loop at every subscribe).
MAX_WARNINGS = 5
#: Longest source given advice (characters). Parsing is linear, but a subscribe must stay
#: cheap for the router whatever a stranger sends; real patterns are far shorter.
MAX_ADVICE_SOURCE = 8192
#: Most seen names compared per subscribe when looking for a "did you mean": an attacker can
#: fill the seen names (10,000) with look-alikes; past this budget a warning has no suggestion.
MAX_SUGGESTION_COMPARISONS = 4000
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
    try:
        tree = ast.parse(spec.source, "<pattern>", "eval" if spec.format == "expr" else "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    params = params or {}
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
            out.append(
                f"no event has had `{name}`" + (f"; did you mean `{close}`?" if close else "")
            )
    return out[:MAX_WARNINGS]


class _Suggestions:
    """difflib's close match (ratio ≥ 0.75), or a name equal but for case, under a budget of
    comparisons shared by every name of one pattern."""

    def __init__(self, seen: Collection[str]) -> None:
        self.by_lower = {s.lower(): s for s in seen}
        self.by_length: dict[int, list[str]] = {}
        for s in seen:
            self.by_length.setdefault(len(s), []).append(s)
        self.budget = MAX_SUGGESTION_COMPARISONS

    def closest(self, name: str) -> str | None:
        matcher = difflib.SequenceMatcher()
        matcher.set_seq2(name)
        best, best_ratio = None, 0.75
        n = len(name)
        # ratio = 2M / (a + b) ≥ 0.75 needs 3/5 ≤ a/b ≤ 5/3: nothing else can be close.
        for length in range((3 * n + 4) // 5, (5 * n) // 3 + 1):
            for candidate in sorted(self.by_length.get(length, ())):
                if self.budget <= 0:
                    return best or self.by_lower.get(name.lower())
                self.budget -= 1
                matcher.set_seq1(candidate)
                if matcher.real_quick_ratio() >= best_ratio and matcher.quick_ratio() >= best_ratio:
                    r = matcher.ratio()
                    if r > best_ratio or (r == best_ratio and best is None):
                        best, best_ratio = candidate, r
        return best or self.by_lower.get(name.lower())


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
    into lines at every call, which made advice quadratic in the source (16 KB: 15 s)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.starts = [0]
        for line in source.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def __call__(self, node: ast.AST) -> str:
        try:
            lineno, col = node.lineno, node.col_offset  # type: ignore[attr-defined]
            end, end_col = node.end_lineno, node.end_col_offset  # type: ignore[attr-defined]
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
