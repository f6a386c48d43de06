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
    | (?P<bad>[\s\S])
    )""",
    re.VERBOSE,
)
_CONSTANT_WORDS = {"True": True, "False": False, "None": None}
#: Names that resolve to more than an event value or a param: the general path handles them.
_SPECIAL = frozenset({"type", "meta", "event", "params"}) | FORBIDDEN_NAMES.keys()
#: Longest source tried here (characters); longer ones take the general path.
MAX_FAST_SOURCE = 1024


#: Words that are no operand here: keywords (but True/False/None, read first) and `_SPECIAL`.
_NOT_OPERANDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | _SPECIAL
_NO_READS: frozenset[str] = frozenset()


_OP_TOKENS = {op: ("", "", op, "", "") for op in ("==", "!=", "<", "<=", ">", ">=")}


def _split_tokens(source: str) -> list[tuple[str, str, str, str, str]] | None:
    """What `_TOKEN.findall` gives for a source of names, operators and decimal integers
    separated by single spaces (`a18 == 6 and 45 <= a2 <= 49`: what most subscribers send),
    by `str.split` and `str` tests instead of the regular expression; None for anything else
    (a string or float literal, other spacing, ...), which the regular expression reads."""
    out = []
    ops = _OP_TOKENS
    for tok in source.split(" "):
        op = ops.get(tok)
        if op is not None:
            out.append(op)
        elif not tok.isascii():
            return None
        elif tok.isidentifier():
            if tok[0] == "_":
                return None
            out.append(("", "", "", tok, ""))
        else:
            digits = tok[1:] if tok[:1] == "-" else tok
            if not digits.isdigit() or digits[0] == "0" and digits != "0":
                return None
            out.append((tok, "", "", "", ""))
    return out


def parse_conjunction(source: str) -> Grammar | None:
    """The light grammar of *source* if it is a conjunction of (chained) comparisons of
    names and literals; None otherwise."""
    if len(source) > MAX_FAST_SOURCE or not source or source[0].isspace():
        return None
    atoms: list[Atom] = []
    names: set[str] = set()
    strings: list[str] = []
    prev: Ref | None = None  # the operand before the pending operator
    op: str | None = None
    chained = False  # the current comparison has an operator
    want_operand = True
    tokens = _split_tokens(source) or _TOKEN.findall(source.rstrip())  # either scan runs in C
    for num, text, cmp, name, bad in tokens:
        if bad:
            return None
        if want_operand:
            ref: Ref
            if name:
                if name in _CONSTANT_WORDS:
                    ref = ("const", _CONSTANT_WORDS[name])
                elif name in _NOT_OPERANDS:
                    return None
                else:
                    ref = ("name", name)
                    names.add(name)
            elif num:
                ref = ("const", float(num) if "." in num or "e" in num or "E" in num else int(num))
            elif text:
                ref = ("const", text[1:-1])
                strings.append(text[1:-1])
            else:
                return None
            if op is not None:
                assert prev is not None
                if prev[0] == "name":
                    reads = frozenset((prev[1], ref[1])) if ref[0] == "name" else frozenset((prev[1],))
                else:
                    reads = frozenset((ref[1],)) if ref[0] == "name" else _NO_READS
                atoms.append(Atom(op, prev, ref, False, None, reads))
            prev, op, want_operand = ref, None, False
        elif cmp:
            op, chained, want_operand = cmp, True, True
        elif name == "and" and chained:
            prev, chained, want_operand = None, False, True
        else:
            return None
    if want_operand or not chained:
        return None  # ends on an operator or "and", or a bare operand (truthiness)
    frozen = frozenset(names)
    return Grammar(None, True, [atoms], frozen, frozen.union(strings) if strings else frozen, False)
