"""The decoder layers as a stage's body runs them: llama.py's layers, the same weights and the same
arithmetic, with four pairs of operations joined so that models/tuning.py may run each pair as one
kernel (the pattern of gpt-fast's ``convert_for_runtime``: a formulation swapped in where the
forward is captured, not a branch inside the model):

* the rotary embedding and the cache writes of k and v (``tuning.rotary_store``, through the
  stage's ``SlotWriter``, which writes each row at its own slot);
* a residual add and the norm after it, across layers too: a layer hands on its MLP's residual
  input and output unadded, and the next layer adds them with its first norm (``tuning.added_norm``);
* q, k and v as one product (``tuning.projections``); gate and up and silu(gate) * up (``tuning.gated``).

With no plan on the layers' modules (``tuning.converted``: a CUDA stage's capture sets one) each pair
runs as llama.py runs it, so a stage's rows are the plain forward's.
"""
from __future__ import annotations

import torch

from . import tuning
from .llama import Attention, DecoderLayer, Window


def run_layers(layers, h: torch.Tensor, writer, win: Window, first: int) -> torch.Tensor:
    """Decoder ``layers`` over hidden states h [B, W, d], the i-th being model layer ``first`` + i (its
    slot in the cache), writing keys and values through ``writer`` (a stage's ``SlotWriter``)."""
    delta = None  # the last layer's MLP output, added to h by the next layer (or at the end)
    for i, layer in enumerate(layers):
        h, delta = _layer(layer, h, delta, win, writer, first + i)
    return h if delta is None else h + delta


def _layer(layer: DecoderLayer, x: torch.Tensor, delta: torch.Tensor | None, win: Window, writer, index: int):
    """The layer on hidden states x + delta (delta None: x alone): (its MLP's residual input, the
    MLP's output), whose sum is the layer's output."""
    x, normed = tuning.added_norm(x, delta, layer.input_layernorm)
    attended = _attention(layer.self_attn, normed, win, writer, index)
    x, normed = tuning.added_norm(x, attended, layer.post_attention_layernorm)
    return x, layer.mlp.down_proj(tuning.gated(normed, layer.mlp.gate_proj, layer.mlp.up_proj))


def _attention(attn: Attention, x: torch.Tensor, win: Window, writer, index: int) -> torch.Tensor:
    """``Attention.forward`` with q, k, v as one product and the rotary embedding and cache writes as one."""
    q, k, v = attn.heads(*tuning.projections(x, (attn.q_proj, attn.k_proj, attn.v_proj)))  # [B, heads, W, D]
    # k, v: [B, K, S, D], every slot of the stage's cache
    q, k, v = writer.store(index, q, k, v, win.cos, win.sin, attn.plan)
    return attn.out(attn.attend(q, k, v, win))
