"""aa.router.quench — quenching across the mesh (Å §4.4): publishers told whether anyone is
interested in what they would publish.

Owns: the registrations a router knows and the interest its own publishers hear of
(`QuenchTable`, pure), answers for other routers from their interest summaries under
interest routing (`summary_answers`, pure), the service that notifies publishers and, under
flood routing, floods registrations, reports and keep-alives (`QuenchService`), and its
timings (`QuenchConfig`).

Does not own: matching a prototype against a subscription (the pattern engine's
`matches_prototype`, `aa.router.patterns`), the flood of control messages
(`aa.router.links`).
"""

from .config import MAX_QUENCH_TIMEOUT, MAX_QUENCHES_PER_CLIENT, QuenchConfig
from .registrations import (
    MAX_REGISTRATIONS,
    Change,
    QuenchTable,
    Registration,
    parse_registrations,
    parse_report,
)
from .service import QUENCH_TOPIC, QuenchService
from .summaries import SUMMARY_SUB, Listening, summary_answers

__all__ = [
    "Change",
    "Listening",
    "MAX_QUENCHES_PER_CLIENT",
    "MAX_QUENCH_TIMEOUT",
    "MAX_REGISTRATIONS",
    "QUENCH_TOPIC",
    "QuenchConfig",
    "QuenchService",
    "QuenchTable",
    "Registration",
    "SUMMARY_SUB",
    "parse_registrations",
    "parse_report",
    "summary_answers",
]
