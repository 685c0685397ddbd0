"""The python_code section of a Dynamo subgraph lowered with Inductor: its output modules as text,
bound to plain callables by the dynamo_subgraphs driver (a training subgraph through an
autograd.Function), so serving needs neither Inductor nor AOTAutograd."""
from __future__ import annotations

from precompile.codegen.environment import text_literal
from precompile.codegen.models import AutogradPlan, SubgraphSection

# The driver modules a lowered subgraph's section runs on, in the order python_code includes them.
RUNTIME = ("inductor_runtime", "dynamo_subgraphs")


def _module(name: str, text: str, detached: tuple[int, ...] = ()) -> str:
    literal = text_literal("\n" + text.strip("\n") + "\n")
    return f"inductor_subgraph({name!r}, {literal}" + (f", detached={detached!r})" if detached else ")")


def _slug(forward: str) -> str:
    """A lowered subgraph's section holds its forward and backward: named by the graph (`graph-0`)."""
    return forward.removesuffix("_forward").replace("_", "-")


def lowered_section(where: str, forward: str, forward_text: str, backward: str = "", backward_text: str = "",
                    plan: AutogradPlan | None = None, detached: tuple[int, ...] = ()) -> SubgraphSection:
    """`forward` bound to the served callable (its `detached` outputs alias inputs); with a plan,
    `backward` to the backward module's call and `forward` to the autograd.Function pairing them."""
    if plan is None:
        return SubgraphSection(
            title=f"{where}: Inductor output module, served as a plain function over the graph inputs",
            slug=_slug(forward), name=forward, source=f"{forward} = {_module(forward, forward_text, detached)}",
            runs_in_place=True,
            runtime=RUNTIME,
        )
    lines = [
        f"{backward} = {_module(backward, backward_text)}",
        f"{forward} = autograd_subgraph(",
        f"    {_module(forward, forward_text)},",
        f"    {backward},",
        f"    returns={plan.returns}, saved_tensors={plan.saved_tensors},",
        f"    non_differentiable={plan.non_differentiable!r}, grad_outputs={plan.grad_outputs!r},",
        ")",
    ]
    return SubgraphSection(
        title=f"{where}: Inductor forward and backward output modules, paired in an autograd.Function",
        slug=_slug(forward), name=forward, source="\n".join(lines), runs_in_place=True, runtime=RUNTIME,
    )
