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
from typing import Any, Collection, Mapping

from aa.mesh import PatternSpec

__all__ = ["pattern_warnings", "MAX_WARNINGS"]

#: Most warnings for one pattern: a pattern of a hundred typos needs the first few.
MAX_WARNINGS = 5
#: Names a pattern resolves without the event (expressions and scripts).
_FRAMEWORK = frozenset({"type", "meta", "event", "params", "state", "forward", "new_event", "subscribers", "router"})
_DEFAULT_BUILTINS = frozenset(dir(_builtins)) | {"math", "re", "statistics", "datetime", "random", "collections", "itertools", "json", "functools"}


def pattern_warnings(
    spec: PatternSpec,
    seen: Collection[str],
    params: Mapping[str, Any] | None = None,
    builtins: Collection[str] = _DEFAULT_BUILTINS,
) -> list[str]:
    """Warnings for *spec* given the value names *seen* on the mesh, the subscriber's
    *params* and the names the sandbox provides (*builtins*). Never raises: a pattern that
    does not parse gets no warnings (subscribing reports its error)."""
    if spec.kernel != "python":
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
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        and n.id not in params and n.id not in _FRAMEWORK and n.id not in builtins and n.id not in local
    }  # fmt: skip
    out = _text_hints(spec.source, tree, unknown, seen)
    hinted = {word for w in out for word in re.split(r"\W+", w.split("`")[1])}
    if seen:
        pool = sorted(seen)
        for name in sorted(unknown - set(seen)):
            if name in hinted:
                continue  # already explained as text
            close = difflib.get_close_matches(name, pool, n=1, cutoff=0.75) or [s for s in pool if s.lower() == name.lower()][:1]
            out.append(f"no event has had `{name}`" + (f"; did you mean `{close[0]}`?" if close else ""))
    return out[:MAX_WARNINGS]


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
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or not all(isinstance(o, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for o in node.ops):
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
        whole = ast.get_source_segment(source, node) or ""
        for words in texts:
            for word in words:
                text = ast.get_source_segment(source, word) or ""
                if text and len(text) <= 60 and whole:
                    fixed = whole.replace(text, repr(text.replace(" ", "")), 1)
                    out.append(f"`{text}` is read as an expression, not as text; did you mean {fixed}?")
    return out


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
