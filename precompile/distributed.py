"""precompile over torch.distributed: capture once on every rank, serve the pair on every rank.

`capture(..., writer_rank=)` runs an SPMD capture (see precompile.serve.ranks);
`load_everywhere` ships one rank's pair to all ranks and loads it there.
"""
from __future__ import annotations

from precompile.serve.ranks import load_everywhere

__all__ = ["load_everywhere"]
