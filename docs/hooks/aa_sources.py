"""A MkDocs hook that lets mkdocstrings find `aa.client`, `aa.router` and the other packages.

Each package lives in a top-level folder (`client/`, `router/`, ...) that pyproject.toml's
`package-dir` installs as `aa.<name>`. griffe, which reads the sources for mkdocstrings, looks
for a folder named `aa` and cannot follow that mapping, so the build points it at a temporary
folder holding an `aa/` of symbolic links made from the same table. Nothing is imported and
nothing is fetched.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority


@event_priority(100)  # before mkdocstrings reads its handlers' options
def on_config(config: Any) -> Any:
    root = Path(config.config_file_path).resolve().parent
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    mapping: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    shadow = Path(tempfile.mkdtemp(prefix="aa-docs-sources-"))
    atexit.register(shutil.rmtree, shadow, True)
    (shadow / "aa").mkdir()
    for package, folder in mapping.items():
        top, _, name = package.partition(".")
        if top == "aa" and name and "." not in name:
            (shadow / "aa" / name).symlink_to(root / folder, target_is_directory=True)
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python.setdefault("paths", []).append(str(shadow))
    return config
