"""Each package names its public API in __all__, exactly as listed here, and everything named
there exists. Changing a public face means changing this list on purpose."""

import ast
import importlib
import pathlib

import pytest

PUBLIC: dict[str, list[str]] = {
    "aa.mesh": [
        "AaError",
        "AaTimeout",
        "AccessDenied",
        "BROADCAST_INTERVAL",
        "Beacon",
        "BroadcastDiscovery",
        "CACHE_INTEREST",
        "Connection",
        "ConnectionClosed",
        "ConnectionLost",
        "Control",
        "DEFAULT_ROUTER_PORT",
        "DEFAULT_TTL",
        "DISCOVERY_PORT",
        "DatagramNetwork",
        "Detours",
        "Discovery",
        "DiscoveryConfig",
        "ENV_INTERFACES",
        "Event",
        "EventQueue",
        "FORGET_AFTER",
        "Flood",
        "FloodRules",
        "ForeignProtocol",
        "FrameTooLarge",
        "GetMesh",
        "Hop",
        "ID_SCOPE_LENGTH",
        "IN_PROGRESS",
        "IdGenerator",
        "Interest",
        "InterestFilter",
        "InterestTable",
        "Interface",
        "InvalidPattern",
        "InvalidPolicy",
        "InvalidValue",
        "KnownRouter",
        "MAX_FRAME_BYTES",
        "MAX_ID_LENGTH",
        "MAX_PEERS",
        "MAX_ROUTERS",
        "MAX_TTL",
        "META_ADDRESS",
        "META_CLIENT",
        "META_HISTORICAL",
        "META_PATH",
        "META_ROUTER",
        "META_TIME",
        "META_TTL",
        "META_USER",
        "MalformedFrame",
        "MeshInfo",
        "MeshInterests",
        "NEED_DATA",
        "NotAuthenticated",
        "OutboxFull",
        "PatternError",
        "PatternSpec",
        "PeerEntry",
        "PeerHello",
        "PeerRouters",
        "PeerState",
        "PeerTable",
        "PermissionDenied",
        "ProtocolError",
        "RETRY_BASE",
        "RETRY_JITTER",
        "RETRY_MAX",
        "ROUTER_META_KEYS",
        "RemoteError",
        "RouterInfo",
        "STABLE_AFTER",
        "STORE_INTEREST",
        "SeenIds",
        "Source",
        "StoreError",
        "StoreFull",
        "StoreUnavailable",
        "TOPOLOGY_FILE",
        "UdpNetwork",
        "UnknownCache",
        "UnknownMessage",
        "UsageError",
        "Value",
        "Values",
        "ZeroconfDiscovery",
        "check_endpoint",
        "check_value",
        "check_values",
        "detour_targets",
        "event_from_json",
        "event_path",
        "event_to_json",
        "format_endpoint",
        "from_json",
        "id_scope",
        "is_unspecified",
        "load_pyx",
        "load_topology",
        "parse_endpoint",
        "save_topology",
        "select_targets",
        "selected_addresses",
        "selection_from_env",
        "to_json",
    ],
    "aa.mesh.protocol": [
        "Ack",
        "Bye",
        "CACHE_ANSWERS",
        "CACHE_REQUESTS",
        "CacheAck",
        "CacheAnswer",
        "CacheClear",
        "CacheDone",
        "CacheEvents",
        "CacheFetch",
        "CacheKeepalive",
        "CachePolicy",
        "CacheRegister",
        "CacheRemove",
        "CacheRequest",
        "Cached",
        "Connection",
        "Control",
        "DEFAULT_CACHE_TIMEOUT",
        "DELIVER_HEAD",
        "Deliver",
        "Error",
        "Flood",
        "FloodGroup",
        "ForgetRouter",
        "GetCacheInfo",
        "GetCached",
        "GetMesh",
        "GetRouters",
        "Hello",
        "IN_PROGRESS",
        "KnownRouter",
        "MAX_ANSWER_EVENTS",
        "MAX_AWAY",
        "MAX_CACHE_TIMEOUT",
        "MAX_FRAME_BYTES",
        "MAX_FRAME_VALUES",
        "MAX_GROUP_EVENTS",
        "MAX_GROUP_TO",
        "MAX_KNOWN_ROUTERS",
        "MAX_NAME_LENGTH",
        "MAX_NOTICE_CHANGES",
        "MAX_PATTERN_SOURCE",
        "MAX_ROUTER_REF",
        "MAX_TOPIC_LENGTH",
        "MESH_INFO_FORMAT",
        "MESH_PROTOCOL_VERSION",
        "MESSAGE_KINDS",
        "MeshInfo",
        "Message",
        "Missed",
        "MissedAway",
        "NEED_DATA",
        "OVERFLOW_MODES",
        "PROTOCOL_VERSION",
        "PUBLISH_HEAD",
        "PatternFailed",
        "PatternRaised",
        "PatternSpec",
        "PeerHello",
        "PeerRouters",
        "Ping",
        "Pong",
        "Publish",
        "QUENCH_ANSWERS",
        "QUENCH_REQUESTS",
        "Quench",
        "QuenchNotice",
        "Quenched",
        "Routers",
        "STEP_ABOVE",
        "Subscribe",
        "Subscribed",
        "Unquench",
        "Unsubscribe",
        "Update",
        "Updated",
        "Welcome",
        "declared_needs",
        "event_from_wire",
        "event_to_wire",
        "pack",
        "pack_events",
        "pack_with_meta",
        "packed_event",
        "packed_fields",
        "register",
        "unpack",
        "unpacked_event",
        "with_needs",
    ],
    "aa.router": [
        "Acknowledgements",
        "CacheConfig",
        "CacheInfo",
        "ClientCacheService",
        "DEFAULT_PORT",
        "Dispatcher",
        "Endpoint",
        "EventLog",
        "EventLogConfig",
        "ExpiryPolicy",
        "Fetched",
        "LocalSubscription",
        "MeshCache",
        "MeshConfig",
        "MeshService",
        "QuenchConfig",
        "QuenchService",
        "Router",
        "RouterConfig",
        "StoreConfig",
        "StoreService",
        "WorkerConfig",
        "parse_duration",
        "scoped_id",
    ],
    "aa.router.caches": [
        "CACHE_SWEEP_INTERVAL",
        "CACHE_SYNC_INTERVAL",
        "CACHE_SYNC_TOPIC",
        "CACHE_TOPIC",
        "CacheConfig",
        "CacheIndex",
        "CacheInfo",
        "CacheSync",
        "ClientCacheService",
        "ClientCaches",
        "Fetched",
        "MAX_CLIENT_CACHES",
        "MAX_EVENTS_PER_CACHE",
        "MESH_CACHE_MAX_BYTES",
        "MESH_CACHE_MAX_EVENTS",
        "MeshCache",
        "approx_size",
        "cache_key",
        "encode_events",
        "equality_of",
        "owner_of",
    ],
    "aa.router.wire": ["COMPILED", "MAX_WORK", "PublishReader"],
    "aa.router.eventlog": [
        "Chunk",
        "EVENTLOG_DIR",
        "EventLog",
        "EventLogConfig",
        "EventLogStats",
        "RESTART_DELAY",
        "SCHEMA",
        "STOP_TIMEOUT",
        "TYPE_NAMES",
        "WRITER_NICE",
        "Writer",
        "WriterProcess",
        "build_table",
        "decode_json",
        "decode_value",
        "encode_json",
        "encode_value",
        "safe_name",
    ],
    "aa.router.links": [
        "ControlCallback",
        "Dialer",
        "INTEREST_TOPIC",
        "InterestService",
        "LinkOwner",
        "MAX_ALTERNATIVES",
        "MAX_CONCURRENT_DIALS",
        "MAX_PEER_BACKLOG",
        "MAX_PEER_LINKS",
        "MeshConfig",
        "MeshService",
        "MeshView",
        "PEER_KEEPALIVE",
        "PeerLink",
        "ROUTER_INFO_INTERVAL",
        "ROUTER_INFO_TOPIC",
        "ROUTINGS",
        "Relay",
        "Wants",
        "summary_interval",
    ],
    "aa.router.patterns": [
        "CPU_SAMPLE_EVERY",
        "Delivery",
        "ErrorNotice",
        "HostFacts",
        "MAX_CPU_TOP",
        "Matcher",
        "PREDICATE_TIER",
        "PatternCost",
        "PatternEngine",
        "PatternSet",
        "SANDBOX_TIER",
        "SandboxLimits",
        "WORKER_TIER",
        "WorkerConfig",
        "admits",
        "pattern_warnings",
        "scope_filter",
    ],
    "aa.router.patterns.index": [
        "Bucket",
        "Instance",
        "Matcher",
        "Member",
        "PredicateIndex",
        "add_bucket",
        "add_member",
        "copy_state",
        "drop_bucket",
        "drop_member",
        "first",
        "freeze",
        "rekey_bucket",
        "shared_strings",
    ],
    "aa.router.patterns.predicates": [
        "Access",
        "EQ",
        "INTERVAL",
        "MAX_INTERVAL_BOUND",
        "META",
        "PARAM",
        "PREFIX",
        "Plan",
        "PredicateProgram",
        "RANGE",
        "SUFFIX",
        "TYPE",
        "VALUE",
        "hashable",
        "parse_conjunction",
        "parse_predicate",
        "plan_spaced",
    ],
    "aa.router.patterns.sandbox": [
        "Delivery",
        "ERRORS_CODE",
        "ErrorNotice",
        "ExprProgram",
        "FORBIDDEN_NAMES",
        "Guards",
        "HostFacts",
        "MAX_ERROR_TEXT",
        "MAX_LINE_TEXT",
        "MAX_STATE_DEPTH",
        "MEMORY",
        "NO_MATCH_IN_EXPRESSIONS",
        "Sandbox",
        "SandboxLimits",
        "SandboxStop",
        "ScriptProgram",
        "TIMEOUT",
        "XPathProgram",
        "XmlCache",
    ],
    "aa.router.patterns.workers": [
        "ISOLATIONS",
        "MAX_STOP_MESSAGE",
        "PRECHECK_MAX_SOURCE",
        "RemoteMatcher",
        "RemoteProgram",
        "WorkerConfig",
        "WorkerPool",
        "WorkerTier",
        "deliver_each",
        "missed_each",
        "prechecked",
    ],
    "aa.router.quench": [
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
    ],
    "aa.router.store": [
        "EXCHANGE_TIMEOUT",
        "EventStore",
        "Exchanges",
        "ExpiryPolicy",
        "HistoryReplay",
        "Hold",
        "MAX_HELD",
        "MAX_STORED_TYPE_LENGTH",
        "META_MAX_AGE",
        "META_MAX_COUNT",
        "META_MESH_CACHE",
        "META_PERSIST",
        "STORE_FILE",
        "SYNC_TOPIC",
        "StoreConfig",
        "StoreService",
        "StoreStats",
        "StoreSync",
        "as_spec",
        "check_history",
        "check_persistable",
        "check_since",
        "chunks",
        "differing",
        "digest_entries",
        "digest_of",
        "event_order",
        "event_time",
        "id_hash",
        "ids_digest",
        "mark_historical",
        "parse_digest",
        "parse_duration",
        "parse_ids",
        "persist_policy",
        "send_paged",
        "wants_mesh_cache",
    ],
    "aa.client": [
        "AsyncClient",
        "AsyncQuench",
        "AsyncSubscription",
        "Client",
        "ClientConfig",
        "NOTHING_LISTENS",
        "Quench",
        "Subscription",
    ],
    "aa.http_api": [
        "ATOM_TYPE",
        "BadToken",
        "Capacity",
        "DEFAULT_ALLOW",
        "DEFAULT_HTTP_PORT",
        "HttpConfig",
        "HttpEndpoint",
        "MAX_BODY_BYTES",
        "MAX_BODY_VALUES",
        "UnknownClient",
        "create_app",
        "entry_id",
        "event_from_content",
    ],
    "aa.addins": [
        "AddIn",
        "AddInLoadError",
        "Backoff",
        "Container",
        "ContainerConfig",
        "Context",
        "DEFAULT_POLL_INTERVAL",
        "ENTRY_POINT_GROUP",
        "default_data_dir",
    ],
    "aa.tools": [],
    "aa.router.security": [
        "ALLOW_ALL",
        "ANONYMOUS",
        "AllowList",
        "Gate",
        "HANDSHAKE_TIMEOUT",
        "HandshakeGuard",
        "Identity",
        "Listener",
        "MAX_PARTIAL_TOTAL",
        "MAX_TOKEN_DAYS",
        "NAME_RE",
        "PartialFrames",
        "Permissions",
        "ROUTER_UNIT",
        "RefusalBudget",
        "RevocationList",
        "Rules",
        "SecurityConfig",
        "TLS_REQUIRED",
        "TokenVerifier",
        "USER_UNIT",
        "check_cert_file",
        "check_key_file",
        "client_context",
        "id_matches",
        "identity_of",
        "issue_token",
        "make_crl",
        "router_id_for",
        "server_context",
        "user_serial",
    ],
}
PACKAGES = list(PUBLIC)
ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_exactly_the_public_face(name):
    module = importlib.import_module(name)
    assert sorted(module.__all__) == PUBLIC[name]
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr} is in __all__ but missing"


def test_no_module_imports_another_packages_submodule():
    """Across packages (aa.mesh, aa.mesh.protocol, aa.router and its rooms, …), code imports a
    package's public face, never a module inside it: `from aa.router.store import X`, not
    `from aa.router.store.eventstore import X`."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(config["packages"])
    offenders = []
    for top, folder in config["package-dir"].items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder)
            own = ".".join([top, *rel.parent.parts]) if rel.parent.parts else top
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom) or node.module is None:
                    continue
                if node.level:  # relative: resolve against the module's own package
                    base = own.split(".")[: len(own.split(".")) - (node.level - 1)]
                    target = ".".join(base + node.module.split("."))
                else:
                    target = node.module
                if not target.startswith("aa.") or target in packages:
                    continue
                package = target.rsplit(".", 1)[0]
                # A room may use its enclosing package's modules (aa.router.seams, aa.mesh.errors):
                # the enclosing package's face imports the room, so it cannot import that face.
                ancestor = own == package or own.startswith(package + ".")
                if not ancestor and package in packages:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {target}")
    assert not offenders, "\n".join(offenders)


#: The rooms of `aa.router.patterns`, bottom first. A room's modules import, when they run, only
#: their own room and the rooms before it; the modules at the package's top (the engine, the
#: pattern set, advice, scope) may import every room, and no room imports them.
PATTERN_ROOMS = ["sandbox", "predicates", "index", "workers"]
#: The imports up the list that are allowed, each with its reason. The worker process's main
#: runs an engine of its own; the router's side of the worker tier never imports the engine.
PATTERN_ROOMS_UPWARD = {("workers/child.py", "aa.router.patterns.engine")}


def _imports(path: pathlib.Path, own: str, typing_too: bool) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names) of each `from ... import` of *path* (a module of the
    package *own*); those under `if TYPE_CHECKING:` only if *typing_too*."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            typing_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or (id(node) in typing_only and not typing_too):
            continue
        if node.level:
            base = own.split(".")[: len(own.split(".")) - (node.level - 1)]
            target = ".".join(base + (node.module.split(".") if node.module else []))
        else:
            target = node.module or ""
        found.append((node.lineno, target, [a.name for a in node.names]))
    return found


def test_the_pattern_rooms_import_only_the_rooms_below_them():
    """`aa.router.patterns` is split into rooms with one owner each (sandbox, predicates,
    index, workers; the package docstring says what each holds), layered so that a room can
    be read knowing only the rooms below it. Imports for type checking only may name a room
    above (a kernel's `run` takes the index's `Bucket`, which holds the kernel's program)."""
    folder = ROOT / "router" / "patterns"
    rank = {f"aa.router.patterns.{room}": i for i, room in enumerate(PATTERN_ROOMS)}
    offenders = []
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder)
        if len(rel.parts) == 1:
            continue  # the top may import every room
        room = f"aa.router.patterns.{rel.parts[0]}"
        assert room in rank, f"{rel.parts[0]}/ is a room missing from PATTERN_ROOMS"
        own = ".".join(["aa.router.patterns", *rel.parent.parts])
        for line, target, _ in _imports(path, own, typing_too=False):
            if not target.startswith("aa.router.patterns.") or target.startswith(room):
                continue
            other = ".".join(target.split(".")[:4])
            up = other not in rank or rank[other] > rank[room]
            if up and (rel.as_posix(), target) not in PATTERN_ROOMS_UPWARD:
                offenders.append(f"router/patterns/{rel}:{line} imports {target}")
    assert not offenders, "\n".join(offenders)


def _defined(path: pathlib.Path) -> set[str]:
    """The names *path* defines at its top level (also under a top-level `if`/`try`)."""
    names: set[str] = set()
    body = list(ast.parse(path.read_text()).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                elts = t.elts if isinstance(t, ast.Tuple) else [t]
                names.update(e.id for e in elts if isinstance(e, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):
            body.extend(node.body + node.orelse)
    return names


#: The package folders whose modules take each name from where it is defined.
DEFINED_WHERE_TAKEN = {"aa.router": "router", "aa.mesh": "mesh"}


def test_names_are_imported_from_where_they_are_defined():
    """In `aa.router` and `aa.mesh`, a name comes from the module that defines it (or from a
    package's face), never through a module that merely imported it: `Bucket` from the
    pattern index, not from the engine, which uses it."""
    offenders = []
    for top, folder in DEFINED_WHERE_TAKEN.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder)
            own = ".".join([top, *rel.parent.parts])
            for line, target, names in _imports(path, own, typing_too=True):
                if not target.startswith(top + "."):
                    continue
                source = ROOT / folder / pathlib.Path(*target.split(".")[2:])
                if source.is_dir() or not source.with_suffix(".py").is_file():
                    continue  # a package's face re-exports on purpose; its __all__ is held above
                defined = _defined(source.with_suffix(".py"))
                for name in names:
                    if name not in defined:
                        offenders.append(f"{folder}/{rel}:{line} takes {name} from {target}")
    assert not offenders, "\n".join(offenders)


def test_core_public_api():
    import aa.client
    import aa.mesh
    import aa.router

    assert {"Event", "AaError", "Connection", "PatternSpec", "ProtocolError", "UsageError"} <= set(
        aa.mesh.__all__
    )
    assert {"Router", "RouterConfig", "LocalSubscription"} <= set(aa.router.__all__)
    assert {"Client", "AsyncClient", "ClientConfig"} <= set(aa.client.__all__)


def test_py_typed_markers_ship():
    for name in ["aa.mesh", "aa.router", "aa.client", "aa.tools", "aa.http_api", "aa.addins"]:
        module = importlib.import_module(name)
        assert (pathlib.Path(module.__file__).parent / "py.typed").exists(), name


def test_every_module_of_the_packages_says_its_job():
    """Small files with one job (STYLE.md), judged by responsibility, not by a line count: each
    module opens with a docstring that says what it is for, so a reader can tell when it holds
    two things."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    silent = []
    for folder in config["package-dir"].values():
        for path in (ROOT / folder).rglob("*.py"):
            doc = ast.get_docstring(ast.parse(path.read_text()))
            if not doc or len(doc.split()) < 3:
                silent.append(str(path.relative_to(ROOT)))
    assert not silent, silent


def test_the_router_keeps_at_most_ten_modules_at_its_top():
    top = [p.name for p in (ROOT / "router").glob("*.py")]
    assert len(top) <= 10, top


def test_every_subpackage_is_listed_for_non_editable_installs():
    """A folder with an __init__.py that pyproject's `packages` omits is silently missing
    from a wheel (an editable install hides the mistake)."""
    import pathlib
    import tomllib

    root = pathlib.Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for top, folder in config["package-dir"].items():
        for init in (root / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(root / folder)
            name = ".".join([top, *rel.parts]) if rel.parts else top
            assert name in listed, f"{name} is not in [tool.setuptools] packages"
    for name in listed:  # and every listed package exists, or installing fails outright
        top = next(t for t in config["package-dir"] if name == t or name.startswith(t + "."))
        folder = (
            root
            / config["package-dir"][top]
            / pathlib.Path(*name[len(top) + 1 :].split(".") if name != top else ())
        )
        data_only = folder.is_dir() and not any(folder.glob("*.py"))  # e.g. http_api/static
        assert (folder / "__init__.py").exists() or data_only, (
            f"{name} is listed but {folder} has no __init__.py"
        )
