"""aa.router.wire — compiled readers of the client protocol's usual frames, beside the codec.

Owns: reading a client's usual publish frame straight from its bytes into checked events
(`PublishReader`, the compiled `_publishes` where it is built), for the client sessions.

Does not own: the frames' format, their checks and errors, and every frame the compiled
reader leaves (`aa.mesh.protocol`, the reference), nor the sessions (`aa.router.session`).
"""

from .publishes import COMPILED, MAX_WORK, PublishReader

__all__ = ["COMPILED", "MAX_WORK", "PublishReader"]
