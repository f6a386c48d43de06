"""Spark for the mining tests: whether it can run here, the artefacts of a run compared
byte for byte apart from their timestamps, and a real standalone cluster (a Master and a
Worker started from the installed PySpark on free loopback ports)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .ports import free_tcp_port
from .waits import settle

__all__ = [
    "TASKS",
    "need_spark",
    "aa_command",
    "artefact_texts",
    "log_bytes",
    "mining_cache",
    "prepared_cache",
    "Prepared",
    "StandaloneCluster",
]

TASKS = ("schema", "location", "presence")
#: The only line of an artefact that differs between two runs of the same log.
_CREATED = re.compile(rb'^ "created": "[^"]*",\n', re.M)


def need_spark() -> None:
    """Skip the calling test unless PySpark and Java are here."""
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'aa-mesh[mining]'")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: apt-get install default-jre-headless")


@dataclass(frozen=True, slots=True)
class Prepared:
    """An ``XDG_CACHE_HOME`` in which ``aa mine prepare`` ran, and what it said."""

    cache: Path
    run: subprocess.CompletedProcess[str]


def aa_command() -> str:
    """The `aa` of the environment running the tests."""
    return str(Path(sys.executable).with_name("aa"))


@pytest.fixture(scope="session")
def prepared_cache(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """A cache of the session's own, filled by one ``aa mine prepare``: the session's one
    class archive (written as the JVM ends, a long wait), which every later `aa mine` of the
    session maps. Its output is checked by the test of ``aa mine prepare``."""
    need_spark()
    cache = tmp_path_factory.mktemp("mining-cache")
    run = subprocess.run(
        [aa_command(), "mine", "prepare"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
    )
    return Prepared(cache, run)


@pytest.fixture(scope="session")
def mining_cache(prepared_cache: Prepared) -> Path:
    """An ``XDG_CACHE_HOME`` for the `aa mine` runs of tests whose subject is not the class
    archive: `prepared_cache`'s, so each JVM maps Spark's classes and none writes an archive
    at its exit. Nothing is written to the user's own cache."""
    run = prepared_cache.run
    assert run.returncode == 0, f"aa mine prepare failed: {run.stdout}{run.stderr}"
    return prepared_cache.cache


def log_bytes(*folders: Path) -> int:
    """The bytes of event log `aa mine` finds in *folders*: what it sizes its session by (a
    small log's driver compiles less and plans without whole-stage code generation), so an
    in-process session given it runs as `aa mine` would on that log."""
    from aa.tools.mining import resolve_inputs, scan_inputs

    return scan_inputs(resolve_inputs(tuple(str(f) for f in folders))).bytes


def artefact_texts(adapters: Path) -> dict[str, bytes]:
    """Each task's current artefact as bytes, its ``created`` line taken out."""
    out = {}
    for task in TASKS:
        folder = adapters / task
        if (folder / "current").is_file():
            name = (folder / "current").read_text(encoding="utf-8").strip()
            out[task] = _CREATED.sub(b"", (folder / name).read_bytes())
    return out


def first_difference(a: bytes, b: bytes, around: int = 300) -> str:
    """Where two artefacts part, for an assertion message."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo = max(0, i - around)
    return f"at byte {i}:\n{a[lo : i + around].decode()!s}\n---\n{b[lo : i + around].decode()!s}"


class StandaloneCluster:
    """A Spark standalone Master and one Worker on 127.0.0.1, from the installed PySpark.

    `start` returns when the worker is registered with the master (its JSON says so);
    `close` kills both processes (and their children). Logs go to *logs*.
    """

    def __init__(self, logs: Path, *, cores: int = 1, memory: str = "1g") -> None:
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.logs = logs
        self.cores, self.memory = cores, memory
        self.port = free_tcp_port()
        self.ui_port = free_tcp_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def _spawn(self, name: str, *args: str) -> None:
        env = {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(self.logs / f"{name}-local"),
            "SPARK_WORKER_DIR": str(self.logs / f"{name}-work"),
            # Small heaps: the machine is shared, and the daemons only schedule.
            "SPARK_DAEMON_MEMORY": "256m",
        }
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 (closed by the process's end)
        self.procs.append(
            subprocess.Popen(
                [str(self.home / "bin" / "spark-class"), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: killed whole at close
            )
        )
        log.close()

    def state(self) -> dict[str, Any] | None:
        """The master's JSON (None while it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                return json.loads(r.read())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def wait(self, ok: Any, timeout: float, what: str) -> dict[str, Any]:
        """Poll the master's JSON until *ok* holds of it (a deadline, no fixed sleep)."""

        def read() -> dict[str, Any] | None:
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(f"a Spark daemon exited ({p.args}): see {self.logs}")
            return self.state()

        state = settle(read, lambda s: s is not None and bool(ok(s)), timeout, every=0.2)
        if state is None or not ok(state):
            raise AssertionError(f"{what} in {timeout} s; the master said {state}; see {self.logs}")
        return state

    def start(self, timeout: float = 180.0) -> StandaloneCluster:
        self.logs.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        self.wait(lambda s: s.get("status") == "ALIVE", timeout, "no live master")
        worker_ui = free_tcp_port()
        self._spawn(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--webui-port",
            str(worker_ui),
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            self.url,
        )
        self.wait(
            lambda s: any(w.get("state") == "ALIVE" for w in s.get("workers", [])),
            timeout,
            "no worker registered",
        )
        return self

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        self.procs.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
