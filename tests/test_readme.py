"""The docs' code runs: every shell and Python block meant to run, of README.md and of every
page of the manual (`docs/*.md`), is run, in page order, against one real router started the
way `make run` starts it (the Makefile's own flags), and must do what the page says. Pages an
engineer drafts for the lead (`docs/notes-*.md`) are left out until they are folded into a
page of the manual.

Conventions for authors of the README and the manual (new sections and new pages are picked up
without touching this file):

* A fence at the start of a line, tagged ``sh``, ``shell``, ``bash`` or ``python``, is run as
  one test. A fence indented inside a list item is an excerpt (a pattern script), not run.
* ``<!-- not run: reason -->`` on the line before a fence: not run. Use it sparingly, and say
  why (the quick start's ``make run``/``make test``: this test starts that router itself).
* ``<!-- file: PATH -->`` before a fence of any tag (``python``, ``toml``, ...): the block is
  written to PATH (relative to the working folder all blocks of all pages share) before any
  block runs, instead of being run: an add-in, a settings file, a permissions file. Two
  pages may not write the same PATH.
* Ports: every number from 7440 to 7499 in a block is moved to a block of free ports with the
  same offsets (so a router's HTTP port stays its port + 1). ``$AA_ROUTER`` names `make run`'s
  router (the README's default 127.0.0.1:7447); discovery stays on loopback, on this test
  run's own beacon port (tests/conftest.py).
* Shell blocks: one command per line (a trailing backslash continues it), run by bash in the
  working folder with the virtual environment's ``bin`` first on PATH. A command that runs
  until stopped is started in the background: ``aa router`` (waited for until it says it
  listens; ``aa router --print-config`` prints and exits, in the foreground), ``aa
  container`` (until it says what it hosts), ``aa subscribe`` / ``aa on`` without
  ``--count`` (each must print a line before the block ends; the block's ``aa send`` lines
  are repeated until it did). Every other command must exit 0 (a pipeline: its last
  command) without a traceback. At the block's end the background commands get SIGINT and
  must end quietly. A ``curl`` line ending in ``# → 401`` (200, 201, 403) must print that
  status last (``-w ' %{http_code}\n'``).
* Python blocks run with the virtual environment's python in the working folder: exit 0,
  nothing on stderr.
* `EXPECT` below says, for a command or a piece of code, what its output must show (a
  foreground command is repeated until it does, within its time: ``aa mesh`` sees routers
  join as their summaries arrive). A block without an entry gets the checks above only.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import ctrl_c_reaches, free_port_block

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def doc_pages() -> list[Path]:
    """README.md, then the manual's pages in name order; drafts (notes-*.md) left out."""
    docs = sorted((ROOT / "docs").glob("*.md"))
    return [README, *(p for p in docs if not p.name.startswith("notes-"))]


PAGES = doc_pages()
BIN = Path(sys.executable).parent
AA = str(BIN / "aa")

#: The README's ports are moved to free ones with the same offsets from this number.
README_PORT_BASE = 7440
README_PORT_SPAN = 60  # 7440–7499
#: Seconds a block's command may take (a foreground one: until its expectation holds).
COMMAND_TIMEOUT = 60.0
#: Seconds for a background command to say it is ready, or to print its first line.
READY_TIMEOUT = 60.0


# -- the pages' blocks ------------------------------------------------------------------------


@dataclass
class Block:
    page: str  # the file, relative to the repository: README.md, docs/mesh.md
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None = None  # the reason given in <!-- not run: ... -->
    file: str | None = None  # <!-- file: PATH -->

    @property
    def id(self) -> str:
        first = next((code_line for code_line in self.code.splitlines() if code_line.strip()), "")
        slug = re.sub(r"[^A-Za-z0-9]+", "_", first)[:40]
        return f"{self.page}:L{self.line}-{self.lang}-{slug}"

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->\s*$")
FILE = re.compile(r"^<!--\s*file:\s*(\S+)\s*-->\s*$")
LANGS = {"sh": "sh", "shell": "sh", "bash": "sh", "python": "python"}


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    """The top-level fenced blocks of *text* in a language we run, with their markers."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        lang = LANGS.get(m.group(1))
        before = lines[start - 1] if start > 0 else ""
        skip, file = NOT_RUN.match(before), FILE.match(before)
        if lang is None and file:  # a file of any kind: a permissions file, a config file
            lang = m.group(1) or "text"
        if lang is not None:
            blocks.append(
                Block(
                    page=page,
                    line=start + 1,
                    lang=lang,
                    code="\n".join(lines[start + 1 : j]) + "\n",
                    skip=skip.group(1) if skip else None,
                    file=file.group(1) if file else None,
                )
            )
        i = j + 1
    return blocks


def page_name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


BLOCKS = [b for page in PAGES for b in readme_blocks(page.read_text(), page_name(page))]
RUN = [b for b in BLOCKS if b.file is None]
#: Fence tags of blocks shown, never run.
SHOWN = ("text", "console", "json", "toml", "yaml", "xml", "http", "javascript", "html")


def test_the_conventions_are_understood():
    """The parser finds what this module's docstring promises (guards against an edit that
    silently makes blocks invisible, e.g. an unknown fence tag on a command)."""
    readme = [b for b in RUN if b.page == "README.md"]
    assert any(b.skip for b in readme) and sum(1 for b in readme if not b.skip) >= 5
    assert any(b.file for b in BLOCKS)
    assert len({b.page for b in RUN if not b.skip}) >= 6  # the manual's pages run too
    assert all(b.skip.strip() for b in BLOCKS if b.skip)
    files = [b.file for b in BLOCKS if b.file]
    assert len(files) == len(set(files)), files  # one working folder for all pages
    for page in PAGES:  # tags we neither run nor know, at any indentation
        for m in re.finditer(r"^\s*```(\w+)", page.read_text(), re.M):
            assert m.group(1) in LANGS or m.group(1) in SHOWN, (page_name(page), m.group(1))


def test_the_pages_are_the_manuals():
    """Every page of the manual is parsed (a page added to docs/ is run without a word here),
    and drafts are not."""
    names = {page_name(p) for p in PAGES}
    assert {"README.md", "docs/index.md", "docs/phones-and-browsers.md"} <= names
    assert not any(n.startswith("docs/notes-") for n in names)


# -- ports and environment ----------------------------------------------------------------------


class Ports:
    def __init__(self) -> None:
        self.base = free_port_block(README_PORT_SPAN)

    def __call__(self, port: int) -> int:
        return self.base + port - README_PORT_BASE

    def rewrite(self, text: str) -> str:
        return re.sub(r"(?<![\d.])(74[4-9]\d)(?!\d)", lambda m: str(self(int(m.group(1)))), text)


@dataclass
class World:
    """What the blocks share: the working folder, the ports, `make run`'s router."""

    cwd: Path
    ports: Ports
    env: dict[str, str]
    router: str
    procs: list[subprocess.Popen] = field(default_factory=list)


def makefile_router_argv() -> list[str]:
    """The `aa router …` command of the Makefile's `run` target, as argv after `aa`."""
    text = (ROOT / "Makefile").read_text()
    recipe = text[text.index("\nrun:") :].split("\n\n", 1)[0]
    line = next(step for step in recipe.splitlines() if "bin/aa router" in step)
    port = re.search(r"^PORT\s*\?=\s*(\d+)$", text, re.M)
    argv = shlex.split(line.strip().replace("$(PORT)", port.group(1) if port else "$(PORT)"))
    return argv[argv.index("router") :]


class Output:
    """A process's stdout or stderr, read by a thread as it comes."""

    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        self.lines: list[str] = []
        self._new = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:  # type: ignore[no-untyped-def]
        for raw in iter(stream.readline, b""):
            with self._new:
                self.lines.append(raw.decode(errors="replace"))
                self._new.notify_all()

    def wait_for(self, predicate: Callable[[list[str]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._new:
            while not predicate(self.lines):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._new.wait(left)
        return True

    @property
    def text(self) -> str:
        with self._new:
            return "".join(self.lines)


class Background:
    def __init__(self, argv: list[str], world: World) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(
            argv,
            cwd=world.cwd,
            env=world.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=ctrl_c_reaches,  # stopped with Ctrl-C, even from a background job
        )
        world.procs.append(self.proc)
        self.out = Output(self.proc.stdout)
        self.err = Output(self.proc.stderr)

    def stop(self) -> tuple[int, str]:
        """SIGINT, as Ctrl-C; the exit status and stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            # Where it hangs: SIGABRT makes faulthandler (PYTHONFAULTHANDLER, `world`) write
            # every thread's stack on its stderr.
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.err._thread.join(5)
            pytest.fail(f"{self.argv} did not end on SIGINT; its stderr:\n{self.err.text[-6000:]}")
        self.out._thread.join(5)
        self.err._thread.join(5)
        return code, self.err.text


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    cwd = tmp_path_factory.mktemp("readme")
    ports = Ports()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "AA_ROUTER": f"127.0.0.1:{ports(7447)}",
        "XDG_CONFIG_HOME": str(cwd / ".config"),
        "XDG_DATA_HOME": str(cwd / ".local"),
        "HOME": str(cwd),
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",  # a command that hangs shows where (`Background.stop`)
    }
    env.pop("VIRTUAL_ENV", None)
    w = World(cwd=cwd, ports=ports, env=env, router=env["AA_ROUTER"])
    for block in BLOCKS:  # files first: the blocks that use them may come in any order
        if block.file:
            path = cwd / block.file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(ports.rewrite(block.code))
    argv = [AA, *(ports.rewrite(a) for a in makefile_router_argv()[0:])]
    assert "--bundled" in argv and "--data-dir" in argv  # what `make run` promises
    router = Background(argv, w)
    try:
        assert router.out.wait_for(
            lambda ls: any("listening on" in printed for printed in ls), READY_TIMEOUT
        ), router.err.text
        assert router.out.wait_for(
            lambda ls: any("hosting add-ins" in printed for printed in ls), READY_TIMEOUT
        ), router.err.text
        yield w
    finally:
        code, err = router.stop()
        for p in w.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert code == 0 and "Traceback" not in err, err


# -- what the pages promise, per command or piece of code -------------------------------------


def _lines(out: str) -> list[str]:
    return [printed for printed in out.splitlines() if printed.strip()]


WEATHER = re.compile(
    r"^\[weather\] City=\S+ TemperatureC=-?\d+(\.\d+)? Humidity=\d+ "
    r"Condition=(clear|cloudy|rain|snow)$"
)

#: (pattern on the command line or the code, check of its stdout, seconds it may take)
EXPECT: list[tuple[re.Pattern[str], Callable[[str], bool], float]] = [
    # "events at once": the office's weather station speaks every 2 s
    (
        re.compile(r"^aa subscribe --count 3 'type == \"weather\"'"),
        lambda out: (
            len(_lines(out)) == 3 and all(WEATHER.match(printed) for printed in _lines(out))
        ),
        15.0,
    ),
    (
        re.compile(r'^aa subscribe "Temperature > 100"'),
        lambda out: "[reading] Temperature=101 Sensor=lab-1" in _lines(out),
        READY_TIMEOUT,
    ),
    (
        re.compile(r"^aa send "),
        lambda out: bool(re.fullmatch(r"[0-9a-f]+-\d+\n", out)),
        COMMAND_TIMEOUT,
    ),
    (
        re.compile(r"^aa --version$"),
        lambda out: bool(
            re.fullmatch(r"aa \d+\.\d+\.\d+\S* \((compiled event path|pure Python)\)\n", out)
        ),
        10.0,
    ),
    (
        re.compile(r"^aa mesh --json \| head -n 3$"),
        lambda out: len(out.splitlines()) == 3 and out.startswith("{"),
        30.0,
    ),
    # three routers beside make run's: all four in one mesh, eventually (summaries every 10 s)
    (
        re.compile(r"^aa mesh --router "),
        lambda out: bool(re.match(r"([4-9]|\d\d+) router\(s\)", out)),
        COMMAND_TIMEOUT,
    ),
    (
        re.compile(r"^aa subscribe --count 2 'type == \"greeting\"'"),
        lambda out: (
            [re.sub(r"N=\d+", "N=n", printed) for printed in _lines(out)]
            == ["[greeting] Greeting=hello N=n"] * 2
        ),
        30.0,
    ),
    # Patterns: a missing name makes only its own comparison unknown, `or` is rescued
    (
        re.compile(r"""^aa subscribe 'Temperature > 100 or Flag == "x"'"""),
        lambda out: "[flag] Flag=x" in _lines(out),
        READY_TIMEOUT,
    ),
    # The mesh: an event routed by interest reaches the subscriber on the other router
    (
        re.compile(r"""^aa subscribe --router 127\.0\.0\.1:\d+ 'type == "hot"'"""),
        lambda out: "[hot] Temperature=120" in _lines(out),
        READY_TIMEOUT,
    ),
    # Command line: the persisted note comes back as history
    (
        re.compile(r"^aa subscribe --history --since 1h --count 1 'type == \"note\"'"),
        lambda out: _lines(out) == ["[note] (historical) Text=hello"],
        COMMAND_TIMEOUT,
    ),
    # Operations: a unit printed, nothing written
    (
        re.compile(r"^aa service install \w+ --user --dry-run"),
        lambda out: "[Service]" in out and "ExecStart=" in out and "WantedBy=" in out,
        COMMAND_TIMEOUT,
    ),
    # The web monitor and its module are served by the router itself
    (
        re.compile(r"%\{http_code\} %\{content_type\}\\n' http://127\.0\.0\.1:\d+/$"),
        lambda out: out.startswith("200 text/html"),
        COMMAND_TIMEOUT,
    ),
    (
        re.compile(r"%\{http_code\} %\{content_type\}\\n' http://127\.0\.0\.1:\d+/static/aa\.js$"),
        lambda out: bool(re.match(r"200 (text|application)/javascript", out)),
        COMMAND_TIMEOUT,
    ),
    # Python: the subscribing example prints the event's values and time
    (
        re.compile(r"for event in sub:"),
        lambda out: bool(
            re.fullmatch(
                r"\{'Temperature': 102, 'Sensor': 'lab-2'\} \d{4}-\d\d-\d\d[ T][\d:.]+\+00:00\n",
                out,
            )
        ),
        COMMAND_TIMEOUT,
    ),
    # Python: the embedded router prints its endpoint, then the event it published to itself
    (
        re.compile(r"async with Router\(RouterConfig\(port=0\)\)"),
        lambda out: bool(re.fullmatch(r"127\.0\.0\.1:\d+\n\{'Temperature': 101\}\n", out)),
        COMMAND_TIMEOUT,
    ),
]

# A curl line ending in `# → 401` prints that status last (`-w ' %{http_code}\n'`); repeated
# until it does: a revocation reaches the router within a second or so.
EXPECT += [
    (
        re.compile(rf"^curl .*#\s*→ {status}$"),
        lambda out, status=status: out.split()[-1:] == [status],
        COMMAND_TIMEOUT,
    )
    for status in ("200", "201", "401", "403")
]


def expectation(text: str) -> tuple[Callable[[str], bool], float] | None:
    for pattern, check, seconds in EXPECT:
        if pattern.search(text):
            return check, seconds
    return None


# -- running a block ----------------------------------------------------------------------------


def commands(code: str) -> list[str]:
    out: list[str] = []
    pending = ""
    for raw in code.splitlines():
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        if line.strip() and not line.strip().startswith("#"):
            out.append(line.strip())
    return out


def runs_until_stopped(argv: list[str]) -> str | None:
    """ "router", "container" or "listener" for a command that runs until stopped, else None."""
    if len(argv) < 2 or Path(argv[0]).name != "aa":
        return None
    if argv[1] in ("router", "container") and "--print-config" not in argv:
        return argv[1]
    if (
        argv[1] in ("subscribe", "on")
        and "--count" not in argv
        and not any(a.startswith("--count=") for a in argv)
    ):
        return "listener"
    return None


def run_foreground(line: str, world: World) -> str:
    want = expectation(line)
    check, seconds = want if want else ((lambda out: True), COMMAND_TIMEOUT)
    deadline = time.monotonic() + seconds
    while True:
        try:
            done = subprocess.run(
                ["bash", "-c", line],
                cwd=world.cwd,
                env=world.env,
                capture_output=True,
                text=True,
                timeout=max(1.0, deadline - time.monotonic()),
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{line!r} did not finish within {seconds:g} s")
        assert done.returncode == 0, f"{line!r} exited with {done.returncode}: {done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
        if check(done.stdout):
            return done.stdout
        if time.monotonic() >= deadline:
            pytest.fail(f"{line!r} printed {done.stdout!r}, not what the page says")


def run_sh(block: Block, world: World) -> None:
    lines = commands(world.ports.rewrite(block.code))
    background: list[tuple[str, str, Background]] = []
    sends: list[str] = []
    try:
        for line in lines:
            argv = shlex.split(line, comments=True)
            kind = runs_until_stopped(argv)
            if kind is None:
                run_foreground(line, world)
                if argv[:2] == ["aa", "send"]:
                    sends.append(line)
                continue
            bg = Background([AA if argv[0] == "aa" else argv[0], *argv[1:]], world)
            background.append((line, kind, bg))
            ready = {"router": "listening on", "container": "hosting"}.get(kind)
            if ready is not None:

                def said_ready(ls: list[str], ready: str = ready) -> bool:
                    return any(ready in printed for printed in ls)

                assert bg.out.wait_for(said_ready, READY_TIMEOUT), (
                    f"{line!r} never said it was ready: {bg.err.text}"
                )
        for line, kind, bg in background:
            if kind != "listener":
                continue
            want = expectation(line)
            check = want[0] if want else (lambda out: bool(out.strip()))
            deadline = time.monotonic() + READY_TIMEOUT

            def printed_enough(ls: list[str], check: Callable[[str], bool] = check) -> bool:
                return check("".join(ls))

            while not bg.out.wait_for(printed_enough, 0.5):
                assert bg.proc.poll() is None, f"{line!r} ended: {bg.err.text}"
                assert time.monotonic() < deadline, (
                    f"{line!r} printed {bg.out.text!r}, not what the page says"
                )
                for send in sends:  # it may have subscribed after they were sent
                    run_foreground(send, world)
    finally:
        for line, _kind, bg in reversed(background):
            code, err = bg.stop()
            assert code in (0, 130), f"{line!r} ended with {code} on SIGINT: {err}"
            assert "Traceback" not in err, err


def run_python(block: Block, world: World) -> None:
    path = world.cwd / f"{Path(block.page).stem.lower().replace('-', '_')}_{block.line}.py"
    path.write_text(world.ports.rewrite(block.code))
    want = expectation(block.code)
    seconds = want[1] if want else COMMAND_TIMEOUT
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=world.cwd,
        env=world.env,
        capture_output=True,
        text=True,
        timeout=seconds,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    if want:
        assert want[0](done.stdout), f"{block.where} printed {done.stdout!r}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_readme_block(block: Block, world: World) -> None:
    if block.skip:
        pytest.skip(f"{block.where}: not run: {block.skip}")
    if block.lang == "sh":
        run_sh(block, world)
    else:
        run_python(block, world)


def test_the_three_line_publish_arrives(world: World) -> None:
    """The README's three lines (no close()) deliver their event: watched from outside."""
    block = next(
        b
        for b in RUN
        if b.page == "README.md"
        and 'c.publish({"Temperature": 101}, type="reading")' in b.code
        and "with" not in b.code
    )
    from aa.client import Client

    with Client(world.router) as watcher:
        sub = watcher.subscribe('type == "reading" and Temperature == 101')
        run_python(block, world)
        event = sub.get(timeout=10)
    assert event.values == {"Temperature": 101}
