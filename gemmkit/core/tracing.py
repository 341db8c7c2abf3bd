"""The public ops' switch to their torch.library custom ops while torch.compile traces them.

Eagerly the check costs one call of torch.compiler.is_compiling (about 0.1 µs); gemmkit.library
(which registers the ops) is imported on the first traced call only.
"""

from __future__ import annotations

from torch.compiler import is_compiling  # noqa: F401  (re-exported for the ops)


def library():
    """gemmkit.library, imported (and its ops registered) on first use; Dynamo runs the import
    statement itself while tracing."""
    from .. import library as lib

    return lib
