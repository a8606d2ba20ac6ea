"""Linear layers that multiply by a oneDNN-prepacked copy of their weight on CPU at inference.

(On a GPU, the products a captured stage records run the formulation measured fastest for their
shape and row count instead: models/tuning.py.)

Decoding multiplies a few rows (1 token, or a draft window of 2-16) by every weight matrix, so on
a CPU its speed is how fast the weights stream from memory. PyTorch's default fp32 path for
``F.linear`` (MKL) streams them slowly for more than one row, and for 2-3 rows reads them once per
row; oneDNN with the weight reordered once into its blocked layout streams them at about the same
speed for any row count, and faster for one row too, so every product at inference goes through
the prepacked weight (docs/experiments/cpu.md#linear-kernels-by-row-count). In bf16 too, where
oneDNN runs bf16 (``ONEDNN_BF16``): its prepacked bf16 product took about half ``F.linear``'s time
(docs/experiments/devices.md#exact-bf16-on-an-amd-epyc-with-avx512_bf16-issue-73-2026-12-05).

The prepacked copy is made on first use and remade if the weight changes in place (an optimiser
step bumps the tensor's version), so training, which needs gradients, and state dicts see a plain
``nn.Linear``. Rows of a product may differ in the last bits with the number of rows, exactly as
with ``F.linear``; every method, vanilla included, runs through the same layers.

Int8 drafting. A model converted with :func:`convert_to_int8` (what only ever drafts, on a CPU
lane with int8 drafting: the draft, the EAGLE head, the speculative streams' layers; set by
``ModelPair.int8_drafting`` when they are loaded) multiplies by an int8 copy of each weight instead,
one scale per output row, made on first use, with the input quantised on the fly (PyTorch's dynamic
quantisation kernel, ``torch.ops.quantized.linear_dynamic``, which takes and gives fp32: a bf16
model's rows go in as fp32 and come back as bf16). A quarter of the bytes to stream, so a draft
step costs about half as much (docs/experiments/draft.md#int8-drafting). Where drafting shares a
module with the target (speculative streams on the target's own layers), it runs an
:func:`int8_view` of it, so the target's own products never change.
Drafts only propose, and the target verifies them in its own dtype (fp32, or bf16 made exact:
models/exact.py), so every method stays lossless; what
may change is which tokens a draft proposes, and so tau. The kernel quantises each input with one
scale, which crushes an input with outlier channels, so two kinds of layer stay fp32
(``Linear(..., int8=False)``): those fed raw residual-stream features (the EAGLE head's input maps:
docs/experiments/eagle.md#int8-drafting-and-τ--3), and a draft model's MLP down
projections (``pair.fp32_down_projections``), whose input silu(gate) * up has outlier channels too
(docs/experiments/draft.md#self-instruct-data-and-fp32-down-projections-the-shipped-draft).
The target's speculative streams gain nothing from fp32 down projections (same record), so theirs
stay int8.
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from . import tuning

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# Weights with fewer elements take F.linear in fp32: for them oneDNN's call costs more than the
# product, and tiny weights stream from cache anyway (docs/experiments/cpu.md#tiny-weights-take-flinear).
PREPACK_MIN_WEIGHT = 1 << 16
ONEDNN_BF16 = ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()  # oneDNN's bf16 products run here
PREPACKED_DTYPES = (torch.float32, torch.bfloat16) if ONEDNN_BF16 else (torch.float32,)


def _int8_kernels_work() -> bool:
    """Whether this PyTorch build and this CPU run the int8 kernel (its x86 backend needs AVX2):
    one tiny product, at import; without it, drafting stays fp32.

    The product runs on one thread: a multi-threaded kernel here would start an OpenMP pool on the
    importing thread, and with a second pool in the process every kernel on the CPU workers slows
    down (devices.py; docs/experiments/bench.md#a-fourth-fault-found-and-fixed-later)."""
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


def _full_range_saturates() -> bool:
    """Whether the int8 kernel saturates with 8-bit activations on this CPU. x86 CPUs without VNNI
    add pairs of u8 x s8 products in int16, which overflows for full-range activations; there the
    activations take 7 bits (``reduce_range``, as PyTorch's own x86 quantisation does). One seeded
    product, checked against fp32, at import (on one thread, as in ``_int8_kernels_work``)."""
    if not INT8:
        return False
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gen = torch.Generator().manual_seed(0)
            x, w = torch.randn(4, 256, generator=gen), torch.rand(64, 256, generator=gen) * 2 - 1  # as nn.Linear's
            scales = (w.abs().amax(dim=1) / 127).double()
            q = torch.quantize_per_channel(w, scales, torch.zeros(64, dtype=torch.long), 0, torch.qint8)
            y = torch.ops.quantized.linear_dynamic(x, torch.ops.quantized.linear_prepack(q, None), False)
            exact = x @ w.T
        return bool((y - exact).abs().max() > 0.05 * exact.abs().max())
    finally:
        torch.set_num_threads(threads)


REDUCE_RANGE = _full_range_saturates()  # 7-bit activations where 8 bits would saturate


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, int8: bool = False,
           plan: "tuning.Plan | None" = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [..., in], weight [out, in] -> [..., out]; prepacked on CPU,
    or through the weight's int8 copy with int8=True (a model converted for int8 drafting); with a
    ``plan`` (a CUDA stage's capture: models/tuning.py), in the formulation measured fastest."""
    if plan is not None:
        return tuning.product(x, weight, bias, plan)
    if not uses_prepacked(x, weight, bias):
        return F.linear(x, weight, bias)
    if int8 and INT8:  # the kernel takes and gives fp32
        y = torch.ops.quantized.linear_dynamic(x.float().contiguous(), int8_weight(weight, bias), REDUCE_RANGE)
        return y.to(x.dtype)
    if weight.numel() < PREPACK_MIN_WEIGHT:  # fits in cache: oneDNN's per-call cost would dominate
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), prepacked_weight(weight), bias, "none", [], "")


def exact_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`linear` (x [..., K], weight [N, K] -> [..., N], never int8) rounded as a product of two or
    more rows always is: a single row runs twice and one copy is kept (models/exact.py)."""
    x2d = x.reshape(-1, x.shape[-1])  # [M, K]
    rows = x2d.shape[0]
    y = linear(torch.cat((x2d, x2d)) if rows == 1 else x2d, weight, bias)
    return y[:rows].view(*x.shape[:-1], weight.shape[0])


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
    """Whether :func:`linear` takes a kernel of its own for these operands (module docstring): the
    int8 copy when drafting in int8, else oneDNN's prepacked weight if it has PREPACK_MIN_WEIGHT elements."""
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    return (ONEDNN and not needs_grad and x.device.type == "cpu" and x.dtype == weight.dtype
            and x.dtype in PREPACKED_DTYPES and x.numel() > 0)


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


class Linear(tuning.Planned, nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) whose inference runs through :func:`linear`.

    Its kernel is chosen by attributes set when its model is loaded or its stage captured, never
    during the forward: ``int8_products`` (:func:`convert_to_int8`: it drafts, by an int8 copy of
    its weight unless it was made with int8=False, module docstring); ``exact`` (``exact.convert``,
    a bf16 model on CPU: a product as :func:`exact_product`, rows independent of how many there
    are; drafting keeps its int8 copies instead); ``plan`` (``tuning.converted``, while a CUDA stage
    captures it: the formulation measured fastest)."""

    exact = False
    int8_products = False

    def __init__(self, in_features: int, out_features: int, bias: bool = True, int8: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self.int8 = int8  # False: stays in its own dtype when its model drafts in int8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exact and not self.int8_products:
            return exact_product(x, self.weight, self.bias)
        return linear(x, self.weight, self.bias, self.int8_products and self.int8, self.plan)


def convert_to_int8(module: nn.Module, on: bool = True) -> nn.Module:
    """Set every :class:`Linear` in ``module`` (and the heads with ``int8_products``, whose logits
    multiply by rows of an LM head) to draft in int8 (on=False: back to its own dtype), in place:
    what a model that only ever drafts gets at load (``ModelPair.int8_drafting``)."""
    for part in module.modules():
        if hasattr(part, "int8_products"):  # Linear, and the heads that multiply by LM-head rows
            part.int8_products = on
    return module


def int8_view(module: nn.Module) -> nn.Module:
    """A view of ``module`` converted to int8 products: the same parameters and buffers, copies of
    its submodules. For drafting work that runs modules the target runs too (speculative streams on
    the target's own layers), so that the target's products never change. A view starts with no
    tuning plan of its own (``tuning.converted`` gives one while a stage captures it)."""
    view = copy.copy(module)
    view._modules = {name: None if child is None else int8_view(child) for name, child in module._modules.items()}
    view.__dict__.pop("plan", None)
    if isinstance(view, Linear):
        view.int8_products = True
    return view
