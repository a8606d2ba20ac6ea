"""Triton kernels that do in one launch what PyTorch runs as several, for a stage's few rows.

A captured forward of the embedded target runs about 45 kernels per layer, most of them tiny, and
on a GPU each costs a few microseconds however little it does, so the kernel count, not the
arithmetic, sets a one-token forward's time (docs/devices.md). These kernels cut it:

* :func:`skinny_kernel`: y = x W^T (+ b) for a few rows of x. cuBLAS's fp32 kernels for 2 to 16
  rows use tiles mostly empty at these widths; here program (i, j) streams a block of BLOCK_N
  weight rows once, BLOCK_K inputs at a time, for BLOCK_M rows of x, accumulating in fp32 (IEEE
  products for fp32 inputs: no TF32). K is a compile-time constant (a model has a few).
* :func:`rms_norm_kernel`: RMSNorm of one row per program (six PyTorch kernels: cast, square,
  mean, add, rsqrt, two products), with Hugging Face's order: normalise in fp32, cast to the
  model's dtype, then multiply by the weight.
* :func:`rotary_kernel`: rotary embedding of one head's row per program (five PyTorch kernels:
  a negation, a concatenation, two products and a sum), reading any strides, so q and k need
  no copy first.
* :func:`silu_mul_kernel`: silu(g) * u from one product's output [g | u] (a gated MLP's gate and
  up products done as one), for a block of one row per program (PyTorch: a split, silu, product).

models/tuning.py decides where each runs (measured against PyTorch's own kernels on the device),
and imports this module, so Triton, only then. Under ``TRITON_INTERPRET=1`` (set before Triton is
first imported) Triton's interpreter runs them on CPU tensors instead, slowly: how the CPU tests
check them.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M"])  # one compile for every row count
def skinny_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] weight rows (columns of y)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * K + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K),
                    other=0.0)  # [BLOCK_M, BLOCK_K]
        # (a big model's LM head can hold more than 2**31 elements: offsets into it in int64)
        w = tl.load(w_ptr + rn[None, :].to(tl.int64) * K + k[:, None], mask=(rn[None, :] < N) & (k[:, None] < K),
                    other=0.0)  # [BLOCK_K, BLOCK_N]
        if IEEE:
            acc += tl.dot(x, w, input_precision="ieee")
        else:
            acc += tl.dot(x, w)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit(do_not_specialize=["eps"])
def rms_norm_kernel(x_ptr, w_ptr, y_ptr, eps, D: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)  # BLOCK: D rounded up to a power of two
    inside = i < D
    x = tl.load(x_ptr + row * D + i, mask=inside, other=0.0).to(tl.float32)
    normed = x * tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + i, mask=inside, other=0.0)
    y = w.to(tl.float32) * normed.to(y_ptr.dtype.element_ty).to(tl.float32)  # as weight * x.to(dtype)
    tl.store(y_ptr + row * D + i, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def rotary_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, H, T, sxb, sxh, sxt, scb, sct,
                  HALF: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # over B * H * T rows of y [B, H, T, 2 * HALF], contiguous
    t, h, b = row % T, (row // T) % H, row // (T * H)
    i = tl.arange(0, BLOCK)  # BLOCK: HALF rounded up to a power of two
    inside = i < HALF
    x = x_ptr + b.to(tl.int64) * sxb + h * sxh + t * sxt  # x [B, H, T, D] in any strides but the last
    x1, x2 = tl.load(x + i, mask=inside), tl.load(x + HALF + i, mask=inside)
    c = b.to(tl.int64) * scb + t * sct  # cos, sin [B or 1, 1, T, D]
    c1, c2 = tl.load(cos_ptr + c + i, mask=inside), tl.load(cos_ptr + c + HALF + i, mask=inside)
    s1, s2 = tl.load(sin_ptr + c + i, mask=inside), tl.load(sin_ptr + c + HALF + i, mask=inside)
    y = y_ptr + row.to(tl.int64) * 2 * HALF  # x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]
    tl.store(y + i, x1 * c1 - x2 * s1, mask=inside)
    tl.store(y + HALF + i, x2 * c2 + x1 * s2, mask=inside)


@triton.jit
def silu_mul_kernel(both_ptr, y_ptr, I: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # both [rows, 2I] = [gate | up], y [rows, I]
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = i < I
    g = tl.load(both_ptr + row * 2 * I + i, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(both_ptr + row * 2 * I + I + i, mask=inside, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * I + i, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=inside)
