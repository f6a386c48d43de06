"""The common predicate without `ast`: a conjunction of comparisons of names with literals.

`Temperature > 30 and Room == "A"` and `10 <= Price < 20 and Symbol == sym` are most of what
a million subscribers send. Parsing them with `ast.parse` and walking the tree costs more than
everything else a subscribe does, so this module reads exactly that shape (in one pass over
`str.split` when tokens are single-spaced names, operators and integers, else with one
regular expression) and builds the same `Grammar` (light: no closures) that `grammar.py`
would. Any other source, or anything unusual in it (parentheses, escapes, comments, a
leading space, context names, `_names`), returns None and takes the general path, so the
answer can only be the same. The property tests compare both paths with the python kernel.
"""

from __future__ import annotations

import enum
import keyword
import re
from typing import Final

from ..sandbox import FORBIDDEN_NAMES
from .grammar import Atom, Grammar
from .shapes import Ref

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
CONSTANT_WORDS = {"True": True, "False": False, "None": None}
#: Names that resolve to more than an event value or a param: the general path handles them.
_SPECIAL = frozenset({"type", "meta", "event", "params"}) | FORBIDDEN_NAMES.keys()
#: Longest source tried here (characters); longer ones take the general path.
MAX_FAST_SOURCE = 1024


#: Words that are no operand here: keywords (but True/False/None, read first) and `_SPECIAL`.
NOT_OPERANDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | _SPECIAL
_NO_READS: frozenset[str] = frozenset()


COMPARE_OPS = frozenset(("==", "!=", "<", "<=", ">", ">="))


#: The scan of `_TOKEN` is needed (see `_parse_spaced`).
class _Unusual(enum.Enum):
    UNUSUAL = 0


_UNUSUAL: Final = _Unusual.UNUSUAL
#: name → (its Ref, the reads of comparing it with a literal): shared by every atom.
_NAME_REFS: dict[str, tuple[Ref, frozenset[str]]] = {}
_MAX_NAME_REFS = 10_000


def parse_conjunction(source: str) -> Grammar | None:
    """The light grammar of *source* if it is a conjunction of (chained) comparisons of
    names and literals; None otherwise."""
    if len(source) > MAX_FAST_SOURCE or not source or source[0].isspace():
        return None
    got = _parse_spaced(source)
    return _parse_tokens(_TOKEN.findall(source.rstrip())) if got is _UNUSUAL else got


def _name_ref(name: str) -> tuple[Ref, frozenset[str]]:
    got = _NAME_REFS.get(name)
    if got is None:
        got = (("name", name), frozenset((name,)))
        if len(_NAME_REFS) < _MAX_NAME_REFS:
            _NAME_REFS[name] = got
    return got


def _parse_spaced(source: str) -> Grammar | _Unusual | None:
    """`_parse_tokens` for a source of names, operators and decimal integers separated by
    single spaces (`a18 == 6 and 45 <= a2 <= 49`: what most subscribers send), read by
    `str.split` and `str` tests in one pass instead of the regular expression; `_UNUSUAL` at
    the first token it does not read (a string or float literal, other spacing, ...): the
    regular expression's tokens up to there are the same, so the answer can only be the same
    (a property test compares both). `flatplan.plan_spaced` reads tokens the same way and
    plans as it reads: a change here goes there too (a test holds the two equal)."""
    atoms: list[Atom] = []
    names: set[str] = set()
    prev: Ref | None = None
    prev_reads: frozenset[str] = _NO_READS
    op: str | None = None
    chained = False
    want_operand = True
    compare = COMPARE_OPS
    ref: Ref
    for tok in source.split(" "):
        if tok in compare:
            if want_operand:
                return None
            op, chained, want_operand = tok, True, True
            continue
        if not tok.isascii():
            return _UNUSUAL
        if tok.isidentifier():
            if tok[0] == "_":
                return _UNUSUAL
            if not want_operand:
                if tok == "and" and chained:
                    prev, prev_reads, chained, want_operand = None, _NO_READS, False, True
                    continue
                return None
            if tok in CONSTANT_WORDS:
                ref, reads = ("const", CONSTANT_WORDS[tok]), _NO_READS
            elif tok in NOT_OPERANDS:
                return None
            else:
                ref, reads = _name_ref(tok)
                names.add(tok)
        else:
            digits = tok[1:] if tok[:1] == "-" else tok
            if not digits.isdigit() or digits[0] == "0" and digits != "0":
                return _UNUSUAL
            if not want_operand:
                return None
            ref, reads = ("const", int(tok)), _NO_READS
        if op is not None:
            assert prev is not None  # an operator follows an operand
            if prev_reads and reads:
                both = prev_reads | reads
            else:
                both = prev_reads or reads
            atoms.append(Atom(op, prev, ref, False, None, both))
        prev, prev_reads, op, want_operand = ref, reads, None, False
    if want_operand or not chained:
        return None
    frozen = frozenset(names)
    return Grammar(None, True, [atoms], frozen, frozen, False)


def _parse_tokens(tokens: list[tuple[str, str, str, str, str]]) -> Grammar | None:
    """The light grammar from `_TOKEN`'s tokens of a source."""
    atoms: list[Atom] = []
    names: set[str] = set()
    strings: list[str] = []
    prev: Ref | None = None  # the operand before the pending operator
    op: str | None = None
    chained = False  # the current comparison has an operator
    want_operand = True
    for num, text, cmp, name, bad in tokens:
        if bad:
            return None
        if want_operand:
            ref: Ref
            if name:
                if name in CONSTANT_WORDS:
                    ref = ("const", CONSTANT_WORDS[name])
                elif name in NOT_OPERANDS:
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
                    reads = (
                        frozenset((prev[1], ref[1])) if ref[0] == "name" else frozenset((prev[1],))
                    )
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
