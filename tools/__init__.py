"""aa.tools"""

__all__: list[str] = []
