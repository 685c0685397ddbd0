"""The python_code section of a Dynamo subgraph lowered with Inductor: its output modules as text,
bound to plain callables by the dynamo_subgraphs driver (a training subgraph through an
autograd.Function), so serving needs neither Inductor nor AOTAutograd."""
from __future__ import annotations

from precompile.codegen.environment import text_literal
from precompile.codegen.models import AutogradPlan, Realignment, SubgraphSection

# The driver modules a lowered subgraph's section runs on, in the order python_code includes them.
RUNTIME = ("inductor_runtime", "dynamo_subgraphs")


def realign_keywords(realignment: Realignment | None) -> str:
    """The keywords run_inductor_call (and inductor_subgraph) take `realignment` by; "" when empty."""
    if realignment is None:
        return ""
    return ((f", realign={realignment.inputs!r}" if realignment.inputs else "")
            + (f", write_back={realignment.write_back!r}" if realignment.write_back else "")
            + (f", written={realignment.written!r}" if realignment.written else ""))


def _module(name: str, text: str, detached: tuple[int, ...] = (), realignment: Realignment | None = None,
            grad_mode: bool | None = None) -> str:
    literal = text_literal("\n" + text.strip("\n") + "\n")
    return (f"inductor_subgraph({name!r}, {literal}" + (f", detached={detached!r}" if detached else "")
            + realign_keywords(realignment) + (f", grad_mode={grad_mode!r}" if grad_mode is not None else "") + ")")


def _slug(forward: str) -> str:
    """A lowered subgraph's section holds its forward and backward: named by the graph (`graph-0`)."""
    return forward.removesuffix("_forward").replace("_", "-")


def lowered_section(where: str, forward: str, forward_text: str, backward: str = "", backward_text: str = "",
                    plan: AutogradPlan | None = None, detached: tuple[int, ...] = (),
                    realignments: dict[str, Realignment] | None = None, grad_mode: bool | None = None) -> SubgraphSection:
    """`forward` bound to the served callable (its `detached` outputs alias inputs); with a plan,
    `backward` to the backward module's call and `forward` to the autograd.Function pairing them.
    `realignments`: each module's ("forward", "backward") inputs its kernels take aligned; `grad_mode`:
    what an inference graph that changes grad mode leaves it at (None: as it found it)."""
    realigned = realignments or {}
    forward_module = _module(forward, forward_text, () if plan else detached, realigned.get("forward"),
                             None if plan else grad_mode)
    if plan is None:
        return SubgraphSection(
            title=f"{where}: Inductor output module, served as a plain function over the graph inputs",
            slug=_slug(forward), name=forward, source=f"{forward} = {forward_module}",
            runs_in_place=True,
            runtime=RUNTIME,
        )
    backward_module = _module(backward, backward_text, realignment=realigned.get("backward"))
    lines = [
        f"{backward} = {backward_module}",
        f"{forward} = autograd_subgraph(",
        f"    {forward_module},",
        f"    {backward},",
        f"    returns={plan.returns}, saved_tensors={plan.saved_tensors},",
        f"    non_differentiable={plan.non_differentiable!r}, grad_outputs={plan.grad_outputs!r},",
        ")",
    ]
    return SubgraphSection(
        title=f"{where}: Inductor forward and backward output modules, paired in an autograd.Function",
        slug=_slug(forward), name=forward, source="\n".join(lines), runs_in_place=True, runtime=RUNTIME,
    )
