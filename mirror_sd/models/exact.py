"""Exact bf16 on CPU: forwards whose every row is the same whatever window it is computed in.

At temperature 0 a speculative method commits a token where the target's argmax over a verified
row is vanilla's over its one-row forward, so the two rows must be bit for bit the same. In fp32
PyTorch's CPU kernels keep them so; in bf16 two kernels do not (docs/devices.md, "Exact bf16 on CPU"):

* products: oneDNN rounds a one-row bf16 product differently from a product of two or more rows
  (which agree with each other). ``linear.exact_product`` runs a one-row product as two rows.
* attention: ``scaled_dot_product_attention`` blocks its sums by the window's query and key counts,
  and in a tree window a row's keys sit at scattered slots between masked siblings, so its sums
  associate differently from vanilla's over contiguous keys. :func:`attention` computes scores,
  softmax and the weighted sum of values in fp64: a product of bf16 values is exact there, and a
  sum's order changes it by about 2^-53, far below bf16's 2^-8, so a row's output depends only on
  the keys it sees (a masked key adds an exact zero).

:func:`convert` chooses these formulations for a model once, at load (as gpt-fast's
``convert_for_runtime`` does): its ``Linear`` and ``Attention`` modules carry ``exact = True``, and
its KV caches keep keys and values in fp64 (``WIDE``), so a forward converts only its new rows.
Speculative streams run the target's own modules (models/streams.py), so they follow.
"""
from __future__ import annotations

import torch

WIDE = torch.float64  # attention's arithmetic, and the KV cache's dtype, in an exact model


def convert(model: torch.nn.Module) -> torch.nn.Module:
    """Set ``model`` (a Transformer in bf16 on CPU) to the exact formulations, in place."""
    for module in model.modules():
        if hasattr(module, "exact"):  # Linear, Attention, Transformer
            module.exact = True
    return model


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              causal: bool) -> torch.Tensor:
    """Scaled dot-product attention of q [B, H, T, D] over k, v [B, K, S, D] (K divides H) under
    ``mask`` [B|1, 1, T, S] (True: may attend; None: every slot) or ``causal``, in fp64:
    [B, H, T, D] in q's dtype. Query heads are grouped by their key head, so keys and values are
    read as they are stored (fp64 in an exact model's cache) and never repeated."""
    (B, H, T, D), (K, S) = q.shape, k.shape[1:3]
    G = H // K  # query heads per key head
    if causal:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)[None, None]
    grouped = q.reshape(B, K, G * T, D).to(WIDE)  # head h = key head h // G, as grouped-query attention has it
    scores = (grouped @ k.to(WIDE).transpose(-1, -2)).view(B, K, G, T, S) * D ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask[:, :, None], float("-inf"))  # mask [B|1, 1, 1, T, S]
    p = torch.exp(scores - scores.amax(-1, keepdim=True))  # [B, K, G, T, S]
    y = (p.view(B, K, G * T, S) @ v.to(WIDE)).view(B, K, G, T, D) / p.sum(-1, keepdim=True)
    return y.view(B, H, T, D).to(q.dtype)
