"""`aa mine`: the PySpark job that mines routers' event logs for the adapters' knowledge;
`aa mine simulate` writes event logs of a simulated office; `aa mine report` scores the
artefacts against that office's ground truth."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aa.mesh import UsageError

__all__ = ["add_parser"]

EPILOG = """\
examples:
  aa mine simulate --out /tmp/office --days 5 --seed 1
  aa mine --adapters ./adapters --report /tmp/office/report.json /tmp/office
  aa mine --master spark://cluster:7077 --driver-host 10.0.0.9 --executor-memory 4g \
      --total-cores 8 file:///shared/aa/r1 file:///shared/aa/r2
  aa mine --master spark://cluster:7077 --tasks schema hdfs:///aa/r1/eventlog
  aa mine report --adapters ./adapters --world /tmp/office
  aa mine prepare

LOGDIR is a router's data folder (its eventlog/ is read), an eventlog/ folder, a folder of
routers' data folders, or any URI Spark reads. Events logged by several routers are counted
once (by id). Each task writes <adapters>/<task>/v<N>.json and points <task>/current at it;
the adapter add-ins load it and reload when it changes.

The first run with a PySpark version writes Spark's class archive (~180 MB in
~/.cache/aa/VERSION, shared by every virtual environment with that PySpark) and says so;
later runs start in about half the time. 'aa mine prepare' writes it ahead.

other actions: 'aa mine simulate --help', 'aa mine report --help', 'aa mine prepare --help'
"""


class _MineParser(argparse.ArgumentParser):
    """``aa mine LOGDIR…`` runs the job; ``aa mine simulate|report …`` are actions with
    their own parsers (a positional list and sub-commands do not mix in argparse)."""

    actions: dict[str, argparse.ArgumentParser]

    def parse_known_args(  # type: ignore[override]  # one signature for argparse's overloads
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> Any:
        args = list(sys.argv[1:] if args is None else args)
        if args and args[0] in self.actions:
            ns, rest = self.actions[args[0]].parse_known_args(args[1:], namespace)
            return ns, rest
        return super().parse_known_args(args, namespace)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "mine",
        help="mine routers' event logs (PySpark) for the adapters' knowledge",
        description="Mine the event logs of one or more routers with PySpark: event schemas and "
        "attributes that correspond across types, where radios are, who was together. Writes a "
        "versioned artefact per task for the schema, location and presence adapters.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.__class__ = _MineParser
    assert isinstance(p, _MineParser)
    p.add_argument("logdirs", nargs="+", metavar="LOGDIR", help="event log folders or URIs")
    p.add_argument(
        "--master", default="local[*]", metavar="URL", help="Spark master URL (default: local[*])"
    )
    p.add_argument(
        "--adapters",
        default="adapters",
        metavar="DIR",
        help="folder for the artefacts (default: ./adapters)",
    )
    p.add_argument(
        "--tasks",
        default="schema,location,presence",
        metavar="LIST",
        help="comma-separated tasks to run (default: schema,location,presence)",
    )
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also score the artefacts against a simulated office's ground truth: JSON to FILE, "
        "text to FILE with .txt (the world is found beside the logs, or give --world)",
    )
    p.add_argument(
        "--world", metavar="DIR", help="folder written by 'aa mine simulate' (for --report)"
    )
    p.add_argument(
        "--driver-memory",
        metavar="SIZE",
        help="Spark driver heap, e.g. 8g (default: a third of the memory, 2g to 16g)",
    )
    p.add_argument(
        "--executor-memory",
        metavar="SIZE",
        help="heap of each executor on a cluster, e.g. 4g (default: Spark's 1g)",
    )
    p.add_argument(
        "--total-cores",
        type=int,
        metavar="N",
        help="cores to take of a cluster in all (default: all it offers)",
    )
    p.add_argument(
        "--driver-host",
        metavar="HOST",
        help="this machine's name or address as the cluster's workers reach it "
        "(default: Spark's guess; loopback for local masters)",
    )
    p.add_argument(
        "--executor-wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="stop if a cluster gives no executor in this time (default: 60)",
    )
    p.add_argument(
        "--shuffle-partitions",
        type=int,
        metavar="N",
        help="partitions after a shuffle (default: from the input's size, 8 MiB of Parquet "
        "each, and the cores: this machine's, or a cluster's executors')",
    )
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="further Spark setting, repeatable",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="Spark's own log (WARN and up) and full tracebacks on errors",
    )
    p.set_defaults(func=_run)

    s = argparse.ArgumentParser(
        prog="aa mine simulate",
        description="Write event logs of the simulated office (aa.addins.office), as routers would "
        "have logged them, with world.json describing the world for 'aa mine report'.",
    )
    s.add_argument(
        "--out", required=True, metavar="DIR", help="folder to write (a folder per router inside)"
    )
    s.add_argument("--days", type=float, default=1.0, help="days to simulate (default: 1)")
    s.add_argument(
        "--start", metavar="ISO", help="first instant, UTC (default: 2030-01-07, a Monday)"
    )
    s.add_argument("--seed", type=int, default=0, help="world seed (default: 0)")
    s.add_argument(
        "--people",
        type=int,
        default=12,
        help="people in the office, each with a laptop and a phone (default: 12)",
    )
    s.add_argument("--buildings", type=int, default=2, help="buildings (default: 2)")
    s.add_argument("--floors", type=int, default=3, help="floors per building (default: 3)")
    s.add_argument(
        "--routers", default="r1,r2", metavar="LIST", help="router names (default: r1,r2)"
    )
    s.add_argument(
        "--overlap",
        type=float,
        default=0.3,
        help="chance another router logs an event too: duplicates to de-duplicate (default: 0.3)",
    )
    s.set_defaults(func=_simulate, command="mine simulate")

    r = argparse.ArgumentParser(
        prog="aa mine report",
        description="Score the artefacts in an adapters folder against a simulated office's ground "
        "truth: precision and recall per task.",
    )
    r.add_argument(
        "--adapters", default="adapters", metavar="DIR", help="the artefacts (default: ./adapters)"
    )
    r.add_argument(
        "--world", required=True, metavar="DIR", help="folder written by 'aa mine simulate'"
    )
    r.add_argument(
        "--out", metavar="FILE", help="also write the report as JSON (and text beside it)"
    )
    r.set_defaults(func=_report, command="mine report")
    w = argparse.ArgumentParser(
        prog="aa mine prepare",
        description="Write this machine's class archive of Spark (~180 MB in ~/.cache/aa/VERSION, "
        "one per PySpark version) by mining a small simulated log, so that the first real "
        "'aa mine' starts warm. Does nothing if it exists. Without it, the first 'aa mine' "
        "writes it.",
    )
    w.add_argument("-v", "--verbose", action="store_true", help="Spark's own log (WARN and up)")
    w.set_defaults(func=_prepare, command="mine prepare")
    p.actions = {"simulate": s, "report": r, "prepare": w}


def _spark_conf(items: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--conf {item!r} is not KEY=VALUE")
        out.append((key, value))
    return tuple(out)


def _find_world(inputs: list[str]) -> str | None:
    from aa.tools.mining import WORLD_FILE

    for p in inputs:
        for folder in (Path(p), Path(p).parent, Path(p).parent.parent):
            if (folder / WORLD_FILE).is_file():
                return str(folder)
    return None


#: The exit status of a run stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130


def _run(args: argparse.Namespace) -> int:
    args.verbose = args.verbose or getattr(args, "traceback", False)  # `aa mine -v` or `aa -v mine`
    try:
        return _mine(args)
    except UsageError:
        raise  # one line, from `aa.tools.cli.main` (and Ctrl-C is quiet there)
    except Exception as exc:  # Spark failed (the JVM, a job): one line unless -v
        if args.verbose:
            raise
        print(f"aa mine: {_one_line(exc)} (-v for details)", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    from aa.mesh import AaError
    from aa.tools.mining import spark_error_message

    if isinstance(exc, AaError):
        return str(exc)
    return f"Spark failed: {spark_error_message(exc)}"


def _stop_now(signum: int, frame: Any) -> None:
    """Ctrl-C during a run: it ends at once and quietly. The JVM is killed (PySpark starts
    it deaf to Ctrl-C, and it would go on running the job; a cluster drops an application
    whose driver is gone), and the process exits with one line. It does not unwind: the
    main thread is inside a py4j call, which on a lost JVM retries and logs tracebacks for
    tens of seconds. Nothing is half written: artefacts are written whole, after every
    task."""
    import logging

    logging.disable(logging.CRITICAL)
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is not None:
        proc.kill()
    try:
        sys.stdout.flush()
        sys.stderr.write("\r\x1b[K" if sys.stderr.isatty() else "")
        sys.stderr.write("aa mine: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)


def _arm_ctrl_c() -> None:
    """`_stop_now` on Ctrl-C (again after a SparkContext starts: it installs its own
    handler, which calls the JVM from inside the call the main thread waits in)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _stop_now)


@contextmanager
def _stop_on_ctrl_c() -> Iterator[None]:
    """`_stop_now` on Ctrl-C while the run lasts."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: nothing to catch here
        return
    before = signal.getsignal(signal.SIGINT)
    _arm_ctrl_c()
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)


def _mine(args: argparse.Namespace) -> int:
    with _stop_on_ctrl_c():
        return _mine_now(args)


def _mine_now(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from aa.tools.mining import (
        SMALL_LOG_BYTES,
        MineConfig,
        Progress,
        SparkConfig,
        check_java,
        check_master,
        open_session,
        plan,
        resolve_inputs,
        run_mining,
        scan_inputs,
        stop_session,
    )

    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    config = MineConfig(inputs=tuple(args.logdirs), adapters=args.adapters, tasks=tasks)
    spark_config = SparkConfig(
        master=args.master,
        driver_memory=args.driver_memory,
        verbose=args.verbose,
        shuffle_partitions=args.shuffle_partitions,
        executor_memory=args.executor_memory,
        total_cores=args.total_cores,
        driver_host=args.driver_host,
        executor_wait=args.executor_wait,
        extra=_spark_conf(args.conf),
    )
    world = args.world or (_find_world(list(args.logdirs)) if args.report else None)
    if args.report and world is None:
        raise UsageError("--report needs the simulated world: give --world DIR")
    # Bad input is found before the JVM starts: a missing folder, a folder without a log;
    # a file that is not an event log is left out, with a line saying which and why.
    scanned = scan_inputs(resolve_inputs(config.inputs))
    for path, why in scanned.skipped:
        print(f"aa mine: skipping {path}: it {why}", file=sys.stderr)
    if scanned.skipped:
        config = replace(config, exclude=tuple(p for p, _ in scanned.skipped))
    size = scanned.bytes
    check_master(spark_config.master)
    check_java()
    progress = None if args.quiet else Progress(plan(tasks))
    t = time.perf_counter()
    with progress or nullcontext():
        spark = open_session(
            spark_config, input_bytes=size, sink=progress.message if progress else None
        )
        _arm_ctrl_c()
        started = time.perf_counter() - t
        try:
            if progress is not None:
                progress.tracker = spark.sparkContext.statusTracker()
            # A small log's tasks run side by side (see `run_mining`).
            small = size is not None and size < SMALL_LOG_BYTES
            result = run_mining(spark, config, progress=progress, side_by_side=small)
        finally:
            stop_session(spark)  # a first run puts the class archive in place for the next
    ev, total = result.events, time.perf_counter() - t
    print(
        f"events: {ev['read']} read, {ev['unique']} unique, in {total:.1f} s "
        f"({ev['read'] / max(total, 1e-9):,.0f} events/s; Spark started in {started:.1f} s)"
    )
    for task, art in result.artefacts.items():
        print(f"{task}: {art.path} (version {art.version}, {result.seconds[task]:.1f} s)")
    if args.report:
        assert world is not None  # refused above without one
        _write_report(args.adapters, world, args.report)
    return 0


def _write_report(adapters: str, world: str, out: str | None) -> None:
    from aa.tools.mining import accuracy_report, format_report, write_report

    report = accuracy_report(adapters, world)
    print(format_report(report))
    if out:
        write_report(report, out)


def _simulate(args: argparse.Namespace) -> int:
    from aa.tools.mining import SimulateConfig, simulate

    start = datetime.fromisoformat(args.start) if args.start else None
    if start is not None and start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    routers = tuple(r.strip() for r in args.routers.split(",") if r.strip())
    cfg = SimulateConfig(
        out=args.out,
        days=args.days,
        seed=args.seed,
        people=args.people,
        buildings=args.buildings,
        floors=args.floors,
        routers=routers,
        overlap=args.overlap,
    )
    if start:
        cfg = replace(cfg, start=start)
    result = simulate(cfg)
    rows = ", ".join(f"{r}: {n}" for r, n in result.rows.items())
    print(
        f"{result.events} distinct events written to {args.out}, logged "
        f"{sum(result.rows.values())} times in all "
        f"(the routers' logs overlap: {rows})"
    )
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from aa.tools.mining import SparkConfig, prepare

    t = time.perf_counter()
    # The install runs this: say what the minute of silence is before it starts.
    print(
        "aa mine prepare: Spark's class archive, so that 'aa mine' starts fast "
        "(about a minute, once per Java and PySpark version)...",
        flush=True,
    )
    try:
        result = prepare(SparkConfig(verbose=args.verbose))
    except UsageError:
        raise
    except Exception as exc:  # Spark failed: one line unless -v
        if args.verbose:
            raise
        print(f"aa mine prepare: {_one_line(exc)} (-v for details)", file=sys.stderr)
        return 1
    if result.archive is None:
        print(
            "aa mine prepare: no class archive written (another run may be writing it); "
            "'aa mine' works without, its first start is slower"
        )
    elif result.written:
        print(f"class archive written in {time.perf_counter() - t:.0f} s: {result.archive}")
    else:
        print(f"class archive already there: {result.archive}")
    return 0


def _report(args: argparse.Namespace) -> int:
    _write_report(args.adapters, args.world, args.out)
    return 0
