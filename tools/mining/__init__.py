"""aa.tools.mining — the PySpark job that mines routers' event logs for the adapters'
knowledge (schema correspondences, radio locations, presence), its artefacts, the office
simulation that makes logs to mine, and the accuracy report against its ground truth.

PySpark is imported only when a job runs (``pip install 'aa-mesh[mining]'``).
"""

from .accuracy import accuracy_report, format_report, write_report
from .artefacts import (
    TASKS,
    Artefact,
    ArtefactError,
    list_versions,
    read_artefact,
    read_pointer,
    write_artefact,
)
from .job import (
    MineConfig,
    MineResult,
    ScannedInputs,
    measure_inputs,
    read_events,
    resolve_inputs,
    run_mining,
    scan_inputs,
)
from .location import LocationConfig
from .prepare import PrepareResult, prepare
from .presence import PresenceConfig
from .progress import Progress, plan
from .schema import SchemaConfig
from .session import (
    SMALL_LOG_BYTES,
    NoExecutorsError,
    SparkConfig,
    SparkStartError,
    check_java,
    check_master,
    class_archive_options,
    open_session,
    session_settings,
    spark_error_message,
    stop_session,
)
from .simulate import WORLD_FILE, SimulateConfig, SimulateResult, load_world, simulate
from .uris import UnreadableInput

__all__ = [
    "SMALL_LOG_BYTES",
    "NoExecutorsError",
    "ScannedInputs",
    "Artefact",
    "ArtefactError",
    "LocationConfig",
    "MineConfig",
    "MineResult",
    "PrepareResult",
    "PresenceConfig",
    "Progress",
    "SchemaConfig",
    "SimulateConfig",
    "SimulateResult",
    "SparkConfig",
    "SparkStartError",
    "TASKS",
    "UnreadableInput",
    "WORLD_FILE",
    "accuracy_report",
    "check_java",
    "check_master",
    "class_archive_options",
    "format_report",
    "list_versions",
    "load_world",
    "measure_inputs",
    "open_session",
    "plan",
    "prepare",
    "read_artefact",
    "read_events",
    "read_pointer",
    "resolve_inputs",
    "run_mining",
    "scan_inputs",
    "session_settings",
    "simulate",
    "spark_error_message",
    "stop_session",
    "write_artefact",
    "write_report",
]
