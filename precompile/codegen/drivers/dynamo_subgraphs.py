# Serving of a Dynamo artifact's lowered Inductor subgraphs (precompile/codegen/drivers/
# dynamo_subgraphs.py, included verbatim after the kernel runtime). Each subgraph's output module is
# written below as a string and run here in a namespace of its own (two modules may define the same
# kernel names), on top of this file's globals, where the kernel runtime above provides what the
# output code imports from Inductor. Its `call` is served as a plain function over Dynamo's flat
# graph inputs; a training subgraph pairs its forward and backward modules in an autograd.Function.
# Nothing here imports torch._inductor or AOTAutograd. precompile.load passes the output modules
# compiled at capture (`__precompile_subgraph_code__`: sha256 of the text -> code), which run instead
# of compiling the text; run alone, this file compiles them.
import hashlib as _hashlib
import linecache as _linecache

import torch

_compiled_subgraphs = globals().get("__precompile_subgraph_code__") or {}
# The attribute a served subgraph carries its module text in (what tells one artifact's from another's).
_SOURCE_TAG = "__precompile_source__"


def inductor_subgraph(name, text, detached=(), realign=(), write_back=(), written=(), grad_mode=None):
    """The output module `text` run in a namespace of its own; returns its call over flat inputs.
    The `detached` outputs alias an input: each is served as a fresh tensor over the same storage.
    `realign` and `write_back`: the inputs its kernels take aligned; `written`: those it writes into
    (see run_inductor_call). `grad_mode`: what the graph leaves grad mode at, set after each call
    (AOTAutograd's functional graph keeps no grad-mode switch); None where it leaves it as it was."""
    filename = f"<precompile subgraph {name}>"
    _linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    namespace = dict(globals())
    namespace["__name__"] = name
    code = None
    if _compiled_subgraphs:
        code = _compiled_subgraphs.get(_hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())
    if code is None or code.co_filename != filename:
        code = compile(text, filename, "exec")
    exec(code, namespace)  # the module written in this file
    call, run = namespace["call"], namespace["run_inductor_call"]  # the kernel runtime's, above
    detached = frozenset(detached)

    def served(*flat):
        outputs = run(call, flat, realign, write_back, written)
        if grad_mode is not None:
            torch._C._set_grad_enabled(grad_mode)
        if not detached:
            return outputs
        return tuple(value.detach() if index in detached else value for index, value in enumerate(outputs))

    served.__name__ = served.__qualname__ = name
    setattr(served, _SOURCE_TAG, text)
    return served


class _AutogradSubgraph(torch.autograd.Function):
    """A forward module's outputs are the graph's returns, then the tensors and sizes its backward
    module reads; backward takes those sizes, those tensors and the returns' gradients, and gives
    one gradient per input."""

    @staticmethod
    def forward(ctx, plan, *flat):
        outputs = plan.forward(*flat)
        returns, saved_end = plan.returns, plan.returns + plan.saved_tensors
        ctx.plan = plan
        ctx.save_for_backward(*outputs[returns:saved_end])
        ctx.sizes = tuple(outputs[saved_end:])
        ctx.mark_non_differentiable(*(outputs[index] for index in plan.non_differentiable))
        return tuple(outputs[:returns])

    @staticmethod
    def backward(ctx, *grads):
        plan = ctx.plan
        tangents = [grads[index].contiguous() for index in plan.grad_outputs]
        gradients = plan.backward(*ctx.sizes, *ctx.saved_tensors, *tangents)
        if torch.is_grad_enabled():  # create_graph: the module's gradients carry no graph of their own
            gradients = _NoDoubleBackward.apply(torch.empty(0, requires_grad=True), *gradients)[1:]
        return (None, *gradients)


class _NoDoubleBackward(torch.autograd.Function):
    """What AOTAutograd puts around a compiled backward run with create_graph: its gradients pass as
    they are, and a backward through them raises, as torch.compile does, rather than leaving out the
    terms the backward module cannot differentiate. The leading empty tensor requires grad, so the
    gradients carry this node even where nothing else they came from requires grad."""

    @staticmethod
    def forward(ctx, anchor, *gradients):
        return (anchor.detach(), *(g.detach() if isinstance(g, torch.Tensor) else g for g in gradients))

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("a precompiled training subgraph does not support double backward (torch.compile with "
                           "aot_autograd does not either): capture fn with backend='eager' for higher-order gradients")


def _run_unintercepted(function):
    """Let Dynamo's frame evaluator run `function` and everything it calls as they are: autograd
    calls the backward from wherever .backward() runs, which may be code Dynamo intercepts (a capture,
    an installed artifact) and which must not try to compile the kernels' caller."""
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

    set_code_exec_strategy(function.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))


_run_unintercepted(_AutogradSubgraph.backward)
_run_unintercepted(_NoDoubleBackward.backward)


class autograd_subgraph:
    """A training subgraph: `forward` and `backward` are inductor_subgraph calls; `returns` outputs
    of forward are the graph's, then `saved_tensors` tensors and the sizes backward reads;
    `non_differentiable` returns never take a gradient; `grad_outputs` returns pass theirs to backward
    (made contiguous, as the backward module was traced with)."""

    def __init__(self, forward, backward, *, returns, saved_tensors, non_differentiable, grad_outputs):
        self.forward, self.backward = forward, backward
        self.returns, self.saved_tensors = returns, saved_tensors
        self.non_differentiable, self.grad_outputs = tuple(non_differentiable), tuple(grad_outputs)
        self.__name__ = forward.__name__
        self.__precompile_source__ = forward.__precompile_source__ + backward.__precompile_source__

    def __call__(self, *flat):
        # With grad on, as AOTAutograd's RuntimeWrapper runs a training graph: one compiled under the
        # caller's no_grad is a training graph only because fn turns grad on inside (enable_grad()),
        # and eager's results from there carry autograd (the others are non_differentiable).
        with torch.enable_grad():
            return _AutogradSubgraph.apply(self, *flat)
