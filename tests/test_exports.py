"""Each package names its public API in __all__, and everything named there exists."""

import importlib

import pytest

PACKAGES = ["aa.mesh", "aa.router", "aa.client", "aa.tools", "aa.http_api", "aa.addins"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist(name):
    module = importlib.import_module(name)
    assert isinstance(module.__all__, list)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr} is in __all__ but missing"


def test_core_public_api():
    import aa.client
    import aa.mesh
    import aa.router

    assert {"Event", "AaError", "Connection", "PatternSpec", "ProtocolError", "UsageError"} <= set(aa.mesh.__all__)
    assert {"Router", "RouterConfig", "LocalSubscription"} <= set(aa.router.__all__)
    assert {"Client", "AsyncClient", "ClientConfig"} <= set(aa.client.__all__)


def test_py_typed_markers_ship():
    import pathlib

    for name in PACKAGES:
        module = importlib.import_module(name)
        assert (pathlib.Path(module.__file__).parent / "py.typed").exists(), name


def test_every_subpackage_is_listed_for_non_editable_installs():
    """A folder with an __init__.py that pyproject's `packages` omits is silently missing
    from a wheel (an editable install hides the mistake)."""
    import pathlib
    import tomllib

    root = pathlib.Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for top, folder in {k: v for k, v in config["package-dir"].items()}.items():
        for init in (root / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(root / folder)
            name = ".".join([top, *rel.parts]) if rel.parts else top
            assert name in listed, f"{name} is not in [tool.setuptools] packages"
    for name in listed:  # and every listed package exists, or installing fails outright
        top = next(t for t in config["package-dir"] if name == t or name.startswith(t + "."))
        folder = root / config["package-dir"][top] / pathlib.Path(*name[len(top) + 1 :].split(".") if name != top else ())
        assert (folder / "__init__.py").exists(), f"{name} is listed but {folder} has no __init__.py"
