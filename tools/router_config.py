"""`aa router --config FILE`: the router's TOML configuration file.

Its keys are derived from the `aa router` flags, so a new flag has a key the day it is added:
a flag's argument group names its table (``--http-port`` in the "http" group is
``[http] port``; flags outside a group are top-level keys), the table's name is dropped from
the front of the key, ``--no-X`` is ``X = false`` (``--no-http`` is ``[http] enabled =
false``), and `RENAMES` gives the few keys that read better otherwise (``--peer`` is
``[mesh] peers``, a list). Flags given on the command line override the file (a list flag
replaces the file's list); the file overrides the built-in defaults.

A mistake in the file is one line naming the file, the line and the reason (an unknown key
with the nearest valid one), found before the router binds anything. Path values may name
environment variables as ``${NAME}`` (systemd's ``${STATE_DIRECTORY}``).
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Key",
    "keys_of",
    "record_given",
    "load",
    "resolve",
    "to_toml",
    "blame",
    "changes",
    "LIVE",
    "RENAMES",
    "GIVEN",
]

#: Namespace attribute holding the dests the command line set (`record_given`).
GIVEN = "aa_given"
#: Namespace attribute: dest → (file, line, key) of each value the file set.
SOURCES = "aa_sources"

#: Argument group title → table. Other titled groups get their title as table name.
GROUP_TABLES = {
    "mesh": "mesh",
    "mesh timing": "mesh",
    "patterns": "patterns",
    "http": "http",
    "storage": "store",
    "security": "security",
    "add-ins": "addins",
    "log": "log",
    "limits": "limits",
}
#: argparse's own groups: their flags are top-level keys.
_UNTITLED = frozenset({"options", "optional arguments", "positional arguments"})
#: dest → key, where the derived name would read worse.
RENAMES = {
    "peer": "mesh.peers",
    "pattern_workers": "patterns.workers",
    "http_name": "http.names",
    "http_cert": "http.cert",
    "http_key": "http.key",
    "container": "addins.folders",
    "mesh_cache_events": "caches.mesh-cache-events",
    "cache_sweep_interval": "caches.sweep-interval",
}
#: Flags that have no key of their own: the key that says the same thing.
SHORTHANDS = {"verbose": "log.level"}
#: Flags about this run of the command, not about the router.
_NOT_KEYS = frozenset({"help", "config", "print_config"})

#: Keys a SIGHUP applies to the running router; a change to any other needs a restart.
LIVE = frozenset({"log.level", "log.format", "limits.max-subscriptions", "limits.max-backlog"})

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True)
class Key:
    """One key of the file and the flag it stands for."""

    #: Dotted name, ``http.port``; top-level keys have no dot.
    name: str
    #: The flag's argparse dest.
    dest: str
    #: The flag, ``--http-port``.
    flag: str
    #: "bool", "not" (a ``--no-X`` flag: the key says X), "int", "float", "str", "path".
    kind: str
    #: A list of values (a repeatable flag).
    many: bool = False
    choices: tuple[str, ...] | None = None

    @property
    def table(self) -> str:
        return self.name.rpartition(".")[0]

    @property
    def short(self) -> str:
        return self.name.rpartition(".")[2]


def keys_of(parser: argparse.ArgumentParser) -> dict[str, Key]:
    """Every key of *parser*'s flags, by dotted name, in the order of the help."""
    keys: dict[str, Key] = {}
    # argparse keeps groups and their actions in private lists; its public API has no walk.
    for group in parser._action_groups:
        title = group.title or ""
        table = "" if title in _UNTITLED else GROUP_TABLES.get(title, _slug(title))
        for action in group._group_actions:
            if action.dest in _NOT_KEYS or action.dest in SHORTHANDS:
                continue
            key = _key(action, table)
            if key.name in keys:
                raise AssertionError(f"{key.flag} and {keys[key.name].flag} both make {key.name}")
            keys[key.name] = key
    return keys


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _key(action: argparse.Action, table: str) -> Key:
    flag = next((o for o in action.option_strings if o.startswith("--")), None)
    if flag is None:
        raise AssertionError(f"{action.dest}: a router option needs a long --flag")
    word = flag[2:]
    boolean = isinstance(
        action,
        (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction),
    )
    inverted = (
        boolean
        and word.startswith("no-")
        and not isinstance(action, argparse.BooleanOptionalAction)
    )
    if action.dest in RENAMES:
        name = RENAMES[action.dest]
    else:
        if inverted:
            word = word[3:]
        if table and word == table:
            word = "enabled"
        elif table and word.startswith(table + "-"):
            word = word[len(table) + 1 :]
        name = f"{table}.{word}" if table else word
    if boolean:
        kind = "not" if inverted else "bool"
    elif action.type is int:
        kind = "int"
    elif action.type is float:
        kind = "float"
    elif action.type is Path:
        kind = "path"
    elif action.type is None:
        kind = "str"
    else:
        raise AssertionError(f"{flag}: no key kind for type {action.type!r}")
    choices = tuple(str(c) for c in action.choices) if action.choices else None
    return Key(name, action.dest, flag, kind, isinstance(action, argparse._AppendAction), choices)


# -- which flags the command line gave ------------------------------------------------------


def record_given(parser: argparse.ArgumentParser) -> None:
    """Make *parser* note in the namespace (`GIVEN`) the dest of every flag the command line
    gives, so that the file overrides only defaults, even a default given explicitly."""
    for action in parser._actions:
        action.__class__ = _recording(type(action))
    parser.set_defaults(**{GIVEN: ()})


_RECORDING: dict[type[argparse.Action], type[argparse.Action]] = {}


def _recording(cls: type[argparse.Action]) -> type[argparse.Action]:
    """*cls* made to note its dest in `GIVEN` when the command line gives it (one per class)."""
    if cls in _RECORDING or cls in _RECORDING.values():
        return _RECORDING.get(cls, cls)

    def __call__(
        self: argparse.Action,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, GIVEN, (*getattr(namespace, GIVEN, ()), self.dest))
        cls.__call__(self, parser, namespace, values, option_string)

    made = _RECORDING[cls] = type(cls.__name__, (cls,), {"__call__": __call__})
    return made


# -- reading a file -------------------------------------------------------------------------


def load(
    path: Path, keys: Mapping[str, Key], environ: Mapping[str, str] | None = None
) -> dict[str, tuple[Any, int, str]]:
    """The values *path* sets: dest → (value as the flag gives it, line, key). Raises
    `UsageError` (``FILE:LINE: reason``) for a file that is not TOML, an unknown key, a
    value of the wrong type or not among the choices."""
    import tomllib

    from aa.mesh import UsageError

    env = os.environ if environ is None else environ
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read the configuration {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a TOML file (not UTF-8 text)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"\s*\(at line (\d+), column \d+\)", str(exc))
        reason = str(exc)[: m.start()] if m else str(exc)
        where = f"{path}:{m.group(1)}" if m else str(path)
        raise UsageError(f"{where}: not valid TOML: {reason}") from None
    lines = _key_lines(text)
    tables = {k.table for k in keys.values()} - {""}
    out: dict[str, tuple[Any, int, str]] = {}

    def fail(name: str, reason: str) -> UsageError:
        line = lines.get(name) or lines.get(name.rpartition(".")[0])
        return UsageError(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")

    def one(name: str, value: Any) -> None:
        key = keys.get(name)
        if key is None:
            if name in tables:
                raise fail(name, f"{name} is a table: write [{name}] and its keys below it")
            what = "table" if isinstance(value, dict) else "key"
            shown = f"[{name}]" if what == "table" else name
            raise fail(name, f"unknown {what} {shown}{_nearest(name, keys, tables)}")
        out[key.dest] = (_value(key, value, env, lambda r: fail(name, r)), lines.get(name, 0), name)

    for name, value in data.items():
        if name in tables and isinstance(value, dict):
            for sub, v in value.items():
                one(f"{name}.{sub}", v)
        else:
            one(name, value)
    return out


def _nearest(name: str, keys: Iterable[str], tables: Iterable[str]) -> str:
    candidates = [*keys, *tables]
    found = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if not found:  # a key in the wrong table: [mesh] port
        short = name.rpartition(".")[2]
        found = [k for k in keys if k.rpartition(".")[2] == short][:1]
    return f"; did you mean {found[0]}?" if found else ""


def _show(value: Any) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    kind = kinds.get(type(value), "a list" if isinstance(value, list) else "a table")
    text = repr(value).replace("'", '"') if isinstance(value, str) else _toml_value(value)
    return f"{text} ({kind})" if isinstance(value, (bool, int, float, str)) else kind


def _value(key: Key, value: Any, env: Mapping[str, str], fail: Any) -> Any:
    if key.many:
        if not isinstance(value, list):
            raise fail(f"{key.name} must be a list, e.g. [{_example(key)}], not {_show(value)}")
        return [_scalar(key, v, env, fail) for v in value]
    return _scalar(key, value, env, fail)


def _example(key: Key) -> str:
    return '"10.0.0.0/8"' if key.kind == "str" else '"/srv/aa"' if key.kind == "path" else "1"


def _scalar(key: Key, value: Any, env: Mapping[str, str], fail: Any) -> Any:
    if key.kind in ("bool", "not"):
        if type(value) is not bool:
            raise fail(f"{key.name} must be true or false, not {_show(value)}")
        return not value if key.kind == "not" else value
    if key.kind == "int":
        if type(value) is not int:
            raise fail(f"{key.name} must be an integer, not {_show(value)}")
        return value
    if key.kind == "float":
        if type(value) not in (int, float) or not math.isfinite(value):
            raise fail(f"{key.name} must be a number (seconds), not {_show(value)}")
        return float(value)
    if type(value) is not str:
        raise fail(f"{key.name} must be a string, not {_show(value)}")
    if key.choices is not None and value not in key.choices:
        near = difflib.get_close_matches(value, key.choices, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise fail(f"{key.name} must be one of {', '.join(key.choices)}, not {value!r}{hint}")
    if key.kind == "path":
        if not value:
            raise fail(f"{key.name} must name a file or folder, not an empty string")
        for var in _ENV_REF.findall(value):
            if var not in env:
                raise fail(f"{key.name}: ${{{var}}} is not set in the environment")
        return Path(_ENV_REF.sub(lambda m: env[m.group(1)], value))
    return value


def _key_lines(text: str) -> dict[str, int]:
    """Dotted key (and table) → the line it is on, for error messages. A reader, not a
    parser: the text is valid TOML (tomllib said so), and a line it cannot place is left out."""
    out: dict[str, int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("[") and not s.startswith("[["):
            table = _dotted(s[1 : s.find("]")])
            out.setdefault(table, number)
            continue
        m = re.match(
            r"""((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""",
            s,
        )
        if m:
            name = _dotted(m.group(1))
            out.setdefault(f"{table}.{name}" if table else name, number)
    return out


def _dotted(text: str) -> str:
    return ".".join(p.strip().strip("\"'") for p in text.split("."))


# -- the effective configuration ------------------------------------------------------------


def resolve(
    cmdline: argparse.Namespace,
    keys: Mapping[str, Key],
    environ: Mapping[str, str] | None = None,
) -> argparse.Namespace:
    """*cmdline* with what its ``--config`` file sets (flags the command line gave win);
    *cmdline* itself unchanged, so that a reload can resolve it again. Raises `UsageError`."""
    out = argparse.Namespace(**vars(cmdline))
    setattr(out, SOURCES, {})
    path = getattr(cmdline, "config", None)
    if path is None:
        return out
    given = set(getattr(cmdline, GIVEN, ()))
    for dest, (value, line, name) in load(path, keys, environ).items():
        if dest not in given:
            setattr(out, dest, value)
            getattr(out, SOURCES)[dest] = (path, line, name)
    return out


def blame(exc: Exception, args: argparse.Namespace, keys: Mapping[str, Key]) -> Exception:
    """*exc* (a `UsageError` naming a ``--flag``) with the file and line that set that flag's
    value, when the file set it; else *exc*."""
    from aa.mesh import UsageError

    sources = getattr(args, SOURCES, {})
    by_flag = {k.flag: k for k in keys.values()}
    for flag in re.findall(r"--[a-z][a-z-]*", str(exc)):
        key = by_flag.get(flag)
        if key is not None and key.dest in sources:
            path, line, name = sources[key.dest]
            return UsageError(f"{path}:{line}: {name}: {exc}")
    return exc


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def to_toml(
    args: argparse.Namespace,
    keys: Mapping[str, Key],
    *,
    only: Collection[str] | None = None,
    header: str = "The effective configuration of 'aa router' (aa router --print-config).",
) -> str:
    """The configuration *args* holds, as a file `load` reads back to the same values. Keys
    without a value (the flag's default is "none" or "decided at start") are commented out;
    with *only* (dests), just those keys are written."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    tables: dict[str, list[Key]] = {"": []}  # top-level keys first: TOML needs them there
    for key in keys.values():
        if only is None or key.dest in only:
            tables.setdefault(key.table, []).append(key)
    for table, members in tables.items():
        if not members and table:
            continue
        lines += ["", f"[{table}]"] if table else [""]
        for key in members:
            value = getattr(args, key.dest, None)
            if value is not None and key.kind == "not":
                value = not value
            if value is None:
                lines.append(f"# {key.short} =  (not set)")
            else:
                lines.append(f"{key.short} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def changes(
    old: argparse.Namespace, new: argparse.Namespace, keys: Mapping[str, Key]
) -> list[tuple[Key, Any, Any]]:
    """The keys whose value differs between *old* and *new*: (key, old value, new value)."""
    out = []
    for key in keys.values():
        a, b = getattr(old, key.dest, None), getattr(new, key.dest, None)
        if a != b:
            out.append((key, a, b))
    return out
