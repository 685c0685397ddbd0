"""Models whose trace met torch's own limits rather than fn's: importable by the fresh processes the
tests start (tests/roundtrip/test_trace_failures.py, tests/capturing/test_makefx_refusals.py)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


def patchtst():
    """transformers' PatchTST from a config: an eager CPU kernel in it returns a layout its fake twin
    does not predict, so a view the trace recorded fails when the rendered graph runs."""
    from transformers import PatchTSTConfig, PatchTSTModel

    with torch.random.fork_rng():
        torch.manual_seed(0)
        config = PatchTSTConfig(num_input_channels=3, context_length=32, patch_length=8, patch_stride=8, d_model=16,
                                num_attention_heads=2, num_hidden_layers=1, ffn_dim=32)
        return PatchTSTModel(config).eval(), torch.randn(2, 32, 3)


def forecast(model, x):
    return model(past_values=x).last_hidden_state


class PackedGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 6, batch_first=True)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, h = self.gru(packed)
        return pad_packed_sequence(out, batch_first=True)[0], h


def packed_step(model, x, lengths):
    return model(x, lengths)
