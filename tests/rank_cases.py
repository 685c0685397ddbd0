"""Steps with collectives that the multi-rank tests capture (importable: DynamoTracer needs that)."""
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def model_and_input(rank: int):
    """The same model on every rank (one seed), and an input that differs per rank."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return model, torch.randn(2, 4) + rank


def sum_outputs(model, x):
    """Inference: every rank's output summed with a functional all_reduce."""
    return funcol.all_reduce(model(x), "sum", dist.group.WORLD)


def train_step(model, x):
    """Training: backward, then the gradient all-reduced with the ordinary in-place dist.all_reduce."""
    loss = model(x).square().mean()
    loss.backward()
    grad = model.weight.grad.clone()
    dist.all_reduce(grad)
    return loss.detach(), grad


def broadcast_outputs(model, x):
    """dist.broadcast has no traceable twin: MakeFxTracer refuses it."""
    y = model(x)
    dist.broadcast(y, src=0)
    return y
