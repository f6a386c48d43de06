"""aa.tools.mining — the PySpark job that mines routers' event logs for the adapters'
knowledge (schema correspondences, radio locations, presence), its artefacts, the office
simulation that makes logs to mine, and the accuracy report against its ground truth.

PySpark is imported only when a job runs (``pip install 'aa-mesh[mining]'``).
"""

from .artefacts import TASKS, Artefact, ArtefactError, list_versions, read_artefact, read_pointer, write_artefact
from .job import MineConfig, MineResult, SparkConfig, open_session, read_events, resolve_inputs, run_mining
from .location import LocationConfig
from .presence import PresenceConfig
from .progress import Progress
from .schema import SchemaConfig
from .accuracy import accuracy_report, format_report, write_report
from .simulate import WORLD_FILE, SimulateConfig, SimulateResult, load_world, simulate

__all__ = [
    "Artefact",
    "ArtefactError",
    "LocationConfig",
    "MineConfig",
    "MineResult",
    "PresenceConfig",
    "Progress",
    "SchemaConfig",
    "SimulateConfig",
    "SimulateResult",
    "SparkConfig",
    "TASKS",
    "WORLD_FILE",
    "accuracy_report",
    "format_report",
    "list_versions",
    "load_world",
    "open_session",
    "read_artefact",
    "read_events",
    "read_pointer",
    "resolve_inputs",
    "run_mining",
    "simulate",
    "write_artefact",
    "write_report",
]
