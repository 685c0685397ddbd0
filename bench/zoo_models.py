"""The model zoo: real model code built from configs with random weights (nothing downloaded).

Each entry builds `(model, args)` deterministically (seeded), so a fresh process rebuilds the same
weights, and names the step function a capture takes (importable here: DynamoTracer needs that).
Libraries are imported inside the builders, so importing this module imports none of them.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch


def torchvision_ops_or_schemas() -> str:
    """Make torchvision importable beside a torch its C++ ops were not built for.

    PyPI's torchvision wheels link the CUDA torch (libtorch_cuda.so); beside a CPU-only torch their
    `_C.so` does not load, and `import torchvision` then fails registering fake kernels
    ("operator torchvision::nms does not exist"). When that library does not load, define the two
    schemas it registers fakes for, without kernels: the models import and run (they call none of
    torchvision's custom ops); detection ops (nms, roi_align, ...) stay unavailable. Must run before
    torchvision is imported, by anything: a Dynamo artifact's load may import it. Returns what it did.
    """
    if "torchvision" in sys.modules:
        return "already imported"
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return "not installed"
    library = next(Path(spec.origin).parent.glob("_C*.so"), None)
    try:
        if library is not None:
            torch.ops.load_library(str(library))
            return "its C++ ops load"
    except OSError:
        pass
    fragment = torch.library.Library("torchvision", "FRAGMENT")
    for name in ("nms", "qnms"):
        fragment.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(fragment)  # a Library's definitions live as long as the object
    return "its C++ ops do not load here: defined torchvision::nms/qnms schemas without kernels"



def timed_cpp_builds() -> dict:
    """Count and time every C++ build Inductor runs from now on in this process (kernels, ISA probes,
    the precompiled header): {"builds": n, "s": seconds summed}, updated as they run. The zoo's
    capture and torch.compile children both call it, so their build counts compare."""
    import time

    from torch._inductor import cpp_builder

    cpp = {"builds": 0, "s": 0.0}
    build = cpp_builder.CppBuilder.build

    def timed_build(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return build(self, *args, **kwargs)
        finally:
            cpp["builds"] += 1
            cpp["s"] += time.perf_counter() - started

    cpp_builder.CppBuilder.build = timed_build
    return cpp

_KEEP: list = []
TORCHVISION = torchvision_ops_or_schemas()


def encoder_step(model, input_ids):
    return model(input_ids).last_hidden_state


def lm_step(model, input_ids):
    return model(input_ids).logits


def seq2seq_step(model, input_ids, decoder_input_ids):
    return model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits


def whisper_step(model, input_features, decoder_input_ids):
    return model(input_features=input_features, decoder_input_ids=decoder_input_ids).last_hidden_state


def audio_step(model, input_values):
    return model(input_values).last_hidden_state


def vision_step(model, images):
    return model(images)


def unet_step(model, sample, timestep):
    return model(sample, timestep).sample


def flux_step(model, hidden_states, encoder_hidden_states, pooled_projections, timestep):
    """One denoising step of a Flux transformer; the rotary positions are built from the shapes (a
    text token at 0, an image token at its index), so every argument has the batch in dim 0."""
    img_ids = torch.arange(hidden_states.shape[1], dtype=hidden_states.dtype)[:, None].expand(-1, 3)
    txt_ids = hidden_states.new_zeros(encoder_hidden_states.shape[1], 3)
    return model(hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids).sample


def train_step(model, images, labels):
    """One training step's numbers: the loss and the gradient of every parameter, flattened into one
    tensor (torch.autograd.grad, so repeated calls do not accumulate into .grad)."""
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return torch.cat([loss.reshape(1), *(grad.reshape(-1) for grad in grads)])


def _ids(*shape: int, vocab: int = 99) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(1))


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(2))


def _tiny(config_name: str, **overrides):
    import transformers

    return getattr(transformers, config_name)(**overrides)


def _hf(model_name: str, config) -> torch.nn.Module:
    import transformers

    config._attn_implementation = "eager"  # sdpa too, but eager is the same on every torch
    return getattr(transformers, model_name)(config)


def bert():
    config = _tiny("BertConfig", vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=37, max_position_embeddings=64)
    return _hf("BertModel", config), (_ids(2, 7),)


def distilbert():
    config = _tiny("DistilBertConfig", vocab_size=99, dim=32, n_layers=2, n_heads=2, hidden_dim=37,
                   max_position_embeddings=64)
    return _hf("DistilBertModel", config), (_ids(2, 7),)


def gpt2():
    config = _tiny("GPT2Config", vocab_size=99, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=0,
                   eos_token_id=0)
    return _hf("GPT2LMHeadModel", config), (_ids(2, 7),)


def llama():
    config = _tiny("LlamaConfig", vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return _hf("LlamaForCausalLM", config), (_ids(2, 7),)


def t5():
    config = _tiny("T5Config", vocab_size=99, d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4,
                   decoder_start_token_id=0)
    return _hf("T5ForConditionalGeneration", config), (_ids(2, 7), _ids(2, 5))


def whisper():
    config = _tiny("WhisperConfig", vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37,
                   num_mel_bins=16, max_source_positions=30, max_target_positions=32, pad_token_id=0, bos_token_id=0,
                   eos_token_id=0, decoder_start_token_id=0)
    return _hf("WhisperModel", config), (_randn(1, 16, 60), _ids(1, 5))


def wav2vec2():
    """An audio encoder: its positional convolution is weight_norm-parametrized."""
    config = _tiny("Wav2Vec2Config", vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=37, conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2),
                   num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, feat_extract_norm="layer")
    return _hf("Wav2Vec2Model", config), (_randn(1, 400),)


def mamba():
    """A state-space model (its layers import their scan kernels inside forward)."""
    config = _tiny("MambaConfig", vocab_size=99, hidden_size=16, state_size=4, num_hidden_layers=2,
                   intermediate_size=32, conv_kernel=4, time_step_rank=4)
    return _hf("MambaModel", config), (_ids(1, 8),)


def qwen3_moe():
    """A mixture of experts: transformers runs its experts through torch._grouped_mm."""
    config = _tiny("Qwen3MoeConfig", vocab_size=99, hidden_size=16, intermediate_size=32, moe_intermediate_size=16,
                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=4,
                   num_experts_per_tok=2, decoder_sparse_step=1)
    return _hf("Qwen3MoeModel", config), (_ids(1, 8),)


def levit():
    """A vision model whose eval-mode forward fills a dict cache of attention biases on its first call."""
    config = _tiny("LevitConfig", image_size=32, hidden_sizes=[16, 32, 48], num_attention_heads=[1, 2, 3],
                   depths=[1, 1, 1], key_dim=[8, 8, 8], mlp_ratio=[2, 2, 2], attention_ratio=[2, 2, 2])
    return _hf("LevitModel", config), (_randn(1, 3, 32, 32),)


def gpt2_124m():
    """GPT-2 at its real size (124M parameters, built from the default config: nothing downloaded)."""
    config = _tiny("GPT2Config", bos_token_id=0, eos_token_id=0)
    return _hf("GPT2LMHeadModel", config), (_ids(1, 64, vocab=50257),)


def tv_resnet50():
    """ResNet-50 at its real size, 224x224, batch 1."""
    import torchvision

    return torchvision.models.resnet50(), (_randn(1, 3, 224, 224),)


def tv_resnet18():
    import torchvision

    return torchvision.models.resnet18(num_classes=10), (_randn(1, 3, 64, 64),)


def tv_resnet18_train():
    import torchvision

    return torchvision.models.resnet18(num_classes=10), (_randn(2, 3, 64, 64), torch.tensor([3, 7]))


def tv_vit_b_16():
    import torchvision

    return torchvision.models.vit_b_16(num_classes=10), (_randn(1, 3, 224, 224),)


def timm_resnet18d():
    import timm

    return timm.create_model("resnet18d", pretrained=False, num_classes=10), (_randn(1, 3, 64, 64),)


def timm_vit_tiny():
    import timm

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10), (_randn(1, 3, 224, 224),)


def unet2d():
    import diffusers

    model = diffusers.UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                                  block_out_channels=(16, 32), norm_num_groups=8,
                                  down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                  up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    return model, (_randn(1, 3, 16, 16), torch.tensor([10]))


def flux():
    """diffusers' own tiny test config: one double-stream and one single-stream block."""
    import diffusers

    model = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                             attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                             pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))
    return model, (_randn(1, 16, 4), _randn(1, 24, 32), _randn(1, 32), torch.tensor([1.0]))


@dataclass(frozen=True)
class ZooModel:
    name: str
    library: str
    """The module the model's code comes from (the one a serve-before-import run must not import first)."""
    build: Callable[[], tuple[torch.nn.Module, tuple]]
    step: Callable[..., Any]
    train: bool = False
    """A training step: the model in train mode (batch norm on batch statistics) and grad enabled."""
    capture_calls: int = 1
    """How many calls a Dynamo capture makes (a forward that fills a cache needs the second one recorded)."""
    refused: tuple[tuple[str, str], ...] = ()
    """(tracer, pattern of the CaptureRefused message) where the zoo expects a documented refusal."""
    real_size: bool = False
    """A model at its real size: run by `bench/zoo.py --real-size`, not by default."""

    def available(self) -> str:
        """"" when the library imports here, else why not."""
        if importlib.util.find_spec(self.library) is None:
            return f"{self.library} is not installed (pip install 'precompile[zoo]')"
        try:
            importlib.import_module(self.library)
        except Exception as exc:  # e.g. torchvision built for another torch
            return f"{self.library} does not import: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        return ""

    def instantiate(self) -> tuple[torch.nn.Module, tuple]:
        torch.manual_seed(0)
        model, args = self.build()
        return model.train(self.train), args

    def other_shape(self, args: tuple, step: int) -> tuple:
        """`args` at another shape, `step` sizes on: every tensor's batch (dim 0) `step` larger, and
        token ids' length (an integer tensor's dim 1) `2 * step` longer; values drawn seeded, ids below
        the largest one seen. A Dynamo capture makes a call at step 1 (Dynamo's automatic dynamic
        shapes then record a variant with those dims dynamic); serving tries step 2."""
        generator = torch.Generator().manual_seed(3 + step)
        resized = []
        for arg in args:
            if not isinstance(arg, torch.Tensor) or arg.dim() == 0:
                resized.append(arg)
                continue
            shape = list(arg.shape)
            shape[0] += step
            if arg.dim() == 2 and not arg.is_floating_point():
                shape[1] += 2 * step
            if arg.is_floating_point():
                resized.append(torch.randn(shape, generator=generator, dtype=arg.dtype))
            else:
                resized.append(torch.randint(0, int(arg.max()) + 1, shape, generator=generator, dtype=arg.dtype))
        return tuple(resized)

    def grad_mode(self) -> contextlib.AbstractContextManager:
        """What the step runs under: grad enabled for a training step, else inference (no_grad)."""
        return torch.enable_grad() if self.train else torch.no_grad()

    def serve_mode(self, tracer: str) -> contextlib.AbstractContextManager:
        """What a served call runs under: the step's grad mode, except for a MakeFx training step. Its
        graph computes the gradients itself and cannot record autograd as eager's step does (fn calls
        torch.autograd.grad), so a call under grad mode is refused, naming inference_mode: it is served
        so, and compared with eager's step under grad mode."""
        return torch.inference_mode() if self.train and tracer == "makefx" else self.grad_mode()


ZOO = {m.name: m for m in (
    ZooModel("bert", "transformers", bert, encoder_step),
    ZooModel("distilbert", "transformers", distilbert, encoder_step),
    ZooModel("gpt2", "transformers", gpt2, lm_step),
    ZooModel("llama", "transformers", llama, lm_step),
    ZooModel("t5", "transformers", t5, seq2seq_step),
    ZooModel("whisper", "transformers", whisper, whisper_step),
    ZooModel("tv_resnet18", "torchvision", tv_resnet18, vision_step),
    ZooModel("tv_resnet18_train", "torchvision", tv_resnet18_train, train_step, train=True),
    ZooModel("tv_vit_b_16", "torchvision", tv_vit_b_16, vision_step),
    ZooModel("timm_resnet18d", "timm", timm_resnet18d, vision_step),
    ZooModel("timm_vit_tiny", "timm", timm_vit_tiny, vision_step),
    ZooModel("unet2d", "diffusers", unet2d, unet_step),
    ZooModel("flux", "diffusers", flux, flux_step),
    # The model families outside the first zoo: each serves, or is refused naming why and the way out.
    ZooModel("wav2vec2", "transformers", wav2vec2, audio_step, refused=(("dynamo", "parametrized modules"),)),
    ZooModel("mamba", "transformers", mamba, encoder_step),
    ZooModel("qwen3_moe", "transformers", qwen3_moe, encoder_step,
             refused=(("makefx", r"at the op aten\._grouped_mm"),)),
    ZooModel("levit", "transformers", levit, encoder_step, capture_calls=2,
             refused=(("makefx", "attention_bias_cache during the captured call"),)),
    ZooModel("gpt2_124m", "transformers", gpt2_124m, lm_step, real_size=True),
    ZooModel("tv_resnet50", "torchvision", tv_resnet50, vision_step, real_size=True),
)}
