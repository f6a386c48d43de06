"""The common predicate without `ast`: a conjunction of comparisons of names with literals.

`Temperature > 30 and Room == "A"` and `10 <= Price < 20 and Symbol == sym` are most of what
a million subscribers send. Parsing them with `ast.parse` and walking the tree costs more than
everything else a subscribe does, so this module reads exactly that shape with one regular
expression and builds the same `Grammar` (light: no closures) that `grammar.py` would. Any
other source, or anything unusual in it (parentheses, escapes, comments, a leading space,
context names, `_names`), returns None and takes the general path, so the answer can only
be the same. The property tests compare both paths with the python kernel.
"""

from __future__ import annotations

import keyword
import re
from typing import Any

from .calls import FORBIDDEN_NAMES
from .grammar import Atom, Grammar, Ref

__all__ = ["parse_conjunction"]

_TOKEN = re.compile(
    r"""[ \t]*(?:
      (?P<num>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|[1-9]\d*|0)(?![\w.]))
    | (?P<str>'[^'\\\n]*'|"[^"\\\n]*")
    | (?P<op>==|!=|<=|>=|<|>)
    | (?P<name>[A-Za-z][A-Za-z0-9_]*)(?![^\x00-\x7f])
    )""",
    re.VERBOSE,
)
_CONSTANT_WORDS = {"True": True, "False": False, "None": None}
#: Names that resolve to more than an event value or a param: the general path handles them.
_SPECIAL = frozenset({"type", "meta", "event", "params"}) | FORBIDDEN_NAMES.keys()
#: Longest source tried here (characters); longer ones take the general path.
MAX_FAST_SOURCE = 1024


def parse_conjunction(source: str) -> Grammar | None:
    """The light grammar of *source* if it is a conjunction of (chained) comparisons of
    names and literals; None otherwise."""
    if len(source) > MAX_FAST_SOURCE or not source or source[0].isspace():
        return None
    tokens: list[tuple[str, Any]] = []
    pos, end = 0, len(source.rstrip())
    while pos < end:
        m = _TOKEN.match(source, pos)
        if m is None:
            return None
        pos = m.end()
        kind = m.lastgroup
        text = m.group(kind)  # type: ignore[arg-type]
        if kind == "num":
            tokens.append(("const", float(text) if any(c in text for c in ".eE") else int(text)))
        elif kind == "str":
            tokens.append(("const", text[1:-1]))
        elif kind == "op":
            tokens.append(("op", text))
        elif text in _CONSTANT_WORDS:
            tokens.append(("const", _CONSTANT_WORDS[text]))
        elif text == "and":
            tokens.append(("and", None))
        elif keyword.iskeyword(text) or keyword.issoftkeyword(text) or text in _SPECIAL:
            return None
        else:
            tokens.append(("name", text))
    if not tokens:
        return None
    atoms: list[Atom] = []
    names: set[str] = set()
    mentions: set[str] = set()
    i, n = 0, len(tokens)
    while True:
        # comparison := operand (op operand)+ ; operand := name | const
        operands: list[Ref] = []
        ops: list[str] = []
        while True:
            if i >= n or tokens[i][0] not in ("name", "const"):
                return None
            operands.append(tokens[i])
            i += 1
            if i < n and tokens[i][0] == "op":
                ops.append(tokens[i][1])
                i += 1
                continue
            break
        if not ops:
            return None  # a bare operand: the general path makes it a truthiness atom
        for k, op in enumerate(ops):
            left, right = operands[k], operands[k + 1]
            reads = frozenset(x for kind, x in (left, right) if kind == "name")
            atoms.append(Atom(op, left, right, False, None, reads))
        for kind, x in operands:
            if kind == "name":
                names.add(x)
                mentions.add(x)
            elif isinstance(x, str):
                mentions.add(x)
        if i == n:
            break
        if tokens[i][0] != "and":
            return None
        i += 1
    return Grammar(None, True, [atoms], frozenset(names), frozenset(mentions), False)
