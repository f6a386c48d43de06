"""aa.router.patterns.sandbox — pattern code in the router's process: the `python` and
`xpath` kernels, and the sandbox they run in.

Who owns what:

- `assembly.py`: `Sandbox`, one engine's budget, guards, module proxies and builtins,
  assembled once;
- `budget.py`: the per-evaluation budget (time, allocations, call depth) and `SandboxStop`,
  the one exception that stops a pattern (codes `MEMORY`, `TIMEOUT`, `FORBIDDEN`);
- `compiler.py`, `calls.py`, `modules.py`, `guards.py`: what pattern code may name, call
  and import, and the run-time guards its rewritten code calls (`FORBIDDEN_NAMES`,
  `Guards`);
- `views.py`: the read-only objects a pattern sees besides the event's values;
- `limits.py`: what the engine is given (`HostFacts`, `SandboxLimits`), the `Delivery` it
  hands back, and the caps that are not configurable (`MAX_STATE_DEPTH`, ...);
- `runerrors.py`: run-time errors of pattern code, counted and told (`ErrorNotice`,
  `ERRORS_CODE`, `NO_MATCH_IN_EXPRESSIONS`, `MAX_ERROR_TEXT`, `MAX_LINE_TEXT`);
- `python_kernel.py` (`ExprProgram`, `ScriptProgram`) and `xpath_kernel.py`
  (`XPathProgram`, `XmlCache`): the kernels' programs.

This room is the bottom of `aa.router.patterns`: it imports no other room of it (the
kernels name the index's `Bucket` for type checking only). What it does not cover alone,
and why patterns outside the closed grammar run in worker processes, is in the docstring of
`aa.router.patterns`.
"""

from .assembly import Sandbox
from .budget import MEMORY, TIMEOUT, SandboxStop
from .calls import FORBIDDEN_NAMES
from .guards import Guards
from .limits import MAX_STATE_DEPTH, Delivery, HostFacts, SandboxLimits
from .python_kernel import ExprProgram, ScriptProgram
from .runerrors import (
    ERRORS_CODE,
    MAX_ERROR_TEXT,
    MAX_LINE_TEXT,
    NO_MATCH_IN_EXPRESSIONS,
    ErrorNotice,
)
from .xpath_kernel import XmlCache, XPathProgram

__all__ = [
    "Delivery",
    "ERRORS_CODE",
    "ErrorNotice",
    "ExprProgram",
    "FORBIDDEN_NAMES",
    "Guards",
    "HostFacts",
    "MAX_ERROR_TEXT",
    "MAX_LINE_TEXT",
    "MAX_STATE_DEPTH",
    "MEMORY",
    "NO_MATCH_IN_EXPRESSIONS",
    "Sandbox",
    "SandboxLimits",
    "SandboxStop",
    "ScriptProgram",
    "TIMEOUT",
    "XPathProgram",
    "XmlCache",
]
