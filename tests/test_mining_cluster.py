"""The same answers everywhere: the mining job's artefacts do not depend on how Spark
partitions the work (one core or two, 200 shuffle partitions) nor on where it runs (a real
standalone cluster, a Master and a Worker on loopback)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.spark import artefact_texts, first_difference, need_spark

from aa.tools.mining import MineConfig, SimulateConfig, SparkConfig, open_session, run_mining
from aa.tools.mining import simulate as simulate_office

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

START = datetime(2030, 1, 7, 7, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def office(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short working morning logged by two routers with overlap (duplicates to drop)."""
    out = tmp_path_factory.mktemp("office")
    simulate_office(
        SimulateConfig(
            out=str(out), start=START, days=6 / 24, step_seconds=120, seed=3, overlap=0.5
        )
    )
    return out


def _mine_locally(office: Path, adapters: Path, master: str, partitions: int) -> dict[str, bytes]:
    spark = open_session(
        SparkConfig(
            master=master, shuffle_partitions=partitions, driver_memory="1g", class_archive_dir=""
        )
    )
    try:
        run_mining(spark, MineConfig(inputs=(str(office),), adapters=str(adapters)))
    finally:
        spark.stop()
    return artefact_texts(adapters)


@pytest.fixture(scope="module")
def one_core(office: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    need_spark()
    return _mine_locally(office, tmp_path_factory.mktemp("one"), "local[1]", 1)


def _same(a: dict[str, bytes], b: dict[str, bytes]) -> None:
    assert a.keys() == b.keys() == {"schema", "location", "presence"}
    for task in a:
        assert a[task] == b[task], f"{task} differs {first_difference(a[task], b[task])}"


def test_partitioning_does_not_change_the_artefacts_one_core_one_partition_vs_two_cores_200(
    office: Path, one_core: dict[str, bytes], tmp_path: Path
) -> None:
    _same(one_core, _mine_locally(office, tmp_path, "local[2]", 200))
