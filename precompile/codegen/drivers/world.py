# World check (precompile/codegen/drivers/world.py, included verbatim): this artifact's graphs call
# collectives, so it runs only in the torch.distributed world it was captured in.
try:
    from precompile.errors import PrecompileError
except ImportError:  # served where only torch is installed

    class PrecompileError(RuntimeError):
        pass


def _world_text(size, backend):
    return f"a world of size {size} on backend {backend!r}"


def check_world(world, artifact):
    """Raise PrecompileError unless this process runs in `world` (the WORLD literal)."""
    import torch.distributed as dist

    captured = _world_text(world["size"], world["backend"])
    if not (dist.is_available() and dist.is_initialized()):
        raise PrecompileError(
            f"{artifact} was captured in {captured} and its graphs call collectives {world['collectives']}, but this "
            f"process has no torch.distributed process group; initialize one like the capture's (e.g. torchrun "
            f"--nproc-per-node {world['size']}) before loading it"
        )
    here = _world_text(dist.get_world_size(), str(dist.get_backend()))
    if here != captured:
        raise PrecompileError(
            f"{artifact} was captured in {captured}, but this process runs in {here}; serve it in the world it was "
            "captured in, or capture again in this one"
        )
    from torch._C._distributed_c10d import _resolve_process_group

    for group in world["groups"]:
        try:
            ranks = dist.get_process_group_ranks(_resolve_process_group(group["name"]))
        except (RuntimeError, ValueError, KeyError):
            ranks = None
        if ranks is None or list(ranks) != list(group["ranks"]):
            raise PrecompileError(
                f"{artifact}'s collectives talk to process group {group['name']!r} with ranks {list(group['ranks'])}, but "
                f"here that group {'does not exist' if ranks is None else f'has ranks {list(ranks)}'}; create the "
                "process groups in the order the capture did"
            )
