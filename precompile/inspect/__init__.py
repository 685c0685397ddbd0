"""precompile.inspect: a torch-free forensic reader, verifier and semantic diff of artifact pairs.

Nothing here executes, imports or unpickles anything from an artifact, and nothing here imports
torch: python_code is read with `ast`, the cache header-first with a typed msgspec decode, pickles
with a static `pickletools` scan. Entry points: `open_artifact` (the typed model) and the CLI verbs
registered by `precompile.inspect.commands.register`.
"""
from __future__ import annotations

from precompile.inspect.model import Artifact
from precompile.inspect.reader import open_artifact, resolve_pair

__all__ = ["Artifact", "open_artifact", "resolve_pair"]
