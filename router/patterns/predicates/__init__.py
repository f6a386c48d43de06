"""aa.router.patterns.predicates — the predicate tier: patterns inside the closed grammar,
evaluated by the router itself, and their plans for the index.

Who owns what:

- `grammar.py` (`parse_predicate`) and `shapes.py`: which Python expressions are inside
  the grammar, compiled from the AST into closures;
- `fastpath.py` (`parse_conjunction`): the common conjunction of comparisons read without
  `ast`;
- `plans.py`: what a plan is made of (`Access`, `Plan`, the kinds of access `EQ`, `RANGE`,
  `INTERVAL`, `PREFIX`, `SUFFIX` and where an operand is read, `VALUE`, `TYPE`, `META`,
  `PARAM`), shared by both planners and read by the index;
- `flatplan.py` (`plan_spaced`): the one-pass plan of the common conjunction;
- `program.py` (`PredicateProgram`): the tier's program, with the kernels' interface, and
  its general planner.

It uses the sandbox room for the names pattern code may not use and its guards (so a
predicate has the python kernel's semantics and limits), and no room above.
"""

from .fastpath import parse_conjunction
from .flatplan import plan_spaced
from .grammar import parse_predicate
from .plans import (
    EQ,
    INTERVAL,
    MAX_INTERVAL_BOUND,
    META,
    PARAM,
    PREFIX,
    RANGE,
    SUFFIX,
    TYPE,
    VALUE,
    Access,
    Plan,
    hashable,
)
from .program import PredicateProgram

__all__ = [
    "Access",
    "EQ",
    "INTERVAL",
    "MAX_INTERVAL_BOUND",
    "META",
    "PARAM",
    "PREFIX",
    "Plan",
    "PredicateProgram",
    "RANGE",
    "SUFFIX",
    "TYPE",
    "VALUE",
    "hashable",
    "parse_conjunction",
    "parse_predicate",
    "plan_spaced",
]
