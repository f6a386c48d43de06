"""Shared fixtures. Every router binds 127.0.0.1:0; discovery never leaves loopback."""

from __future__ import annotations

import os

import pytest

# Before anything imports aa: discovery stays on loopback in every test (the rule).
os.environ["AA_DISCOVERY_INTERFACES"] = "lo"


from support import free_udp_port

# ... and on a beacon port of this test run's own: the `aa router` processes tests start find
# each other as they should, never a router someone runs on this machine (`make run`).
os.environ["AA_DISCOVERY_PORT"] = str(free_udp_port())


# The shared fixtures (a router, clients, a PostgreSQL server, a cache for `aa mine`):
# tests/support/.
pytest_plugins = ["support.fixtures", "support.postgres", "support.spark"]

# In CI the property tests explore the same examples on every run (a new failing example is
# a finding for a developer's run, not a reason for a submission to flake).
if os.environ.get("CI"):
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None)
    settings.load_profile("ci")


#: Files whose tests run one after another in one pytest-xdist worker, as one unit of work
#: (`make test`; every other file is a unit of its own): the Spark tests (each JVM wants both
#: cores and a gigabyte or more, and they share what one made: the class archive, the test
#: process's JVM), and the tests whose routers announce themselves by zeroconf on loopback
#: (every router announced there is found, another worker's too). The groups go first, in
#: this order, the longest first.
GROUPS: dict[str, str] = {
    "tests/test_mining_cluster.py": "spark",
    "tests/test_mining_spark.py": "spark",
    "tests/test_eventlog_spark.py": "spark",
    "tests/test_mining_rewrites.py": "spark",
    "tests/test_links_mesh.py": "zeroconf",
    "tests/test_mesh_discovery_net.py": "zeroconf",
}


#: The files that take longest (after the groups), longest first: sent right after the groups,
#: so that the run ends on short files. The scheduler hands a worker its next file when the
#: one it runs has two tests left, so a long file sent last is its whole length added to the
#: run while the other core idles. Ranked by the per-file totals of a `--junitxml` run; a file
#: not listed goes after these, in name order.
LONGEST: tuple[str, ...] = (
    "tests/test_readme.py",
    "tests/test_cli_storage.py",
    "tests/test_cli_errors.py",
    "tests/test_typing.py",
    "tests/test_faults_memory.py",
    "tests/test_store.py",
    "tests/test_patterns_index.py",
    "tests/test_links_netns.py",
    "tests/test_faults_partition.py",
    "tests/test_patterns_index_pairs.py",
    "tests/test_caches_memory.py",
    "tests/test_cli.py",
    "tests/test_http_schemathesis.py",
    "tests/test_faults_sync_big.py",
    "tests/test_security_gate_patterns.py",
    "tests/test_missed_away.py",
    "tests/test_http_app_browser.py",
    "tests/test_security_revocation.py",
    "tests/test_store_sync_kill.py",
    "tests/test_faults_wire_fuzz.py",
)


#: Files run after the parallel phase, alone in one process: those whose tests bound the CPU
#: time a piece of work takes in one thread (work on the other core slows this one's too:
#: they share the caches and the memory bus), and those whose routers, all in one process,
#: must converge on interest routes within a bound: beside the Spark cluster's JVMs on the
#: other worker they did not, once in two fresh-clone runs, while they passed in every run
#: alone or beside a busy core.
LAST: tuple[str, ...] = (
    "tests/test_faults_big_frames.py",
    "tests/test_patterns_hostile.py",
    "tests/test_patterns_sandbox.py",
    "tests/test_mesh_interest_ring.py",
    "tests/test_mesh_interest_line.py",
)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` by `GROUPS`: a file is one unit of work (its module fixtures are
    made once, in one worker), and the files of a group are one unit together, handed out in
    the order the workers collected them (below), with or without ``--no-loadscope-reorder``:
    xdist's own order (most tests first) would send the long files last."""
    if config.getoption("dist") != "loadfile":
        return None
    config.option.loadscopereorder = False
    from xdist.scheduler import LoadScopeScheduling

    class ByFileAndGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = _file_of(nodeid)
            return GROUPS.get(path, path)

    return ByFileAndGroup(config, log)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker: the grouped files first, in `GROUPS`' order, then the files
    of `LONGEST`, the files of `LAST` last (the scheduler hands out units in the order the
    workers collected them); and a test marked `spark` in a file outside the Spark group is a
    mistake, said at once."""
    for item in items:  # `make test` runs these after the parallel run, in one process
        if _file_of(item.nodeid) in LAST:
            item.add_marker(pytest.mark.alone)
    if not hasattr(config, "workerinput"):
        return
    for path in (*GROUPS, *LONGEST, *LAST):  # a renamed file would lose its place silently
        if not (config.rootpath / path).is_file():
            raise pytest.UsageError(f"tests/conftest.py names {path}, which is not there")
    for item in items:
        if item.get_closest_marker("spark") is not None:
            if GROUPS.get(_file_of(item.nodeid)) != "spark":
                raise pytest.UsageError(
                    f"{item.nodeid} is marked spark: add its file to GROUPS in tests/conftest.py"
                )
    first = [*GROUPS, *LONGEST]
    rank = {path: n for n, path in enumerate(first)}
    rank |= {path: len(first) + 1 + n for n, path in enumerate(LAST)}
    items.sort(key=lambda item: rank.get(_file_of(item.nodeid), len(first)))
