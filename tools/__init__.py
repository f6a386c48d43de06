"""The `aa` command line and the PySpark mining job; no public Python API of its own."""

__all__: list[str] = []
