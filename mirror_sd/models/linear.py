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

Int8 drafting. Inside :func:`int8_products` (a per-thread switch that the lanes turn on for
drafting work: ``Lane.int8_drafting``) products take an int8 copy of the weight instead, one scale
per output row, made on first use, with the input quantised on the fly (PyTorch's dynamic
quantisation kernel, ``torch.ops.quantized.linear_dynamic``). A quarter of the bytes to stream,
so a draft step costs about half as much here: on the 12 bench prompts, interleaved, the drafting
of ``sd``, ``eagle``, ``ss`` and ``mirror`` fell from 4.4, 5.6, 9.6 and 17.0 ms per step to 2.2,
3.0, 5.5 and 8.9 ms (``python docs/int8_drafting.py``). Drafts only propose, and the target
verifies them in fp32, so every method stays lossless; what may change is which tokens a draft
proposes (see the README for tau). A layer fed raw residual-stream features (the EAGLE head's input
maps) stays fp32 (``Linear(..., int8=False)``): their outlier channels would crush a per-tensor
int8 input, and with them quantised too the head's tau fell to 2.58, against 2.66 in fp32 and 2.72
as shipped (an ad-hoc run). So do a draft model's MLP down projections (``pair.fp32_down_projections``):
their input, silu(gate) * up, has outlier channels too. With every product of the shipped draft
in int8, ``sd``'s tau at gamma = 5 on the 12 bench prompts was 1.82; with its 4 down projections in
fp32, 2.05; with everything in fp32, 2.07 (other single groups in fp32 did not help: the LM head
1.82, attention 1.80, layer 0 1.78). The target's speculative streams, which run the target's top
layers in int8, did not gain from the same change (tau 2.17 to 2.16), so theirs stay int8.
"""
from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _int8_kernels_work() -> bool:
    """Whether this PyTorch build and this CPU run the int8 kernel (its x86 backend needs AVX2):
    one tiny product, at import; without it, drafting stays fp32.

    The product runs on one thread: a multi-threaded kernel here would start an OpenMP pool on the
    importing thread, and with a second pool in the process every kernel on the CPU workers slows
    down (devices.py). Measured on a worker thread after this import, before the fix: a 9-row
    product by a 1536 x 576 weight took 124 us against 78, and a LoRA pair 103 us against 13."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(torch.ones(2, 2), torch.ones(2, dtype=torch.double),
                                           torch.zeros(2, dtype=torch.long), 0, torch.qint8)
            torch.ops.quantized.linear_dynamic(torch.ones(1, 2), torch.ops.quantized.linear_prepack(q, None))
        return True
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    finally:
        torch.set_num_threads(threads)


INT8 = _int8_kernels_work()

_int8 = threading.local()  # _int8.on: this thread is inside int8_products()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, int8: bool = True) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [..., in], weight [out, in] -> [..., out]; prepacked on CPU,
    or through the weight's int8 copy inside :func:`int8_products` (unless int8=False)."""
    if not uses_prepacked(x, weight, bias):
        return F.linear(x, weight, bias)
    if int8 and INT8 and getattr(_int8, "on", False):
        return torch.ops.quantized.linear_dynamic(x.contiguous(), int8_weight(weight, bias))
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), prepacked_weight(weight), bias, "none", [], "")


@contextmanager
def int8_products(enabled: bool = True):
    """While inside (enabled), this thread's CPU inference products use int8 weights (module docstring)."""
    before = getattr(_int8, "on", False)
    _int8.on = enabled
    try:
        yield
    finally:
        _int8.on = before


def int8_weight(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The weight in int8 (symmetric, one scale per output row) packed with its bias for
    ``linear_dynamic``; kept on the tensor and remade when it changes (``_kept_on``)."""

    def pack():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyTorch marks quantised tensors as deprecated (they work in the pinned 2.13)
            w = weight.detach().float()
            scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).double()  # [out]
            q = torch.quantize_per_channel(w, scales, torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8)
            return torch.ops.quantized.linear_prepack(q, None if bias is None else bias.detach().float())

    return _kept_on(weight, "_int8_packed", pack)


def uses_prepacked(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`linear` takes oneDNN's prepacked path for these operands (module docstring)."""
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    return (ONEDNN and not needs_grad and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
            and x.numel() > 0)


def prepacked_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight in oneDNN's blocked layout, kept on the tensor and remade when it changes."""
    return _kept_on(weight, "_onednn_packed", lambda: torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1))


def _kept_on(weight: torch.Tensor, name: str, make):
    """make()'s result, kept on the weight as attribute ``name`` and made again when the weight
    changes in place (an optimiser step bumps the tensor's version)."""
    version = 0 if weight.is_inference() else weight._version  # inference tensors keep no version
    kept = getattr(weight, name, None)
    if kept is None or kept[0] != version:
        with torch.no_grad():
            kept = (version, make())
        setattr(weight, name, kept)
    return kept[1]


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) whose inference runs through :func:`linear`.

    int8=False keeps the layer in fp32 inside :func:`int8_products` (module docstring)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, int8: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self.int8 = int8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.int8)
