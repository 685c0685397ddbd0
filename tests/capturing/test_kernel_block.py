"""The capture's kernel block: what it changes in Inductor while it is open, and puts back after."""
from __future__ import annotations

from precompile.capturing import kernels
from precompile.torch_compat import compiled_triton_kernels, inductor_config


def test_the_block_compiles_triton_in_this_process_with_inductors_kernel_memo_set_aside():
    # Found by the first GPU check: a kernel Inductor had compiled earlier in the process came from
    # its memo, so no file of it reached the block's dir; a worker pool compiled where serving does not.
    threads = inductor_config.compile_threads
    compiled_triton_kernels["earlier kernel source"] = "earlier future"
    try:
        with kernels.private_inductor_cache():
            assert inductor_config.compile_threads == 1
            assert "earlier kernel source" not in compiled_triton_kernels
            compiled_triton_kernels["block kernel source"] = "block future"
        assert inductor_config.compile_threads == threads
        assert compiled_triton_kernels["earlier kernel source"] == "earlier future"
        assert compiled_triton_kernels["block kernel source"] == "block future"
    finally:
        compiled_triton_kernels.pop("earlier kernel source", None)
        compiled_triton_kernels.pop("block kernel source", None)
