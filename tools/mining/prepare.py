"""`aa mine prepare`: write this machine's class archive of Spark (see
`aa.tools.mining.session`) once, by mining a small simulated log, so that the first real
`aa mine` already starts warm (otherwise the first `aa mine` writes it, and says so). It
does nothing when the archive is there.

Why a whole small job and not only a Spark start: the archive holds the classes the JVM
loaded, and a mining job loads several thousand more than a bare session (the Parquet
reader, the aggregations, the joins) — those are the ones a small log's run waits for.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Final

from .job import MineConfig, measure_inputs, resolve_inputs, run_mining
from .session import (
    SparkConfig,
    archive_dir,
    check_java,
    class_archive_file,
    open_session,
    stop_session,
    use_shared_spark_home,
)
from .simulate import DEFAULT_START, SimulateConfig, simulate

__all__ = ["PrepareResult", "prepare"]

#: The simulated log mined to fill the archive: two office hours of 12 people (~5,000
#: events) exercise every query of the job in a few seconds of work.
_SPAN: Final = timedelta(hours=2)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrepareResult:
    """What `prepare` did."""

    #: The archive (None: none could be written, e.g. another run is writing it).
    archive: Path | None
    #: True if this call wrote it (False: it was there already, or none was written).
    written: bool


def prepare(
    config: SparkConfig = SparkConfig(), *, sink: Callable[[str], None] | None = None
) -> PrepareResult:
    """Write the class archive for *config* (a local master) unless it exists.

    Raises `UsageError` without Java, `SparkStartError` if Spark cannot start."""
    java = check_java()
    folder = archive_dir(config)
    if folder is None:
        return PrepareResult(archive=None, written=False)
    use_shared_spark_home(config)
    final = class_archive_file(folder, java)
    if final.is_file():
        return PrepareResult(archive=final, written=False)
    with tempfile.TemporaryDirectory(prefix="aa-mine-prepare-") as tmp:
        office = Path(tmp, "office")
        start = DEFAULT_START + timedelta(hours=8)
        simulate(
            SimulateConfig(
                out=str(office), start=start, days=_SPAN / timedelta(days=1), step_seconds=120
            )
        )
        job = MineConfig(inputs=(str(office),), adapters=str(Path(tmp, "adapters")))
        size = measure_inputs(resolve_inputs(job.inputs))
        spark = open_session(config, input_bytes=size, sink=sink)
        try:
            run_mining(spark, job, side_by_side=True)
        finally:
            written = stop_session(spark)
    return PrepareResult(archive=written, written=written is not None)
