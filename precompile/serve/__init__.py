"""Serving an artifact: load (read, check, prime kernels, exec python_code), kernel priming and the
Triton cache, no_compilation(), and ranks (loading once for every rank of a torch.distributed world)."""
