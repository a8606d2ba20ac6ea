"""Linear layers that multiply by a oneDNN-prepacked copy of their weight on CPU at inference.

Decoding multiplies a few rows (1 token, or a draft window of 2-16) by every weight matrix, so on
a CPU its speed is how fast the weights stream from memory. PyTorch's default fp32 path for
``F.linear`` (MKL) streams them slowly for more than one row, and for 2-3 rows reads them once per
row; oneDNN with the weight reordered once into its blocked layout streams them at about the same
speed for any row count. Measured on this project's 2-core CI machine (fp32, SmolLM2-135M's 30
layers of linears plus its LM head, ms per pass; ``python docs/linear_kernels.py`` repeats it):

    rows         1    2    3    5    9   16
    F.linear    47   77  101   63   75   74
    prepacked   31   38   38   49   43   52

Every product goes through the prepacked weight at inference, one row included: the embedded
target's one-token forward took 22.7 ms that way against 31.2 ms with ``F.linear`` for one-row
products (``python docs/linear_kernels.py --forward``, on the CPU lanes' worker as in decoding).
An earlier measurement had found the opposite (1.07x as long with every product prepacked); it was
taken while a second OpenMP pool slowed every kernel (see mirror_sd/devices.py), so one-row
products then took ``F.linear``, and vanilla decoding with them.

The prepacked copy is made on first use and remade if the weight changes in place (an optimiser
step bumps the tensor's version), so training, which needs gradients, and state dicts see a plain
``nn.Linear``. Rows of a product may differ in the last bits with the number of rows, exactly as
with ``F.linear``; every method, vanilla included, runs through the same layers.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [..., in], weight [out, in] -> [..., out]; prepacked on CPU."""
    if not uses_prepacked(x, weight, bias):
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), prepacked_weight(weight), bias, "none", [], "")


def uses_prepacked(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`linear` takes oneDNN's prepacked path for these operands (module docstring)."""
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    return (ONEDNN and not needs_grad and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
            and x.numel() > 0)


def prepacked_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight in oneDNN's blocked layout, kept on the tensor and remade when it changes."""
    version = 0 if weight.is_inference() else weight._version  # inference tensors keep no version
    kept = getattr(weight, "_onednn_packed", None)
    if kept is None or kept[0] != version:
        with torch.no_grad():
            kept = (version, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1))
        weight._onednn_packed = kept
    return kept[1]


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) whose inference runs through :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
