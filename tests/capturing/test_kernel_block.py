"""The capture's kernel block: what it changes in Inductor while it is open, and puts back after."""
from __future__ import annotations

import pytest
import torch

from precompile.capturing import kernels
from precompile.torch_compat import compiled_triton_kernels, inductor_config


@pytest.mark.parametrize("cuda", [True, False])
def test_the_block_compiles_triton_in_this_process_with_inductors_kernel_memo_set_aside(monkeypatch, cuda):
    # Found by the first GPU check: a kernel Inductor had compiled earlier in the process came from
    # its memo, so no file of it reached the block's dir; a worker pool compiled where serving does not.
    # Without CUDA there is no Triton compile: Inductor keeps its threads for the C++ builds.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    threads = inductor_config.compile_threads
    compiled_triton_kernels["earlier kernel source"] = "earlier future"
    try:
        with kernels.private_inductor_cache():
            assert inductor_config.compile_threads == (1 if cuda else threads)
            assert "earlier kernel source" not in compiled_triton_kernels
            compiled_triton_kernels["block kernel source"] = "block future"
        assert inductor_config.compile_threads == threads
        assert compiled_triton_kernels["earlier kernel source"] == "earlier future"
        assert compiled_triton_kernels["block kernel source"] == "block future"
    finally:
        compiled_triton_kernels.pop("earlier kernel source", None)
        compiled_triton_kernels.pop("block kernel source", None)
