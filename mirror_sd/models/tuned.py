"""The decoder layers as a stage's body runs them: llama.py's layers, with operations joined where
models/tuning.py may run them as one kernel.

llama.py's layer is the plain forward, one operation after another. A stage's body (models/stages.py
and the one-stage forwards built on it) runs the same layers, the same weights and the same
arithmetic through :func:`run_layers` instead, the pattern of gpt-fast's ``convert_for_runtime``:
a formulation swapped in where the forward is captured, not a branch inside the model. It joins four
pairs of operations, each of which tuning may then run as one kernel:

* the rotary embedding of q and k and the cache writes of k and v (``tuning.rotary_store``, through
  the stage's ``SlotWriter``, which writes each row at its own slot);
* a residual add and the norm after it, within a layer and across layers: a layer hands on its
  input to the MLP's residual and the MLP's output unadded, and the next layer adds them with its
  first norm (``tuning.added_norm``);
* q, k and v as one product over their stacked weights (``tuning.projections``);
* the MLP's gate and up products and silu(gate) * up (``tuning.gated``).

Outside ``tuning.planned`` (every stage run eagerly, as on a CPU) each runs its default formulation,
which is llama.py's order of operations, so a stage's rows are the plain forward's.
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
    x, normed = tuning.added_norm(x, _attention(layer.self_attn, normed, win, writer, index),
                                  layer.post_attention_layernorm)
    mlp = layer.mlp
    return x, mlp.down_proj(tuning.gated(normed, mlp.gate_proj, mlp.up_proj))


def _attention(attn: Attention, x: torch.Tensor, win: Window, writer, index: int) -> torch.Tensor:
    """``Attention.forward`` with q, k, v as one product and the rotary embedding and cache writes as one."""
    q, k, v = attn.heads(*tuning.projections(x, (attn.q_proj, attn.k_proj, attn.v_proj)))  # [B, heads, W, D]
    q, k, v = writer.store(index, q, k, v, win.cos, win.sin)  # k, v: [B, K, S, D], every slot of the stage's cache
    return attn.out(tuning.attention(q, k, v, win.mask, win.causal))
